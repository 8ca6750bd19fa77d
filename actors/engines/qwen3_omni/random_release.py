"""Qwen3-Omni releases of seeded random weights at full size, written tensor by tensor.

GPU tests and benches need the real release's shapes, key names and shard layout, not
its numbers, and nothing can be downloaded where they run. :func:`write_random_release`
writes that release from a composite ``config.json`` (:data:`QWEN3_OMNI_30B_A3B`:
``Qwen/Qwen3-Omni-30B-A3B-Instruct``'s, as published) without ever building the model:
each stage's module is built on the ``meta`` device for its tensor names and shapes, and
each tensor is drawn alone (on the GPU when there is one), then written into shards of
the release's size, code2wav alone in the last one. The host holds one shard at a time.

A tensor's values depend only on the seed and its name, never on the order of writing
(:func:`omni_actors.models.seeded.seeded_tensor`).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Final

import torch

from omni_actors.models.release import ReleaseWriter
from omni_actors.models.seeded import seeded_tensor

from .configs import quiet_transformers
from .layout import STAGES
from .tokenizer import QWEN3_OMNI_SPECIALS, SPECIAL_NAMES, PlacedVocab, write_tokenizer
from .weights import Progress, build_stage, front_end_configs, release_tensors, stage_config_of

__all__ = [
    "QWEN3_OMNI_30B_A3B",
    "RELEASE_SHARD_BYTES",
    "real_config",
    "release_vocab",
    "write_random_release",
]

QWEN3_OMNI_30B_A3B: Final = "qwen3_omni_30b_a3b.json"
"""The composite ``config.json`` of ``Qwen/Qwen3-Omni-30B-A3B-Instruct`` (shipped beside
this module): every size, special id and speaker as the release has them."""

RELEASE_SHARD_BYTES: Final = 5_000_000_000
"""The release's shard size: its 66 GiB in 14 shards, then code2wav's own."""


def real_config(name: str = QWEN3_OMNI_30B_A3B) -> dict[str, Any]:
    """A shipped release ``config.json``, as a dict."""
    text = resources.files(__package__).joinpath(name).read_text()
    config: dict[str, Any] = json.loads(text)
    return config


def write_random_release(
    out: Path,
    config: Mapping[str, Any],
    *,
    seed: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_bytes: int = RELEASE_SHARD_BYTES,
    progress: Progress | None = None,
    stages: Sequence[str] = STAGES,
) -> Path:
    """Write a release of ``config``'s shapes with seeded random weights into ``out``.

    Args:
        out: replaced by the release (written beside it, moved into place whole).
        config: the composite ``config.json``.
        seed: the weights' seed.
        device: where tensors are drawn (default: the GPU if there is one).
        dtype: the stored dtype (the release's is bfloat16).
        max_shard_bytes: the largest shard.
        progress: ``progress(stage, done, total)`` as each stage's tensors are written.
        stages: the stages whose tensors are written (a machine whose disk holds no
            whole release can time one stage); each has the values it has in the whole.

    Returns:
        ``out``.
    """
    where = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    stored = {**config, "dtype": str(dtype).removeprefix("torch.")}
    with ReleaseWriter(Path(out), max_shard_bytes=max_shard_bytes) as writer:
        for done, stage in enumerate(stages, start=1):
            part = stage_config_of(stored, stage, Path(out) / "config.json")
            with quiet_transformers(), torch.device("meta"):
                model = build_stage(stage, part, dtype)
            if stage == "code2wav":
                writer.new_shard()
            for name, meta in release_tensors(stage, model.state_dict()):
                writer.add(name, seeded_tensor(name, meta.shape, dtype, where, seed).cpu())
            if progress is not None:
                progress(stage, done, len(stages))
        writer.write_json("config.json", stored)
        for name, data in front_end_configs().items():
            writer.write_json(name, data)
        writer.write_json("generation_config.json", {"do_sample": False})
        with tempfile.TemporaryDirectory() as files:
            write_tokenizer(Path(files), release_vocab(stored))
            for path in sorted(Path(files).iterdir()):
                writer.copy_file(path)
    return Path(out)


def release_vocab(config: Mapping[str, Any]) -> PlacedVocab:
    """The tokenizer layout a release of ``config`` needs: its role words at the ids the
    config names, then the added tokens in the order whose ids the config names —
    Qwen3-Omni's (from ``<|endoftext|>`` at 151643) or tiny-omni's — up to the thinker's
    vocabulary size.

    Raises:
        ValueError: the config's special ids follow neither order.
    """
    roles = (
        ("system", int(config["system_token_id"])),
        ("user", int(config["user_token_id"])),
        ("assistant", int(config["assistant_token_id"])),
    )
    im_start = int(config["im_start_token_id"])
    audio_pad = int(config["thinker_config"]["audio_token_id"])
    size = int(config["thinker_config"]["text_config"]["vocab_size"])
    for names in (QWEN3_OMNI_SPECIALS, SPECIAL_NAMES):
        first = im_start - names.index("<|im_start|>")
        if first + names.index("<|audio_pad|>") == audio_pad:
            return PlacedVocab(roles, first, names, max(size, first + len(names)))
    raise ValueError("the config's special ids follow neither Qwen3-Omni's order nor tiny-omni's")
