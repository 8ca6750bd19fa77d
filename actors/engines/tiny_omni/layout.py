"""The files of a prepared tiny-omni directory, and the check that they are whole.

:func:`.weights.build` writes them: a directory per stage (``config.json``,
``model.safetensors``), the composite ``config.json`` and the tokenizer at the top, the
tokenizer again in ``thinker/``, and the single checkpoint (:mod:`.checkpoint`).
:func:`verify` is the family's ``verify``, which the model cache runs before it hands the
directory out. It reads what can be read without building a model (every JSON file,
every safetensors header, the tokenizers), so it imports neither torch's model code nor
transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from omni_actors.errors import ModelFileError
from omni_actors.models.files import check_tokenizer, read_json, safetensors_weights

__all__ = ["CHECKPOINT", "REBUILD", "STAGES", "accept_hidden_layer", "verify"]

STAGES: Final = ("thinker", "talker", "code2wav")
"""Stage directory names, in pipeline order."""

CHECKPOINT: Final = "checkpoint"
"""The directory of the whole model as one HF checkpoint (:mod:`.checkpoint`)."""

REBUILD: Final = "rebuild it: omni-actors prepare tiny-omni --force"
"""What to do about a bad file found while loading a stage (which knows no cache or seed;
the cache's own check names both)."""


def verify(out_dir: Path) -> None:
    """Check that every file of the tiny-omni prepared in ``out_dir`` is present and whole.

    Raises:
        ModelFileError: the first file missing, truncated or corrupt, or weights only in
            a pickle-based format.
    """
    directories = [out_dir, *(out_dir / name for name in (*STAGES, CHECKPOINT))]
    # config.json is required everywhere. Any other JSON is read as well: transformers
    # loads a model without a generation_config.json that does not parse.
    required = {directory / "config.json" for directory in directories}
    for path in sorted(required.union(*(d.glob("*.json") for d in directories))):
        read_json(path)
    for name in (*STAGES, CHECKPOINT):
        safetensors_weights(out_dir / name)
    for directory in (out_dir, out_dir / "thinker", out_dir / CHECKPOINT):
        check_tokenizer(directory)


def accept_hidden_layer(out_dir: Path) -> int:
    """The thinker layer whose hidden states condition the talker.

    A talker setting, so the thinker stage's own config does not have it: it is read from
    the composite ``config.json`` at the top of ``out_dir``.

    Raises:
        ModelFileError: that file is missing or corrupt, or has no such layer.
    """
    path = out_dir / "config.json"
    talker = read_json(path, remedy=REBUILD).get("talker_config")
    layer = talker.get("accept_hidden_layer") if isinstance(talker, dict) else None
    if not isinstance(layer, int) or isinstance(layer, bool):
        problem = f"has no talker_config.accept_hidden_layer layer number (found {layer!r})"
        raise ModelFileError(path, problem, REBUILD)
    return layer
