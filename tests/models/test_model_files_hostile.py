"""Model files are hostile input: each bad file is refused with a ModelFileError naming it.

Small files made here (no tiny-omni weights): safetensors files truncated, emptied,
replaced by noise or given a header that lies about sizes; weights only in a pickle-based
format; tokenizer files and JSON configs cut short or garbled. The tiny-omni loaders and
the model cache on a real prepared model are in
``tests/integration/test_tiny_omni_hostile_files.py``.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("safetensors")

import torch
from safetensors.torch import save_file

from omni_actors.actors.engines.qwen3_omni.tokenizer import write_tokenizer
from omni_actors.actors.engines.vllm.embedding import load_input_embeddings
from omni_actors.actors.engines.vllm.runtime import safetensors_engine_args
from omni_actors.errors import EngineError, ModelFileError
from omni_actors.models.files import (
    check_safetensors,
    check_tokenizer,
    load_tokenizer,
    read_json,
    safetensors_weights,
)

Corruption = Callable[[bytes], bytes]


def _noise(size: int) -> bytes:
    return random.Random(0).randbytes(size)


def _lying_header(data: bytes) -> bytes:
    """The same data under a valid header that claims twice the elements per tensor."""
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    for name, info in header.items():
        if name != "__metadata__":
            info["shape"] = [2 * n for n in info["shape"]]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data[8 + length :]


SAFETENSORS_CORRUPTIONS: dict[str, Corruption] = {
    "cut_in_half": lambda data: data[: len(data) // 2],
    "zero_bytes": lambda data: b"",
    "random_bytes": lambda data: _noise(len(data)),
    "header_only": lambda data: data[: 8 + struct.unpack("<Q", data[:8])[0]],
    "header_lies_about_sizes": _lying_header,
}
"""Each turns a whole file's bytes into a damaged file's."""


def _write_weights(directory: Path, name: str = "model.safetensors") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {"embed.weight": torch.arange(12.0).reshape(3, 4), "norm.weight": torch.ones(4)}
    save_file(tensors, directory / name, metadata={"format": "pt"})
    return directory / name


@pytest.mark.parametrize("corruption", SAFETENSORS_CORRUPTIONS)
def test_a_damaged_safetensors_file_is_named(tmp_path: Path, corruption: str) -> None:
    file = _write_weights(tmp_path)
    assert safetensors_weights(tmp_path) == [file]  # whole, it passes
    file.write_bytes(SAFETENSORS_CORRUPTIONS[corruption](file.read_bytes()))
    with pytest.raises(ModelFileError, match="no valid safetensors") as info:
        safetensors_weights(tmp_path)
    assert info.value.path == file
    assert str(file) in str(info.value)


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "model.ckpt", "weights.pth"])
def test_weights_only_in_a_pickle_format_are_refused(tmp_path: Path, name: str) -> None:
    # The content does not matter: such a file is never opened.
    (tmp_path / name).write_bytes(b"\x80\x04not read")
    with pytest.raises(ModelFileError, match="pickle-based") as info:
        safetensors_weights(tmp_path)
    assert info.value.path == tmp_path
    assert name in str(info.value)
    assert "convert the weights to safetensors" in str(info.value)


def test_a_pickle_beside_safetensors_is_left_unread(tmp_path: Path) -> None:
    file = _write_weights(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not read")
    assert safetensors_weights(tmp_path) == [file]


def test_a_directory_without_weights_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="is missing") as info:
        safetensors_weights(tmp_path)
    assert info.value.path == tmp_path / "model.safetensors"
    with pytest.raises(ModelFileError, match="is missing") as info:
        safetensors_weights(tmp_path / "absent")
    assert info.value.path == tmp_path / "absent"


def _index(directory: Path, weight_map: object) -> Path:
    index = directory / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


def test_a_shard_index_names_the_files_checked(tmp_path: Path) -> None:
    first = _write_weights(tmp_path, "model-00001-of-00002.safetensors")
    second = _write_weights(tmp_path, "model-00002-of-00002.safetensors")
    _write_weights(tmp_path, "stray.safetensors")  # not in the index: not weights
    _index(tmp_path, {"embed.weight": first.name, "norm.weight": second.name})
    assert safetensors_weights(tmp_path) == [first, second]
    second.write_bytes(second.read_bytes()[:100])
    with pytest.raises(ModelFileError) as info:
        safetensors_weights(tmp_path)
    assert info.value.path == second


@pytest.mark.parametrize(
    ("weight_map", "problem"),
    [
        ({"embed.weight": "../outside.safetensors"}, "other than safetensors beside it"),
        ({"embed.weight": "/etc/passwd"}, "other than safetensors beside it"),
        ({"embed.weight": "pytorch_model.bin"}, "other than safetensors beside it"),
        (["model.safetensors"], "no weight_map"),
    ],
)
def test_a_shard_index_pointing_elsewhere_is_refused(
    tmp_path: Path, weight_map: object, problem: str
) -> None:
    _write_weights(tmp_path)
    index = _index(tmp_path, weight_map)
    with pytest.raises(ModelFileError, match=problem) as info:
        safetensors_weights(tmp_path)
    assert info.value.path == index


def test_a_shard_the_index_names_must_exist(tmp_path: Path) -> None:
    _index(tmp_path, {"embed.weight": "model-00001-of-00001.safetensors"})
    with pytest.raises(ModelFileError, match="is missing") as info:
        safetensors_weights(tmp_path)
    assert info.value.path == tmp_path / "model-00001-of-00001.safetensors"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'{"architectures": ["Qwen3OmniMoeCode2Wav"], "hidden', "no valid JSON"),
        (b"", "no valid JSON"),
        (b"\xff\xfe\x00\x81 not text", "no valid JSON"),
        (b'["a", "list"]', "holds a JSON list, not an object"),
    ],
)
def test_a_corrupt_json_file_is_named(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(ModelFileError, match=problem) as info:
        read_json(path, remedy="rebuild it")
    assert info.value.path == path
    assert str(info.value).startswith(f"{path}: ")
    assert str(info.value).endswith("; rebuild it")
    with pytest.raises(ModelFileError, match="is missing"):
        read_json(tmp_path / "absent.json")


@pytest.fixture
def tokenizer_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "tokenizer"
    write_tokenizer(directory)
    check_tokenizer(directory)  # whole, it passes
    return directory


def _garbled_vocab(data: bytes) -> bytes:
    """Still JSON, but the BPE vocabulary is a list of junk instead of symbol -> id."""
    tokenizer = json.loads(data)
    tokenizer["model"]["vocab"] = [1, "two", None]
    return json.dumps(tokenizer).encode()


TOKENIZER_CORRUPTIONS = [
    pytest.param("tokenizer.json", SAFETENSORS_CORRUPTIONS["cut_in_half"], id="cut_in_half"),
    pytest.param("tokenizer.json", SAFETENSORS_CORRUPTIONS["zero_bytes"], id="zero_bytes"),
    pytest.param("tokenizer.json", SAFETENSORS_CORRUPTIONS["random_bytes"], id="random_bytes"),
    pytest.param("tokenizer.json", _garbled_vocab, id="garbled_vocab"),
    pytest.param("tokenizer_config.json", lambda data: data[:100], id="config_cut"),
    pytest.param("special_tokens_map.json", lambda data: _noise(64), id="special_tokens_noise"),
]


@pytest.mark.parametrize(("name", "corruption"), TOKENIZER_CORRUPTIONS)
def test_a_corrupt_tokenizer_file_is_named(
    tokenizer_dir: Path, name: str, corruption: Corruption
) -> None:
    path = tokenizer_dir / name
    path.write_bytes(corruption(path.read_bytes()))
    with pytest.raises(ModelFileError) as info:
        check_tokenizer(tokenizer_dir)
    assert info.value.path == path
    # Loading checks first, so the error names the file, not only the directory.
    with pytest.raises(ModelFileError) as info:
        load_tokenizer(tokenizer_dir)
    assert info.value.path == path


@pytest.mark.parametrize("also", ["vocab.json", "merges.txt"])
def test_a_missing_tokenizer_is_named(tokenizer_dir: Path, also: str) -> None:
    """Without ``tokenizer.json`` and one of the BPE files it is built from."""
    (tokenizer_dir / "tokenizer.json").unlink()
    (tokenizer_dir / also).unlink()
    with pytest.raises(ModelFileError, match="is missing") as info:
        check_tokenizer(tokenizer_dir)
    assert info.value.path == tokenizer_dir / "tokenizer.json"


def test_without_tokenizer_json_the_bpe_files_are_the_tokenizer(tokenizer_dir: Path) -> None:
    """As transformers does for a release published without ``tokenizer.json``."""
    whole = load_tokenizer(tokenizer_dir)
    (tokenizer_dir / "tokenizer.json").unlink()
    built = load_tokenizer(tokenizer_dir)
    for text in ("hi", "the user said: assistant", "héllo 日本 🎉\n<|im_end|>"):
        assert built.encode(text) == whole.encode(text)


def test_bpe_files_that_build_no_tokenizer_are_named(tokenizer_dir: Path) -> None:
    """Each file well formed, but a merge joins a symbol the vocabulary lacks."""
    (tokenizer_dir / "tokenizer.json").unlink()
    merges = tokenizer_dir / "merges.txt"
    merges.write_text(merges.read_text() + "not_a_symbol x\n")
    with pytest.raises(ModelFileError, match="builds no BPE model") as info:
        check_tokenizer(tokenizer_dir)
    assert info.value.path == merges


def test_a_whole_tokenizer_loads(tokenizer_dir: Path) -> None:
    tokenizer = load_tokenizer(tokenizer_dir)
    assert tokenizer.encode("hi") == list(b"hi")


@pytest.mark.parametrize("corruption", ["cut_in_half", "header_lies_about_sizes"])
def test_the_embedding_table_is_read_from_checked_files(tmp_path: Path, corruption: str) -> None:
    file = _write_weights(tmp_path)
    assert load_input_embeddings(tmp_path, "embed.weight").shape == (3, 4)
    file.write_bytes(SAFETENSORS_CORRUPTIONS[corruption](file.read_bytes()))
    with pytest.raises(ModelFileError) as info:
        load_input_embeddings(tmp_path, "embed.weight")
    assert info.value.path == file


def test_the_embedding_table_is_never_read_from_a_pickle(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not read")
    with pytest.raises(ModelFileError, match="pickle-based"):
        load_input_embeddings(tmp_path, "embed.weight")


def test_vllm_loads_safetensors_unless_told_a_format_that_reads_no_pickle() -> None:
    assert safetensors_engine_args({"seed": 1}) == {"seed": 1, "load_format": "safetensors"}
    assert safetensors_engine_args({"load_format": "dummy"})["load_format"] == "dummy"
    for pickled in ("auto", "pt", "PT", "npcache"):
        with pytest.raises(EngineError, match="pickle-based"):
            safetensors_engine_args({"load_format": pickled})


def test_check_safetensors_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="is missing") as info:
        check_safetensors(tmp_path / "model.safetensors")
    assert info.value.path == tmp_path / "model.safetensors"
