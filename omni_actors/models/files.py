"""Model files are hostile input: read only formats that cannot run code, check before use.

A model directory comes from a download, a cache on a shared disk or a user's path, and
any file in it may be truncated, corrupt or crafted. Two rules follow.

Weights load from safetensors only. A pickle-format file (``pytorch_model.bin``, ``*.pt``,
``*.ckpt``) is a program for the unpickler; ``torch.load(weights_only=True)`` narrows what
it may do but still runs a pickle machine over the file's bytes. So a directory whose
weights are only in such files is refused, never loaded, and every Hugging Face
``from_pretrained`` of a model here passes ``use_safetensors=True``: without it,
transformers falls back to a ``pytorch_model.bin`` it finds.

A file is checked before a library reads it, and a failure to read it becomes a
:class:`~omni_actors.errors.ModelFileError` that names the file: safetensors says
"header too small" without saying of which file, tokenizers raises a bare ``Exception``.
Checking a safetensors file reads its header only (the data is memory-mapped, not read);
safetensors verifies there that every tensor's dtype, shape and offsets agree and that the
tensors cover the file exactly, which catches a truncated file and a tampered header. A
flipped bit inside tensor data is beyond a check of structure.

A checkpoint generated here (a tiny release of seeded random weights) is written into a
staging directory beside its own and moved in once whole (:func:`staging`), and its
family's ``verify`` checks that each file it wrote is there (:func:`check_present`).

safetensors, tokenizers and transformers come with the model extras: each function
imports what it needs when called.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from omni_actors.errors import ModelFileError

__all__ = [
    "INDEX",
    "PICKLE_SUFFIXES",
    "check_present",
    "check_safetensors",
    "check_tokenizer",
    "load_tokenizer",
    "missing_weights",
    "read_json",
    "read_weight_map",
    "safetensors_weights",
    "staging",
    "weight_map",
]

PICKLE_SUFFIXES: Final = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
"""Suffixes of weights files in a pickle-based format, which are never loaded."""

INDEX: Final = "model.safetensors.index.json"
"""A sharded checkpoint's index: each tensor's name to the shard file that holds it."""

_TOKENIZER_CONFIGS: Final = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.json",
    "added_tokens.json",
)


def read_json(path: Path, *, remedy: str = "") -> dict[str, Any]:
    """The JSON object in ``path``.

    Raises:
        ModelFileError: ``path`` is missing or unreadable, or holds no JSON object.
    """
    try:
        data: Any = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise ModelFileError(path, "is missing", remedy) from None
    except (OSError, ValueError) as error:  # ValueError: bad JSON, or bytes that are no text
        raise ModelFileError(path, f"is no valid JSON ({error})", remedy) from error
    if not isinstance(data, dict):
        raise ModelFileError(path, f"holds a JSON {type(data).__name__}, not an object", remedy)
    return data


def check_safetensors(path: Path, *, remedy: str = "") -> None:
    """Check that ``path`` is a whole safetensors file whose header agrees with its data.

    Raises:
        ModelFileError: it is missing, truncated, or not safetensors.
    """
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise ModelFileError(path, "is missing", remedy)
    try:
        # Opening validates the whole header against the file; no tensor is read. numpy,
        # not torch: the check is the same, and a CLI that only checks need not import torch.
        with safe_open(str(path), framework="numpy"):
            pass
    except (SafetensorError, OSError, ValueError) as error:
        problem = f"is no valid safetensors file, truncated or corrupt ({error})"
        raise ModelFileError(path, problem, remedy) from error


def weight_map(index: Mapping[str, Any], source: Path, *, remedy: str = "") -> dict[str, str]:
    """The ``weight_map`` of a parsed shard index: tensor name to the shard file holding it.

    Each shard must be a plain file name ending in ``.safetensors``: the shard lies beside
    the index, and a name with a path in it could point anywhere on disk (or, as a download
    pattern, fetch files that are no shard of this model).

    Args:
        index: the index's JSON object.
        source: the index file, named in errors.

    Raises:
        ModelFileError: ``index`` has no ``weight_map`` of string to string, or it names a
            file other than a safetensors file beside ``source``.
    """
    shards = index.get("weight_map")
    if not isinstance(shards, dict) or not all(
        isinstance(name, str) and isinstance(file, str) for name, file in shards.items()
    ):
        raise ModelFileError(source, "has no weight_map of tensor name to file", remedy)
    names = sorted(set(shards.values()))
    if any(Path(name).name != name or not name.endswith(".safetensors") for name in names):
        raise ModelFileError(
            source, f"names files other than safetensors beside it: {names}", remedy
        )
    return dict(shards)


def read_weight_map(index: Path, *, remedy: str = "") -> dict[str, str]:
    """:func:`weight_map` of the shard index file ``index``.

    Raises:
        ModelFileError: see :func:`read_json` and :func:`weight_map`.
    """
    return weight_map(read_json(index, remedy=remedy), index, remedy=remedy)


def missing_weights(directory: Path, *, remedy: str = "") -> ModelFileError:
    """The error for ``directory`` holding no safetensors weights, for the caller to raise.

    Pickle-format weights there are named as never loaded, so that the user converts them
    rather than hunts for a file that was never downloaded.
    """
    pickled = sorted(p.name for p in directory.glob("*") if p.suffix in PICKLE_SUFFIXES)
    if pickled:
        return ModelFileError(
            directory,
            f"has weights only in a pickle-based format ({', '.join(pickled)}), which is "
            "never loaded: unpickling a file can run code",
            remedy or "convert the weights to safetensors (model.safetensors)",
        )
    # Named as a single-file checkpoint names it: the file a reader will look for.
    return ModelFileError(directory / "model.safetensors", "is missing", remedy)


def safetensors_weights(directory: Path, *, remedy: str = "") -> list[Path]:
    """The safetensors files of a Hugging Face model directory, each one checked.

    With a shard index (``model.safetensors.index.json``), the shards it names; else every
    ``*.safetensors`` file in ``directory``.

    Raises:
        ModelFileError: there is none (``model.safetensors is missing``, or, when there
            are pickle-format weights instead, that they are never loaded), the index is
            corrupt or names a file outside ``directory``, or a file fails
            :func:`check_safetensors`.
    """
    if not directory.is_dir():
        raise ModelFileError(directory, "is missing", remedy)
    index = directory / INDEX
    if index.is_file():
        names = sorted(set(read_weight_map(index, remedy=remedy).values()))
        files = [directory / name for name in names]
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise missing_weights(directory, remedy=remedy)
    for file in files:
        check_safetensors(file, remedy=remedy)
    return files


def check_tokenizer(directory: Path, *, remedy: str = "") -> None:
    """Check the tokenizer in ``directory``: ``tokenizer.json``, the BPE files and the configs.

    ``tokenizer.json`` is parsed by ``tokenizers`` itself, so a vocabulary or a model of
    the wrong shape is found too, not only broken JSON. ``vocab.json`` and ``merges.txt``,
    which a model-specific tokenizer class (``Qwen2Tokenizer``) builds from, are checked
    when present: a vocabulary of token -> id, merges of two symbols a line. Without
    ``tokenizer.json`` they are the tokenizer (transformers builds its fast tokenizer from
    them, as it does for a release published without ``tokenizer.json``), so they must
    then build a BPE model.

    Raises:
        ModelFileError: ``tokenizer.json`` does not load, or is missing with no
            ``vocab.json`` and ``merges.txt`` to build from; ``vocab.json`` or
            ``merges.txt`` is malformed or the two build no BPE model; or a tokenizer
            config present beside them is no JSON object.
    """
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    file = directory / "tokenizer.json"
    vocab = directory / "vocab.json"
    merges = directory / "merges.txt"
    from_bpe_files = not file.is_file()
    if from_bpe_files and not (vocab.is_file() and merges.is_file()):
        problem = "is missing, and there are no vocab.json and merges.txt to build it from"
        raise ModelFileError(file, problem, remedy)
    if not from_bpe_files:
        try:
            Tokenizer.from_file(str(file))
        except Exception as error:  # tokenizers raises a bare Exception for any bad file
            raise ModelFileError(file, f"is no valid tokenizer ({error})", remedy) from error
    if vocab.exists():
        entries = read_json(vocab, remedy=remedy)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in entries.values()):
            raise ModelFileError(vocab, "maps a token to something else than an id", remedy)
    if merges.exists():
        _check_merges(merges, remedy)
    if from_bpe_files:
        try:
            BPE.from_file(str(vocab), str(merges))
        except Exception as error:  # e.g. a merge of a symbol the vocabulary lacks
            problem = f"builds no BPE model with vocab.json ({error})"
            raise ModelFileError(merges, problem, remedy) from error
    for name in _TOKENIZER_CONFIGS:
        if (directory / name).exists():
            read_json(directory / name, remedy=remedy)


def _check_merges(path: Path, remedy: str) -> None:
    """``merges.txt``: UTF-8, a ``#version`` line or none, then two symbols a line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ModelFileError(path, f"is unreadable ({error})", remedy) from error
    for number, line in enumerate(lines, start=1):
        if (number == 1 and line.startswith("#version")) or not line:
            continue
        if len(line.split(" ")) != 2:
            raise ModelFileError(path, f"line {number} is no merge of two symbols", remedy)


def load_tokenizer(directory: Path, *, remedy: str = "") -> Any:
    """``transformers.AutoTokenizer`` of ``directory``, its files checked first.

    Local files only, and never code the directory ships (``trust_remote_code=False``).

    Raises:
        ModelFileError: see :func:`check_tokenizer`; or transformers cannot build a
            tokenizer from the files.
    """
    from transformers import AutoTokenizer

    check_tokenizer(directory, remedy=remedy)
    try:
        return AutoTokenizer.from_pretrained(
            str(directory), local_files_only=True, trust_remote_code=False
        )
    except Exception as error:  # the files passed the checks, yet transformers refuses them
        raise ModelFileError(directory, f"holds no usable tokenizer ({error})", remedy) from error


def check_present(paths: Iterable[Path]) -> None:
    """Check that each of ``paths`` is a file with content, without reading it.

    Raises:
        ModelFileError: the first one that is missing or empty.
    """
    for path in paths:
        if not path.is_file() or path.stat().st_size == 0:
            raise ModelFileError(path, "is missing or empty")


@contextmanager
def staging(out_dir: Path, prefix: str) -> Iterator[Path]:
    """A directory to write a checkpoint into, beside ``out_dir`` (named from ``prefix``).

    Once the block ends without an error, each of its entries replaces the one of the
    same name in ``out_dir``: an interrupted write leaves nothing that looks like a
    checkpoint. The staging directory is removed either way.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=prefix) as staged:
        where = Path(staged)
        yield where
        for item in where.iterdir():
            target = out_dir / item.name
            if target.is_dir():
                shutil.rmtree(target)
            item.replace(target)
