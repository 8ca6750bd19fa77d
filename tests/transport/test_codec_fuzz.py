"""Fuzzing: no byte sequence makes the decoder do anything but decode or ProtocolError."""

from __future__ import annotations

import contextlib

import msgspec
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from omni_actors.errors import ProtocolError
from omni_actors.protocols.tensors import LIB_TORCH, TORCH_DTYPES, TensorDesc
from omni_actors.transport.codec import Decoder, Encoder, _inline_tensor


class Chunk(msgspec.Struct, tag=True, frozen=True):
    seq: int
    hidden: torch.Tensor
    extra: list[torch.Tensor] = []


class Text(msgspec.Struct, tag=True, frozen=True):
    text: str


DECODER: Decoder[Chunk | Text] = Decoder(Chunk | Text)
VALID = Encoder(inline_threshold=64).encode(
    Chunk(3, torch.arange(100, dtype=torch.float32), [torch.ones(4, dtype=torch.bfloat16)])
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decodes_or_protocol_error(header: bytes, buffers: list[bytes]) -> None:
    with contextlib.suppress(ProtocolError):
        DECODER.decode(header, buffers)
    # The decoder must still work afterwards.
    assert DECODER.decode(VALID[0], VALID[1:]).seq == 3


@FUZZ
@given(st.binary(max_size=256), st.lists(st.binary(max_size=64), max_size=4))
def test_random_bytes(header: bytes, buffers: list[bytes]) -> None:
    _decodes_or_protocol_error(header, buffers)


@FUZZ
@given(st.data())
def test_mutated_valid_messages(data: st.DataObject) -> None:
    header = bytearray(VALID[0])
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(header) - 1))
        header[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(header)))
    buffers = [bytes(b) for b in VALID[1:]]
    if buffers and data.draw(st.booleans()):
        buffers[0] = buffers[0][: data.draw(st.integers(0, len(buffers[0])))]
    if data.draw(st.booleans()):
        buffers.append(b"\x00" * data.draw(st.integers(0, 16)))
    _decodes_or_protocol_error(bytes(header[:cut]), buffers)


@FUZZ
@given(
    dtype=st.sampled_from(["float32", "bfloat16", "bool", "int64", "complex64", "nope", ""]),
    shape=st.lists(st.integers(-3, 1 << 62), max_size=5),
    lib=st.integers(-1, 3),
    data=st.one_of(st.none(), st.binary(max_size=64)),
    buffer=st.integers(-2, 3),
    slab=st.integers(-1, 2),
    buffers=st.lists(st.binary(max_size=64), max_size=3),
)
def test_lying_descriptors(
    dtype: str,
    shape: list[int],
    lib: int,
    data: bytes | None,
    buffer: int,
    slab: int,
    buffers: list[bytes],
) -> None:
    desc = TensorDesc(lib, dtype, tuple(shape), data=data, buffer=buffer, slab=slab)
    header = msgspec.msgpack.encode({"type": "Chunk", "seq": 1, "hidden": desc})
    _decodes_or_protocol_error(header, buffers)


_NEAR_MISSES = st.one_of(
    st.integers(-2, 9),
    st.booleans(),
    st.sampled_from([1.0, -1.0, "T", "float32", "bfloat16", "nope", b"", bytearray(4), None]),
    st.lists(st.one_of(st.integers(-2, 9), st.booleans(), st.just(2.0)), max_size=3),
    st.binary(max_size=40),
)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, as uint8 (any dtype; 0-d included)."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


@FUZZ
@given(
    dtype=st.sampled_from(["float32", "float16", "bfloat16", "int64", "uint8", "bool"]),
    shape=st.lists(st.integers(0, 4), max_size=3),
    mutations=st.lists(st.tuples(st.integers(0, 10), _NEAR_MISSES), max_size=2),
)
# Data bytes that make a float16 NaN: the two paths agree, though NaN != NaN.
@example(dtype="float16", shape=[4], mutations=[(4, b"\x00\x00\x00\x00\x00\x00\x00}")])
def test_the_inline_fast_path_decodes_exactly_what_the_general_path_does(
    dtype: str, shape: list[int], mutations: list[tuple[int, object]]
) -> None:
    # A valid inline descriptor as msgpack hands it to the decoder's hook (a plain
    # list), then near misses: a field of the wrong type or value, or one too many.
    tensor = torch.zeros(shape, dtype=TORCH_DTYPES[dtype])
    raw = msgspec.msgpack.decode(Encoder().encode(Chunk(1, tensor))[0])["hidden"]
    extra = False
    for index, value in mutations:
        extra = extra or index >= len(raw)
        if index < len(raw):
            raw[index] = value
        else:
            raw.append(value)
    fast = _inline_tensor(raw)
    try:
        desc = msgspec.convert(raw, TensorDesc)
        general = DECODER._tensor(desc, want=LIB_TORCH)
    except (msgspec.ValidationError, ProtocolError):
        general = None
    if fast is not None:  # only what the general path accepts, with the same tensor
        assert general is not None
        assert fast.dtype == general.dtype
        assert fast.shape == general.shape
        # Bit for bit: both decode the same bytes, and a NaN there equals no NaN.
        assert torch.equal(_bits(fast), _bits(general))
        assert fast.numpy().flags.writeable  # a private copy, as the general path's
    elif general is not None and type(raw[4]) is bytes and general.numel() and not extra:
        # The fast path leaves only bfloat16 (numpy has no such type), descriptors with
        # trailing extras (which msgspec ignores) and data as text (msgpack hands bytes;
        # ``convert`` would read a string as base64) to the general one.
        assert general.dtype == torch.bfloat16, f"fast path refused a valid {raw!r}"


def test_the_inline_fast_path_takes_well_formed_stream_tensors() -> None:
    for tensor in (torch.tensor([7]), torch.zeros(1, 8), torch.full((1, 4), 3), torch.ones(1920)):
        header = Encoder().encode(Chunk(1, tensor))[0]
        raw = msgspec.msgpack.decode(header)["hidden"]
        fast = _inline_tensor(raw)
        assert fast is not None
        assert torch.equal(fast, tensor)
        assert fast.dtype == tensor.dtype


@pytest.mark.parametrize(
    ("index", "value"),
    [
        (0, "R"),  # another struct's tag
        (1, False),  # a bool is not an int to msgspec
        (1, 1),  # numpy's library
        (2, "bfloat16"),  # numpy has no such type
        (2, 5),
        (3, [1, True]),
        (3, [2, 2.0]),
        (3, [-1, -4]),
        (3, [2]),  # too few bytes for the shape
        (3, [1] * 38 + [2, 2]),  # more dimensions than allowed
        (4, bytearray(16)),
        (4, None),
        (5, 0),  # two placements
        (5, True),
        (6, 0),
        (7, 1.0),
        (8, False),
        (9, "0"),
    ],
)
def test_the_inline_fast_path_leaves_every_near_miss_to_the_general_path(
    index: int, value: object
) -> None:
    raw = msgspec.msgpack.decode(Encoder().encode(Chunk(1, torch.zeros(2, 2)))[0])["hidden"]
    assert _inline_tensor(raw) is not None
    raw[index] = value
    assert _inline_tensor(raw) is None
