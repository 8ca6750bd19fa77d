"""Codec round trips, placement, zero copy, and typed errors on hostile input."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest
import torch
import zmq

from omni_actors.errors import ProtocolError
from omni_actors.protocols.tensors import LIB_TORCH, TensorDesc
from omni_actors.transport.codec import Decoder, Encoder


class Chunk(msgspec.Struct, tag=True, frozen=True):
    seq: int
    hidden: torch.Tensor
    codes: torch.Tensor | None = None
    extra: list[torch.Tensor] = []
    named: dict[str, np.ndarray] = {}


class Other(msgspec.Struct, tag=True, frozen=True):
    text: str


TORCH_DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
]


def _sample(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype)
    return (torch.randn(shape) * 50).to(dtype)


def _round_trip(message: Any, decoder: Decoder[Any], encoder: Encoder | None = None) -> Any:
    frames = (encoder or Encoder()).encode(message)
    return decoder.decode(frames[0], frames[1:])


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (7,), (64, 300)])
def test_every_torch_dtype_round_trips(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    tensor = _sample(dtype, shape)
    out = _round_trip(Chunk(1, tensor), Decoder(Chunk))
    assert out.hidden.dtype == dtype
    assert out.hidden.shape == tensor.shape
    assert torch.equal(out.hidden, tensor)


@pytest.mark.parametrize(
    "dtype", ["float16", "float32", "float64", "int8", "uint16", "int64", "bool", "complex128"]
)
def test_numpy_arrays_round_trip(dtype: str) -> None:
    array = (np.arange(40_000) % 7).astype(dtype).reshape(200, 200)
    out = _round_trip(Chunk(1, torch.zeros(1), named={"a": array}), Decoder(Chunk))
    assert out.named["a"].dtype == array.dtype
    np.testing.assert_array_equal(out.named["a"], array)


def test_nested_optional_and_non_contiguous_tensors() -> None:
    base = torch.randn(300, 400)
    message = Chunk(2, base.t(), codes=torch.arange(16), extra=[base[::2], torch.ones(3)], named={})
    out = _round_trip(message, Decoder(Chunk))
    assert torch.equal(out.hidden, base.t())
    assert torch.equal(out.codes, torch.arange(16))
    assert torch.equal(out.extra[0], base[::2])
    assert out.hidden.is_contiguous()


def _views() -> dict[str, torch.Tensor]:
    """Tensors ``numpy()`` refuses or strides, each as the values it holds."""
    complex_ = torch.randn(6, 5, dtype=torch.complex64)
    return {
        "grad": torch.randn(6, 5, requires_grad=True),
        "conj": complex_.conj(),
        "neg": complex_.conj().imag,
        "strided": torch.randn(5, 6).t(),
        "bfloat16": torch.randn(6, 5).to(torch.bfloat16).t(),
    }


@pytest.mark.parametrize("name", list(_views()))
@pytest.mark.parametrize("inline", [True, False], ids=["inline", "buffer"])
def test_views_grads_and_conjugates_send_their_values(name: str, inline: bool) -> None:
    tensor = _views()[name]
    encoder = Encoder(inline_threshold=1 << 20 if inline else 1)
    frames = encoder.encode(Chunk(1, tensor))
    assert len(frames) == (1 if inline else 2)
    out = Decoder(Chunk).decode(frames[0], frames[1:]).hidden
    assert out.dtype == tensor.dtype
    assert torch.equal(out, tensor.detach().resolve_conj().resolve_neg())


def test_tagged_union_decodes_each_member() -> None:
    decoder: Decoder[Chunk | Other] = Decoder(Chunk | Other)
    assert _round_trip(Other("hi"), decoder) == Other("hi")
    assert isinstance(_round_trip(Chunk(1, torch.ones(2)), decoder), Chunk)


def test_small_tensors_go_inline_large_ones_out_of_band() -> None:
    encoder = Encoder(inline_threshold=1024)
    assert len(encoder.encode(Chunk(1, torch.zeros(255)))) == 1  # 1020 bytes: inline
    frames = encoder.encode(Chunk(1, torch.zeros(256)))  # 1024 bytes: a frame
    assert len(frames) == 2
    assert frames[1].nbytes == 1024


def test_out_of_band_buffers_are_the_tensors_own_memory() -> None:
    tensor = torch.randn(100_000)
    frames = Encoder().encode(Chunk(1, tensor))
    assert np.frombuffer(frames[1], np.uint8).ctypes.data == tensor.data_ptr()


def test_decoded_tensor_is_built_over_the_received_buffer() -> None:
    frames = Encoder().encode(Chunk(1, torch.randn(100_000)))
    received = bytearray(frames[1])
    out = Decoder(Chunk).decode(frames[0], [memoryview(received)])
    assert out.hidden.data_ptr() == np.frombuffer(received, np.uint8).ctypes.data
    received[0:4] = bytes(4)
    assert out.hidden[0].item() == 0.0  # same memory, not a copy


def test_zero_copy_over_a_real_zmq_frame() -> None:
    ctx = zmq.Context()
    tx, rx = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        tx.bind("inproc://codec")
        rx.connect("inproc://codec")
        tensor = torch.randn(256, 1024)
        tx.send_multipart(Encoder().encode(Chunk(5, tensor)), copy=False)
        frames = rx.recv_multipart(copy=False)
        out = Decoder(Chunk).decode_frames(frames)
        assert torch.equal(out.hidden, tensor)
        frame_address = np.frombuffer(frames[1].buffer, np.uint8).ctypes.data
        assert out.hidden.data_ptr() == frame_address
    finally:
        tx.close(0)
        rx.close(0)
        ctx.term()


def test_device_tensors_are_refused_with_a_clear_message() -> None:
    meta = torch.empty(4, device="meta")
    with pytest.raises(TypeError, match="move it to the CPU"):
        Encoder().encode(Chunk(1, meta))


def _desc_message(desc: TensorDesc) -> bytes:
    return msgspec.msgpack.encode({"type": "Chunk", "seq": 1, "hidden": desc})


@pytest.mark.parametrize(
    ("desc", "buffers", "error"),
    [
        (TensorDesc(LIB_TORCH, "float32", (4,), buffer=0), [], "missing"),
        (TensorDesc(LIB_TORCH, "float32", (4,), buffer=0), [b"x" * 15], "needs 16 bytes"),
        (TensorDesc(LIB_TORCH, "float32", (4,), buffer=0), [b"x" * 16, b"y"], "references 1"),
        (TensorDesc(LIB_TORCH, "evil", (4,), buffer=0), [b"x" * 16], "unknown dtype"),
        (TensorDesc(LIB_TORCH, "float32", (-1,), buffer=0), [b"x" * 16], "invalid shape"),
        (TensorDesc(LIB_TORCH, "float32", (1 << 40, 1 << 40), data=b""), [], "needs"),
        (TensorDesc(LIB_TORCH, "float32", (4,)), [], "exactly one placement"),
        (TensorDesc(LIB_TORCH, "float32", (4,), slab=0, slot=0, nbytes=16), [], "slab"),
        (TensorDesc(1, "float32", (4,), data=b"x" * 16), [], "library"),
    ],
)
def test_lying_descriptors_raise_protocol_error(
    desc: TensorDesc, buffers: list[bytes], error: str
) -> None:
    decoder = Decoder(Chunk)
    with pytest.raises(ProtocolError, match=error):
        decoder.decode(_desc_message(desc), buffers)
    assert _round_trip(Chunk(1, torch.ones(2)), decoder).seq == 1  # still usable


def test_buffer_referenced_twice_is_refused() -> None:
    desc = TensorDesc(LIB_TORCH, "float32", (4,), buffer=0)
    header = msgspec.msgpack.encode({"type": "Chunk", "seq": 1, "hidden": desc, "extra": [desc]})
    with pytest.raises(ProtocolError, match="twice"):
        Decoder(Chunk).decode(header, [b"x" * 16])


def test_limits_on_header_and_buffer_count() -> None:
    decoder = Decoder(Chunk, max_buffers=2, max_header_bytes=64)
    with pytest.raises(ProtocolError, match="exceed"):
        decoder.decode(b"\x80", [b"", b"", b""])
    with pytest.raises(ProtocolError, match="exceeds"):
        decoder.decode(b"\x80" * 65)
    with pytest.raises(ProtocolError, match="bytes-like"):
        decoder.decode(12)
    with pytest.raises(ProtocolError, match="empty"):
        decoder.decode_frames([])
