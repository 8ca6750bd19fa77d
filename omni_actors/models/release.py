"""A model directory in the Hugging Face release layout, read one stage at a time.

A multi-stage model is published as one checkpoint: ``config.json``, a shard index
(``model.safetensors.index.json``: ``{"metadata": {"total_size": N}, "weight_map":
{tensor: shard}}``) and shards ``model-00001-of-000NN.safetensors``; a small one as a
single ``model.safetensors``. Each tensor's name starts with the stage that owns it
(``thinker.``, ``talker.``, ``code2wav.``). A stage's worker needs only its own tensors:
:class:`Release` maps a prefix to the shards holding it through the index, opens only
those, and hands tensors out one at a time, straight onto the stage's device, so a
stage never holds a host copy of another stage's weights or of its own as a whole.
:func:`resolve_model` downloads only those shards from the Hub for the same reason.

The files are hostile input (:mod:`omni_actors.models.files`): the index is checked before
any shard is opened (each shard a plain ``.safetensors`` name beside it), and each shard
as it is opened, against the index: a shard that does not hold what the index maps to it,
or holds a stage's tensor the index puts elsewhere, is a mismatched download or a crafted
directory, and is refused by name rather than loaded as some other model.

:class:`ReleaseWriter` writes the layout, shard by shard, into a staging directory that
replaces its target only once whole, so an interrupted write never leaves a directory
that looks like a release.

torch, safetensors and huggingface_hub are imported by the functions that use them: the
CLI reads an index without paying for torch.
"""

from __future__ import annotations

import contextlib
import glob
import json
import re
import shutil
import struct
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from omni_actors.errors import MissingExtraError, ModelFileError
from omni_actors.models.files import (
    INDEX,
    check_safetensors,
    missing_weights,
    read_json,
    read_weight_map,
    weight_map,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "INDEX",
    "Release",
    "ReleaseWriter",
    "resolve_model",
    "shard_patterns",
]

SINGLE_FILE: Final = "model.safetensors"
"""The weights of a release small enough for one file, which has no index."""

_TEXT_PATTERNS: Final = ("*.json", "*.txt", "*.jinja", "tokenizer.model", "*.tiktoken")
"""Configs, the shard index and tokenizer files: what every download of a release takes.
No pattern here matches a pickle-format file, which would never be loaded anyway."""

# Hugging Face's rule for a repo id, "org/name": no path of ours is read as one unless
# no such directory exists.
_REPO_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")


def _header_sizes(shard: Path, remedy: str) -> dict[str, int]:
    """Each tensor's size in bytes, from the header of a shard that passed
    :func:`check_safetensors` (which checked the offsets against the file)."""
    try:
        with shard.open("rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            header: dict[str, Any] = json.loads(file.read(length))
        header.pop("__metadata__", None)
        return {
            name: int(info["data_offsets"][1]) - int(info["data_offsets"][0])
            for name, info in header.items()
        }
    except (OSError, ValueError, LookupError, TypeError, AttributeError, struct.error) as error:
        # Only a file changed since its check gets here.
        problem = f"is no valid safetensors file, its header unreadable ({error})"
        raise ModelFileError(shard, problem, remedy) from error


class Release:
    """A model directory in the release layout.

    Made by :meth:`open`, which reads ``config.json`` and the index only; shards are
    opened by :meth:`tensors` and :meth:`check`, each as its turn comes.

    Attributes:
        path: the directory.
        config: ``config.json``, parsed.
        opened: the shard files :meth:`tensors` and :meth:`check` opened so far, in order
            (one entry per shard per call): what a stage's load touched.
    """

    def __init__(
        self,
        path: Path,
        config: dict[str, Any],
        weights: Mapping[str, str],
        source: Path,
        remedy: str = "",
    ) -> None:
        """Use :meth:`open`: this takes the parts already read and checked.

        Args:
            path: the directory.
            config: ``config.json``, parsed.
            weights: each tensor's name to the file name of the shard holding it.
            source: the file ``weights`` was read from (the index, or the single file),
                named in errors about the mapping.
            remedy: what errors about these files tell the user to do.
        """
        self.path = path
        self.config = config
        self.opened: list[Path] = []
        self._weights = dict(weights)
        self._source = source
        self._remedy = remedy

    @classmethod
    def open(cls, path: Path, *, remedy: str = "") -> Release:
        """Read the release in ``path``: its config and which shard holds each tensor.

        Args:
            path: a directory with ``config.json`` and either the shard index and the
                shards it names, or a single ``model.safetensors``.
            remedy: what every error about these files tells the user to do (how to
                download or rebuild them).

        Raises:
            ModelFileError: naming the file: ``path`` or ``config.json`` is missing; the
                index is corrupt or names a file that is no safetensors file beside it;
                ``model.safetensors`` (without an index) is missing or corrupt, or the
                weights are only in a pickle-based format. A shard the index names may
                be missing here (a download of some stages only, :func:`resolve_model`):
                it is named as missing when its stage is read.
        """
        path = Path(path)
        if not path.is_dir():
            raise ModelFileError(path, "is missing or no directory", remedy)
        config = read_json(path / "config.json", remedy=remedy)
        index = path / INDEX
        if index.is_file():
            return cls(path, config, read_weight_map(index, remedy=remedy), index, remedy)
        single = path / SINGLE_FILE
        if not single.exists():
            raise missing_weights(path, remedy=remedy)
        check_safetensors(single, remedy=remedy)
        names = _header_sizes(single, remedy)
        return cls(path, config, dict.fromkeys(names, SINGLE_FILE), single, remedy)

    def names(self, prefix: str) -> list[str]:
        """The full names of the tensors whose name starts with ``prefix``, sorted."""
        return sorted(name for name in self._weights if name.startswith(prefix))

    def shards(self, prefix: str) -> list[Path]:
        """The shard files holding the tensors named ``prefix...``, sorted.

        Raises:
            ModelFileError: naming the index (or the single file): it maps no tensor with
                that prefix, so the directory holds no such stage; or naming a shard of
                the prefix that is missing.
        """
        names = self.names(prefix)
        files = sorted({self.path / self._weights[name] for name in names})
        if not files:
            problem = f"maps no tensor named {prefix!r}...: this release has no such stage"
            raise ModelFileError(self._source, problem, self._remedy)
        for file in files:
            if not file.is_file():
                count = sum(self._weights[name] == file.name for name in names)
                problem = f"is missing; {self._source.name} maps {count} {prefix}* tensors to it"
                raise ModelFileError(file, problem, self._remedy)
        return files

    def tensors(
        self, prefix: str, *, device: str | torch.device = "cpu", strip: bool = True
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors named ``prefix...``, one at a time, read onto ``device``.

        Opens only :meth:`shards` of ``prefix``, one after the other, each checked as in
        :meth:`check` before a tensor is read from it. Each tensor keeps the checkpoint's
        dtype and is read straight onto ``device``: at most one tensor at a time passes
        through host memory, so loading a stage never needs its whole size there.

        Args:
            prefix: the stage's prefix (``"code2wav."``).
            device: where the tensors are made.
            strip: yield names without ``prefix`` (as the stage's module names them).

        Yields:
            ``(name, tensor)``, in name order within each shard.

        Raises:
            ModelFileError: see :meth:`shards` (raised on the call) and :meth:`check`
                (raised as the shard's turn comes).
        """
        shards = self.shards(prefix)  # a missing stage fails the call, not the first next()
        return self._tensors(shards, prefix, str(device), strip)

    def _tensors(
        self, shards: list[Path], prefix: str, device: str, strip: bool
    ) -> Iterator[tuple[str, torch.Tensor]]:
        from safetensors import safe_open

        for shard in shards:
            names = self._check_shard(shard, prefix)
            with safe_open(str(shard), framework="pt", device=device) as handle:
                for name in names:
                    yield (name[len(prefix) :] if strip else name), handle.get_tensor(name)

    def check(self, prefix: str) -> None:
        """Check the shards of ``prefix`` as :meth:`tensors` does, reading headers only.

        For a cache's verify: a damaged or mismatched shard is found without reading its
        tensor data.

        Raises:
            ModelFileError: see :meth:`shards`; or, naming the shard: it is truncated or
                no safetensors file; it lacks a tensor the index maps to it ("the index
                says it holds X; it does not"); or it holds a tensor named ``prefix...``
                that the index maps to another shard or does not list.
        """
        for shard in self.shards(prefix):
            self._check_shard(shard, prefix)

    def tensor_bytes(self, prefix: str) -> int:
        """The size of the tensors named ``prefix...``, in bytes, from the shard headers.

        What loading the stage puts on its device: for memory budgets, and to compare
        a load's peak memory against. Shards are checked as in :meth:`check`, headers
        only; they are not recorded in :attr:`opened`, as no tensor is read.

        Raises:
            ModelFileError: see :meth:`check`.
        """
        total = 0
        for shard in self.shards(prefix):
            sizes = self._shard_sizes(shard, prefix)
            total += sum(sizes[name] for name in self._mapped(shard, prefix))
        return total

    def _mapped(self, shard: Path, prefix: str) -> list[str]:
        """The names ``prefix...`` the index maps to ``shard``, sorted."""
        return [name for name in self.names(prefix) if self._weights[name] == shard.name]

    def _check_shard(self, shard: Path, prefix: str) -> list[str]:
        """Check ``shard`` against the index for ``prefix``, record it as opened, and
        return the names ``prefix...`` it holds, sorted."""
        self.opened.append(shard)
        self._shard_sizes(shard, prefix)
        return self._mapped(shard, prefix)

    def _shard_sizes(self, shard: Path, prefix: str) -> dict[str, int]:
        """The sizes in ``shard``'s header, once the shard is checked whole and agreeing
        with the index about the tensors named ``prefix...``."""
        check_safetensors(shard, remedy=self._remedy)
        sizes = _header_sizes(shard, self._remedy)
        for name in self._mapped(shard, prefix):
            if name not in sizes:
                problem = f"the index says it holds {name}; it does not"
                raise ModelFileError(shard, problem, self._remedy)
        for name in sorted(sizes):
            mapped = self._weights.get(name)
            if name.startswith(prefix) and mapped != shard.name:
                where = f"maps it to {mapped}" if mapped else "does not list it"
                problem = f"holds {name}, but the index {where}: the shard does not match"
                raise ModelFileError(shard, problem, self._remedy)
        return sizes


class ReleaseWriter:
    """Writes tensors into the release layout, shard by shard, never holding more than one
    shard in memory.

    Everything goes into a hidden staging directory beside ``out``
    (``.{out.name}.partial``), which :meth:`finish` moves into place: until then ``out``
    is left as it was, so a reader never sees half a release, and a write that fails
    leaves nothing behind. One writer per ``out`` at a time: a new writer clears a staging
    directory left by one that died.

    As a context manager: leaving the block normally finishes the release (unless
    :meth:`finish` was called); leaving it with an exception removes the staging
    directory and leaves ``out`` untouched.

    A tensor is written when its shard is (moved to the CPU, made contiguous then):
    until then the writer holds it, and changing it in place changes what is written.
    """

    def __init__(self, out: Path, *, max_shard_bytes: int = 4 * 2**30) -> None:
        """Start a release to be written to ``out``.

        Args:
            out: the directory the release ends up in; replaced by :meth:`finish` if it
                exists.
            max_shard_bytes: a shard grows up to this many bytes of tensors; a tensor
                larger than this gets a shard of its own.

        Raises:
            ValueError: ``max_shard_bytes`` is not positive.
        """
        if max_shard_bytes <= 0:
            raise ValueError(f"max_shard_bytes must be positive, not {max_shard_bytes}")
        self.out = Path(out)
        self._staging = self.out.parent / f".{self.out.name}.partial"
        self._max_shard_bytes = max_shard_bytes
        self._current: dict[str, torch.Tensor] = {}
        self._current_bytes = 0
        self._shards: list[tuple[str, list[str]]] = []  # staged file name, its tensors
        self._names: set[str] = set()
        self._total_bytes = 0
        self._finished = False
        _remove(self._staging)
        self._staging.mkdir(parents=True)

    def __enter__(self) -> ReleaseWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is not None:
            self._discard()
        elif not self._finished:
            self.finish()

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Add ``tensor`` under ``name`` to the current shard.

        When it would take the shard past ``max_shard_bytes`` and the shard holds a
        tensor already, that shard is written first and ``tensor`` starts the next.

        Raises:
            ValueError: ``name`` was added before.
        """
        self._check_open()
        if name in self._names:
            raise ValueError(f"tensor {name!r} was added twice")
        size = tensor.numel() * tensor.element_size()
        if self._current and self._current_bytes + size > self._max_shard_bytes:
            self._write_shard()
        self._names.add(name)
        self._current[name] = tensor
        self._current_bytes += size

    def new_shard(self) -> None:
        """Start a new shard with the next tensor added (Qwen3-Omni's last shard holds
        ``code2wav.*`` alone, so a code2wav worker downloads and opens only that)."""
        self._check_open()
        self._write_shard()

    def copy_file(self, source: Path, name: str | None = None) -> None:
        """Copy ``source`` (a config or tokenizer file) beside the shards, as ``name``
        (default: its own name).

        Raises:
            ValueError: ``name`` is no plain file name, or is the index's or a
                safetensors file's (weights go through :meth:`add`).
        """
        self._check_open()
        shutil.copyfile(source, self._staging / self._file_name(name or Path(source).name))

    def write_json(self, name: str, data: Mapping[str, Any]) -> None:
        """Write ``data`` as JSON into the file ``name`` beside the shards.

        Raises:
            ValueError: as for :meth:`copy_file`.
        """
        self._check_open()
        text = json.dumps(data, indent=2) + "\n"
        (self._staging / self._file_name(name)).write_text(text)

    def finish(self) -> Path:
        """Write the last shard and the index, and move the release into place at ``out``.

        Shards are named ``model-{i:05d}-of-{n:05d}.safetensors`` once their number is
        known; each carries the metadata ``{"format": "pt"}``. The index's
        ``metadata.total_size`` is the tensors' size in bytes.

        Returns:
            ``out``.

        Raises:
            ValueError: no tensor was added.
        """
        self._check_open()
        try:
            self._write_shard()
            if not self._shards:
                raise ValueError(f"no tensor was added to the release {self.out}")
            count = len(self._shards)
            weights: dict[str, str] = {}
            for number, (staged, names) in enumerate(self._shards, start=1):
                final = f"model-{number:05d}-of-{count:05d}.safetensors"
                (self._staging / staged).rename(self._staging / final)
                weights.update(dict.fromkeys(names, final))
            index = {
                "metadata": {"total_size": self._total_bytes},
                "weight_map": dict(sorted(weights.items())),
            }
            (self._staging / INDEX).write_text(json.dumps(index, indent=2) + "\n")
            # A directory cannot be renamed over a non-empty one: the old release steps
            # aside first, and goes once the new one is in place.
            old = self.out.parent / f".{self.out.name}.old"
            _remove(old)
            if self.out.exists():
                self.out.rename(old)
            self._staging.rename(self.out)
            _remove(old)
        except BaseException:
            self._discard()
            raise
        self._finished = True
        return self.out

    def _write_shard(self) -> None:
        """Write the current shard into staging under a temporary name, and let go of it."""
        if not self._current:
            return
        from safetensors.torch import save_file

        tensors: dict[str, torch.Tensor] = {}
        storages: set[int] = set()
        for name, tensor in self._current.items():
            data = tensor.detach().to("cpu").contiguous()
            # safetensors refuses tensors sharing memory (tied weights added under two
            # names, views of one tensor): each gets its own copy.
            storage = data.untyped_storage().data_ptr()
            if storage in storages:
                data = data.clone()
            storages.add(storage)
            tensors[name] = data
        staged = f".shard-{len(self._shards) + 1:05d}.safetensors"
        save_file(tensors, self._staging / staged, metadata={"format": "pt"})
        self._shards.append((staged, list(self._current)))
        self._total_bytes += self._current_bytes
        self._current = {}
        self._current_bytes = 0

    def _file_name(self, name: str) -> str:
        if Path(name).name != name or name in ("", ".", ".."):
            raise ValueError(f"{name!r} is no plain file name")
        if name == INDEX or name.endswith(".safetensors"):
            raise ValueError(f"{name!r} is written by the writer itself; add tensors instead")
        return name

    def _check_open(self) -> None:
        if self._finished:
            raise ValueError(f"the release {self.out} is finished")
        if not self._staging.is_dir():
            raise ValueError(f"the release {self.out} was abandoned after an error")

    def _discard(self) -> None:
        self._current = {}
        _remove(self._staging)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def shard_patterns(
    index: Mapping[str, Any], prefixes: Sequence[str], *, source: Path = Path(INDEX)
) -> list[str]:
    """Download patterns (``allow_patterns``) for the shards holding ``prefixes``' tensors.

    A stage's worker downloads only its own shards: for Qwen3-Omni's ``code2wav.``, one
    shard of fifteen. The shard names are escaped, so a crafted index cannot widen the
    download with a wildcard.

    Args:
        index: the shard index's JSON object.
        prefixes: the stages' prefixes; ``[""]`` for every shard.
        source: the index file, named in errors.

    Raises:
        ModelFileError: naming ``source``: the index is malformed (see
            :func:`~omni_actors.models.files.weight_map`), or maps no tensor to one of
            ``prefixes``.
    """
    weights = weight_map(index, source)
    files: set[str] = set()
    for prefix in prefixes:
        found = {file for name, file in weights.items() if name.startswith(prefix)}
        if not found:
            problem = f"maps no tensor named {prefix!r}...: this release has no such stage"
            raise ModelFileError(source, problem)
        files |= found
    return [glob.escape(name) for name in sorted(files)]


def resolve_model(model: str | Path, *, prefixes: Sequence[str] = (), remedy: str = "") -> Path:
    """The local directory of ``model``, downloaded from the Hugging Face Hub if need be.

    Args:
        model: a directory; or a Hub repo id (``"Qwen/Qwen3-Omni-30B-A3B-Instruct"``)
            when given as a string naming no existing path. A repo is taken from the
            Hub's local cache when it has the files, else downloaded into that cache.
        prefixes: the stages the caller will load: only the shards holding their tensors
            are downloaded (with the configs and tokenizer files); none: every shard the
            index names. Pickle-format weights are never downloaded.
        remedy: what errors tell the user to do.

    Raises:
        ModelFileError: ``model`` is no directory and no repo id; or the Hub cannot be
            reached or refuses the repo (the message names the repo and says why); or the
            index is corrupt or lacks a prefix.
        MissingExtraError: ``huggingface_hub`` is not installed.
    """
    path = Path(model).expanduser()
    if path.is_dir() and model != "":  # Path("") is the working directory
        return path
    if isinstance(model, Path) or path.exists() or not _is_repo_id(model):
        problem = "is no model directory and no Hugging Face repo id ('org/name')"
        raise ModelFileError(model, problem, remedy)
    return _from_hub(model, prefixes, remedy)


def _is_repo_id(text: str) -> bool:
    return _REPO_ID.fullmatch(text) is not None and ".." not in text and "--" not in text


def _from_hub(repo: str, prefixes: Sequence[str], remedy: str) -> Path:
    """The snapshot of ``repo`` with its text files and the shards of ``prefixes``: the
    index is fetched first, as it says which shards those are."""
    text = list(_TEXT_PATTERNS)
    root = _snapshot(repo, text, ["config.json"], remedy)
    index = root / INDEX
    if index.is_file():
        data = read_json(index, remedy=remedy)
        shards = shard_patterns(data, list(prefixes) or [""], source=index)
    else:
        shards = [SINGLE_FILE]
    return _snapshot(repo, [*text, *shards], ["config.json", *shards], remedy)


def _snapshot(repo: str, patterns: list[str], wanted: list[str], remedy: str) -> Path:
    """``repo``'s snapshot holding ``patterns``' files: from the cache when it holds a
    file for each of the patterns ``wanted``, else downloaded."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as error:
        raise MissingExtraError("a Hugging Face repo id as model", "tiny-omni", error) from error

    root: Path | None = None
    with contextlib.suppress(LocalEntryNotFoundError):  # not in the cache: downloaded below
        root = Path(snapshot_download(repo, local_files_only=True, allow_patterns=patterns))
    # Without a listing of the repo in the cache, the Hub returns a cached snapshot
    # whatever it lacks: the files this call needs are looked for.
    if root is not None and all(any(root.glob(pattern)) for pattern in wanted):
        return root
    try:
        return Path(snapshot_download(repo, allow_patterns=patterns))
    except Exception as error:  # the Hub raises HTTP, connection and validation errors alike
        problem = f"could not be downloaded from the Hugging Face Hub ({error})"
        raise ModelFileError(repo, problem, remedy) from error
