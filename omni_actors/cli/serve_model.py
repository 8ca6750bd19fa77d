"""``omni-actors serve MODEL``: the preset a release runs on, picked by the GPUs seen.

A release is Qwen3-Omni's (the one family with serving presets today): on two or more
GPUs ``qwen3-omni`` (the thinker on one, the talker and code2wav on another), on one
``qwen3-omni-1gpu``, on none only a release small enough for a CPU (``tiny-omni``).
The GPUs are counted without torch (``nvidia-smi -L``, within ``CUDA_VISIBLE_DEVICES``),
so a usage error still comes before torch is imported; ``OMNI_ACTORS_GPUS`` overrides
the count.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CPU_RELEASE_BYTES", "GPUS_ENV", "PresetChoice", "choose_preset", "count_gpus"]

GPUS_ENV = "OMNI_ACTORS_GPUS"
"""The number of GPUs to assume, instead of counting them."""

CPU_RELEASE_BYTES = 1 << 30
"""A release directory with less weight than this (tiny-omni's is a few MB) runs on a CPU."""

_CPU_FAMILIES = frozenset({"tiny-omni"})  # prepared families small enough for a CPU


@dataclass(frozen=True, slots=True)
class PresetChoice:
    """The preset ``serve MODEL`` runs and why, in words for its one line."""

    preset: str
    reason: str


def count_gpus() -> int:
    """The GPUs this process may use: ``$OMNI_ACTORS_GPUS`` when set, else the devices
    ``nvidia-smi -L`` lists, at most as many as ``CUDA_VISIBLE_DEVICES`` names (0 with
    no ``nvidia-smi``).

    Raises:
        ValueError: ``$OMNI_ACTORS_GPUS`` is not a whole number >= 0.
    """
    forced = os.environ.get(GPUS_ENV)
    if forced is not None:
        if not forced.strip().isdigit():
            raise ValueError(f"${GPUS_ENV}={forced!r}: give the number of GPUs (0, 1, 2, ...)")
        return int(forced)
    listed = _nvidia_smi_gpus()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return listed
    names = [name for name in visible.split(",") if name.strip()]
    # CUDA stops at the first invalid entry (-1 hides every device).
    usable = next((i for i, name in enumerate(names) if name.strip().startswith("-")), len(names))
    return min(listed, usable)


def _nvidia_smi_gpus() -> int:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if done.returncode != 0:  # a driver that does not answer: no usable GPU
        return 0
    # MIG devices are listed indented under their GPU; a GPU line starts with "GPU ".
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))


def _weight_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.glob("*.safetensors") if f.is_file())


def fits_a_cpu(model: str) -> bool:
    """Whether ``model`` is small enough for a CPU: a prepared family such as tiny-omni,
    or a directory with under :data:`CPU_RELEASE_BYTES` of weights. A Hub repo id is
    taken to be full size (its size is not known before its download)."""
    if model in _CPU_FAMILIES:
        return True
    path = Path(model).expanduser()
    return path.is_dir() and _weight_bytes(path) < CPU_RELEASE_BYTES


def choose_preset(model: str, gpus: int) -> PresetChoice:
    """The preset that serves ``model`` on ``gpus`` GPUs, and why.

    Raises:
        ValueError: no GPU and a full-size release (the message says what to give).
    """
    if fits_a_cpu(model):
        return PresetChoice(
            "tiny-omni", "a release small enough for a CPU (give --device cuda for a GPU)"
        )
    if gpus >= 2:
        return PresetChoice(
            "qwen3-omni",
            f"{gpus} GPUs seen: the thinker on cuda:0, the talker and code2wav on cuda:1",
        )
    if gpus == 1:
        return PresetChoice(
            "qwen3-omni-1gpu", "1 GPU seen: every stage on cuda:0 (a card of ~140 GiB)"
        )
    raise ValueError(
        f"{model}: a full-size release needs a GPU (two, or one of ~140 GiB), and this "
        f"machine has none (nvidia-smi lists none, or CUDA_VISIBLE_DEVICES hides them); "
        f"set ${GPUS_ENV} if the count is wrong, or give --preset to run a preset anyway "
        "(docs/gpus.md)"
    )
