"""Fuzzing: no byte sequence makes the decoder do anything but decode or ProtocolError."""

from __future__ import annotations

import contextlib

import msgspec
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omni_actors.errors import ProtocolError
from omni_actors.protocols.tensors import TensorDesc
from omni_actors.transport.codec import Decoder, Encoder


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
