"""Codec with a shared-memory slab: placement, fallback, lying slab descriptors.

The real slab lives in ``omni_actors.transport.shm`` and is tested there; here an
in-memory fake stands in, so these tests pin down only what the codec itself does.
"""

from __future__ import annotations

import contextlib

import msgspec
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_actors.errors import ProtocolError
from omni_actors.protocols.tensors import LIB_TORCH, TensorDesc
from omni_actors.transport.codec import Decoder, Encoder, slab_slots

SLAB_ID = 7


class FakeSlab:
    """Writer and reader of one in-memory slab; views are never released (not tested here)."""

    def __init__(self, slots: int = 4, slot_bytes: int = 1 << 16) -> None:
        self.memory = [bytearray(slot_bytes) for _ in range(slots)]
        self.filled = [False] * slots
        self.slot_bytes = slot_bytes
        self.refuse = False

    def put(self, data: memoryview) -> tuple[int, int, int] | None:
        if self.refuse or data.nbytes > self.slot_bytes or all(self.filled):
            return None
        slot = self.filled.index(False)
        self.memory[slot][: data.nbytes] = data.cast("B")
        self.filled[slot] = True
        return SLAB_ID, slot, 0

    def cancel(self, slot: int) -> None:
        self.filled[slot] = False

    def view(self, slab: int, slot: int, offset: int, nbytes: int) -> memoryview:
        if slab != SLAB_ID or not 0 <= slot < len(self.memory):
            raise ProtocolError(f"unknown slot {slab}/{slot}")
        if offset < 0 or nbytes < 0 or offset + nbytes > self.slot_bytes:
            raise ProtocolError(f"{nbytes} bytes at {offset} do not fit a slot")
        if not self.filled[slot]:
            raise ProtocolError(f"slot {slot} holds no message")
        return memoryview(self.memory[slot])[offset : offset + nbytes]


class Chunk(msgspec.Struct, tag=True, frozen=True):
    seq: int
    hidden: torch.Tensor
    extra: list[torch.Tensor] = []
    named: dict[str, np.ndarray] = {}


def _codec(slab: FakeSlab) -> tuple[Encoder, Decoder[Chunk]]:
    encoder = Encoder(inline_threshold=1024, slab_writer=slab, slab_threshold=4096)
    return encoder, Decoder(Chunk, slab_reader=slab)


def _slab_header(desc: TensorDesc) -> bytes:
    return msgspec.msgpack.encode({"type": "Chunk", "seq": 1, "hidden": desc})


def test_large_tensors_go_to_the_slab_and_decode_over_it() -> None:
    slab = FakeSlab()
    encoder, decoder = _codec(slab)
    tensor = torch.randn(2048)  # 8 KiB: at least slab_threshold
    frames = encoder.encode(Chunk(1, tensor))
    assert len(frames) == 1  # nothing out of band: the bytes are in the slab
    out = decoder.decode_frames(frames)
    assert torch.equal(out.hidden, tensor)
    assert out.hidden.data_ptr() == np.frombuffer(slab.memory[0], np.uint8).ctypes.data
    slab.memory[0][0:4] = bytes(4)
    assert out.hidden[0].item() == 0.0  # over the slab, not a copy


def test_placement_by_size_inline_frame_slab() -> None:
    slab = FakeSlab()
    encoder, decoder = _codec(slab)
    message = Chunk(
        1,
        torch.ones(255),  # 1020 bytes: inline
        extra=[torch.ones(256), torch.ones(1023), torch.ones(1024, dtype=torch.bfloat16)],
        named={"big": np.ones(1024, np.float32)},  # 4096 bytes: slab
    )
    frames = encoder.encode(message)
    assert [memoryview(f).nbytes for f in frames[1:]] == [1024, 4092, 2048]
    assert slab.filled == [True, False, False, False]
    out = decoder.decode_frames(frames)
    assert torch.equal(out.hidden, message.hidden)
    for got, sent in zip(out.extra, message.extra, strict=True):
        assert torch.equal(got, sent)
    np.testing.assert_array_equal(out.named["big"], message.named["big"])


def test_a_full_slab_falls_back_to_a_frame() -> None:
    slab = FakeSlab()
    slab.refuse = True
    encoder, decoder = _codec(slab)
    tensor = torch.randn(4096)
    frames = encoder.encode(Chunk(1, tensor))
    assert len(frames) == 2
    assert torch.equal(decoder.decode_frames(frames).hidden, tensor)


def test_slab_placement_whose_size_lies_is_refused() -> None:
    slab = FakeSlab()
    slab.filled[0] = True
    decoder: Decoder[Chunk] = Decoder(Chunk, slab_reader=slab)
    desc = TensorDesc(LIB_TORCH, "float32", (4,), slab=SLAB_ID, slot=0, nbytes=8)
    with pytest.raises(ProtocolError, match="slab placement of 8 bytes"):
        decoder.decode(_slab_header(desc))


def test_reader_errors_surface_as_protocol_errors() -> None:
    slab = FakeSlab()
    encoder, decoder = _codec(slab)
    desc = TensorDesc(LIB_TORCH, "float32", (4,), slab=SLAB_ID, slot=3, nbytes=16)
    with pytest.raises(ProtocolError, match="holds no message"):
        decoder.decode(_slab_header(desc))
    assert decoder.decode_frames(encoder.encode(Chunk(2, torch.ones(4096)))).seq == 2


@settings(max_examples=200, deadline=None)
@given(
    slab_id=st.integers(-2, 9),
    slot=st.integers(-2, 5),
    offset=st.integers(-8, 1 << 17),
    nbytes=st.integers(-8, 1 << 17),
    shape=st.lists(st.integers(-1, 1 << 40), max_size=3),
)
def test_lying_slab_descriptors(
    slab_id: int, slot: int, offset: int, nbytes: int, shape: list[int]
) -> None:
    slab = FakeSlab()
    slab.filled[:2] = [True, True]
    encoder, decoder = _codec(slab)
    desc = TensorDesc(
        LIB_TORCH, "float32", tuple(shape), slab=slab_id, slot=slot, offset=offset, nbytes=nbytes
    )
    with contextlib.suppress(ProtocolError):
        decoder.decode(_slab_header(desc))
    assert decoder.decode_frames(encoder.encode(Chunk(3, torch.ones(8)))).seq == 3


def test_slab_slots_lists_every_slab_placed_tensor_without_decoding() -> None:
    slab = FakeSlab()
    encoder, _ = _codec(slab)
    message = Chunk(
        1,
        torch.ones(2048),
        extra=[torch.ones(4), torch.ones(2048)],
        named={"a": np.ones(2048, np.float32)},
    )
    header = encoder.encode(message)[0]
    assert sorted(slab_slots(header)) == [(SLAB_ID, 0), (SLAB_ID, 1), (SLAB_ID, 2)]
    assert slab_slots(Encoder().encode(Chunk(1, torch.ones(4)))[0]) == []


@pytest.mark.parametrize("header", [b"", b"\xc1", b"\x91", b"\xdd\xff\xff\xff\xff"])
def test_slab_slots_of_garbage_is_empty(header: bytes) -> None:
    assert slab_slots(header) == []


def test_slab_slots_of_a_deeply_nested_header_does_not_raise() -> None:
    deep = b"\x91" * 100_000 + b"\xc0"
    with contextlib.suppress(ProtocolError):
        slab_slots(deep)


def test_a_failed_encode_gives_its_slab_slots_back() -> None:
    slab = FakeSlab()
    encoder, _ = _codec(slab)
    buffers: list[memoryview] = []
    message = Chunk(1, torch.ones(2048), extra=[torch.ones(512), torch.empty(4, device="meta")])
    with pytest.raises(TypeError, match="move it to the CPU"):
        encoder.encode_into(message, buffers)
    assert slab.filled == [False] * 4
    assert buffers == []
