"""What a Qwen3-Omni release directory holds, and the check that its files are whole.

A release (:mod:`omni_actors.models.release`) holds the composite ``config.json``, the
safetensors index and shards with every stage under its prefix, the tokenizer and the
front ends' configs. :func:`verify` is the family's ``verify``, which the model cache runs
before it hands a prepared directory out. It reads what can be read without building a
model (every JSON file, every shard's header, the tokenizer), so it imports neither
torch's model code nor transformers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from omni_actors.errors import ModelFileError
from omni_actors.models.files import check_tokenizer, read_json
from omni_actors.models.release import Release

__all__ = [
    "ARCHITECTURE",
    "NOT_A_RELEASE",
    "REBUILD",
    "STAGES",
    "accept_hidden_layer",
    "remedy",
    "verify",
]

STAGES: Final = ("thinker", "talker", "code2wav")
"""The stages, in pipeline order; each one's tensors are under ``<stage>.``."""

ARCHITECTURE: Final = "Qwen3OmniMoeForConditionalGeneration"
"""The composite model class a release's ``config.json`` names."""

REBUILD: Final = "rebuild it: omni-actors prepare tiny-omni --force"
"""What to do about a bad file of a release omni-actors generated, found while loading a
stage (which knows no cache or seed; the cache's own check names both)."""

NOT_A_RELEASE: Final = (
    "is it a Qwen3-Omni release? --model (and an engine's model:) takes a directory in the "
    "layout Qwen publishes (config.json, the safetensors shards and their index, the "
    "tokenizer and preprocessor files) or a Hugging Face repo id"
)
"""What to do about a bad file of a directory the user named: omni-actors did not write
it, so rebuilding is not the answer."""


def remedy(path: Path) -> str:
    """What a ``ModelFileError`` about ``path`` (a release directory or a file in one)
    tells the user to do: rebuild a release omni-actors generated (it carries the
    cache's ``prepared.json``), or check one of their own."""
    release = path if path.is_dir() else path.parent
    return REBUILD if (release / "prepared.json").is_file() else NOT_A_RELEASE


def verify(out_dir: Path) -> None:
    """Check that every file of the release in ``out_dir`` is present and whole.

    Raises:
        ModelFileError: the first file missing, truncated or corrupt, a shard that does
            not hold what the index says, or weights only in a pickle-based format.
    """
    # Any JSON is read: transformers loads no model beside a generation_config.json
    # that does not parse.
    for path in sorted(out_dir.glob("*.json")):
        read_json(path)
    release = Release.open(out_dir)
    for stage in STAGES:
        release.check(f"{stage}.")
    check_tokenizer(out_dir)


def accept_hidden_layer(config: Mapping[str, Any], path: Path) -> int:
    """The thinker layer whose hidden states condition the talker.

    A talker setting, so the thinker's own part of the composite ``config`` (read from
    ``path``) does not have it.

    Raises:
        ModelFileError: the config has no such layer.
    """
    talker = config.get("talker_config")
    layer = talker.get("accept_hidden_layer") if isinstance(talker, dict) else None
    if not isinstance(layer, int) or isinstance(layer, bool):
        problem = f"has no talker_config.accept_hidden_layer layer number (found {layer!r})"
        raise ModelFileError(path, problem, remedy(path))
    return layer
