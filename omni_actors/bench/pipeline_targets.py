"""What ``bench pipeline`` checks its figures against, and the figures derived from two
placements: the targets of a run (each goal, what was measured, ``met``), what
crossing a process boundary adds to each hop, and the published figures a model
preset's run is set beside."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "OVERHEAD_LIMITS_MS",
    "QWEN3_OMNI_TARGETS",
    "STREAM_TTFA_LIMIT",
    "VLLM_OMNI_2XH100",
    "PublishedFigures",
    "qwen3_omni_targets",
    "targets",
    "wire_ms_per_hop",
]

OVERHEAD_LIMITS_MS = {1: 1.0, 64: 5.0}  # per hop, at these concurrency levels
STREAM_TTFA_LIMIT = 1.10  # stream TTFA p50 / ideal


def targets(
    variants: dict[str, dict[str, dict[str, Any]]], streaming: str | None
) -> dict[str, Any]:
    """The goals and whether this run met them (``met`` None: the level was not run)."""
    goals: dict[str, Any] = {}
    for c, limit in OVERHEAD_LIMITS_MS.items():
        at_c = {name: levels[str(c)] for name, levels in variants.items() if str(c) in levels}
        measured = {name: level.get("overhead_ms_per_hop_p50") for name, level in at_c.items()}
        net = {
            name: level.get("overhead_ms_per_hop_net_of_timers_p50") for name, level in at_c.items()
        }
        goals[f"overhead_ms_per_hop_c{c}"] = {
            "limit": limit,
            "measured": measured,
            "met": _met(measured, limit),
            "measured_net_of_timers": net,
            "met_net_of_timers": _met(net, limit),
        }
    ratios: dict[str, Any] = {}
    if streaming is not None:
        ratios = {c: level.get("ttfa_vs_ideal") for c, level in variants[streaming].items()}
    goals["stream_ttfa_vs_ideal"] = {
        "limit": STREAM_TTFA_LIMIT,
        "variant": streaming,
        "measured": ratios,
        "met": _met(ratios, STREAM_TTFA_LIMIT),
    }
    return goals


def _met(measured: dict[str, Any], limit: float) -> bool | None:
    """Every measured value within ``limit``; None if nothing was measured."""
    if not measured:
        return None
    return all(value is not None and value <= limit for value in measured.values())


def wire_ms_per_hop(placements: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant and level, (process TTFA p50 - local TTFA p50) / hops: what crossing
    a process boundary adds to each hop. Empty unless both placements ran."""
    if "local" not in placements or "process" not in placements:
        return {}
    wire: dict[str, dict[str, Any]] = {}
    local, process = placements["local"]["variants"], placements["process"]["variants"]
    for name, levels in local.items():
        wire[name] = {}
        for c, here in levels.items():
            there = process[name][c]
            both = "ttfa_ms_p50" in here and "ttfa_ms_p50" in there
            delta = (there["ttfa_ms_p50"] - here["ttfa_ms_p50"]) / here["hops"] if both else None
            wire[name][c] = _ms(delta)
    return wire


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# -- model presets ---------------------------------------------------------------------


@dataclass(frozen=True)
class PublishedFigures:
    """Another system's published figures for a preset's model, per concurrency level.

    Attributes:
        preset: the pipeline (by name) whose report shows them.
        source: who measured what, how.
        ttft_ms: time to the first text token, by concurrency.
        rtf: audio real-time factor (generation time over audio seconds), by concurrency.
    """

    preset: str
    source: str
    ttft_ms: dict[int, float]
    rtf: dict[int, float]

    def report(self) -> dict[str, Any]:
        """JSON-ready: ``source``, then ``ttft_ms`` and ``rtf`` keyed by level."""
        return {
            "source": self.source,
            "ttft_ms": {str(c): v for c, v in self.ttft_ms.items()},
            "rtf": {str(c): v for c, v in self.rtf.items()},
        }


VLLM_OMNI_2XH100 = PublishedFigures(
    preset="qwen3-omni",
    source=(
        "vllm-omni's reference baselines: Qwen3-Omni-30B-A3B-Instruct on 2x H100, async "
        "chunk on, random prompts of 2500 input and 900 output tokens (EOS ignored)"
    ),
    ttft_ms={1: 96.0, 4: 141.0, 8: 272.0, 16: 362.0, 32: 508.0},
    rtf={1: 0.118, 4: 0.180, 8: 0.200, 16: 0.328, 32: 0.420},
)
"""The figures ``bench pipeline --preset qwen3-omni`` is compared with (a reference
column of its table, ``reference`` in its JSON). Their replies are 900 tokens; the
first-token, first-packet and RTF figures compare at any reply length, end-to-end
latency does not."""

QWEN3_OMNI_TARGETS: dict[int, dict[str, float]] = {
    1: {"ttft_ms_p50": 96.0, "ttfa_ms_p50": 250.0, "rtf_p50": 0.10},
    8: {"ttft_ms_p50": 272.0, "rtf_p50": 0.20},
    32: {"ttft_ms_p50": 500.0, "ttfa_ms_p50": 1000.0, "rtf_p50": 0.40},
}
"""The ``qwen3-omni`` preset's goals on two GPUs with full-size weights and 2500-token
prompts, per level: at least vllm-omni's TTFT and RTF at c=1 and c=8 (a first packet
within 250 ms at c=1), and under 0.5 s / 1 s / 0.40 at c=32."""


def qwen3_omni_targets(levels: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each goal of :data:`QWEN3_OMNI_TARGETS` as ``<figure>_c<level>``: its limit, what
    ``levels`` (a variant's report, by level) measured, and ``met`` (None: not run)."""
    goals: dict[str, Any] = {}
    for c, limits in QWEN3_OMNI_TARGETS.items():
        for key, limit in limits.items():
            measured = levels.get(str(c), {}).get(key)
            goals[f"{key}_c{c}"] = {
                "limit": limit,
                "measured": measured,
                "met": None if measured is None else measured <= limit,
            }
    return goals
