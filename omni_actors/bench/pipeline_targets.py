"""What ``bench pipeline`` checks its figures against, and the figures derived from two
placements: the targets of a run (each goal, what was measured, ``met``) and what
crossing a process boundary adds to each hop."""

from __future__ import annotations

from typing import Any

__all__ = ["OVERHEAD_LIMITS_MS", "STREAM_TTFA_LIMIT", "targets", "wire_ms_per_hop"]

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
