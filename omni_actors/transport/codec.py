"""Message codec: msgspec/msgpack header plus out-of-band tensor buffers.

``encode`` turns a message into ``[header, *buffers]``: every tensor in it becomes a
:class:`~omni_actors.protocols.tensors.TensorDesc`; small tensors are copied inline,
larger ones are referenced as a buffer over the tensor's own memory (the link copies
it once into its ZeroMQ frame when it sends, see ``Link.send``), and very large ones on
a same-host link are copied once into a shared-memory slab slot. ``decode`` builds
tensors *over* the received buffers, so nothing is copied on the way out.

Decoding treats its input as hostile: anything malformed raises
:class:`~omni_actors.errors.ProtocolError` and leaves the decoder usable.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import msgspec
import numpy as np
import torch

from omni_actors import ActorRef
from omni_actors.errors import ProtocolError
from omni_actors.protocols.address import ActorAddress
from omni_actors.protocols.tensors import (
    LIB_NUMPY,
    LIB_TORCH,
    MAX_DIMS,
    NUMPY_DTYPES,
    TORCH_DTYPES,
    TORCH_NAMES,
    TensorDesc,
)
from omni_actors.protocols.wire import RefDesc

__all__ = [
    "Decoder",
    "Encoder",
    "SlabReader",
    "SlabWriter",
    "slab_slots",
]

T = TypeVar("T")

_NUMPY_OF_TORCH: dict[torch.dtype, np.dtype[Any]] = {
    dtype: np.dtype(name) for name, dtype in TORCH_DTYPES.items() if name != "bfloat16"
}


class SlabWriter(Protocol):
    """Sender side of a shared-memory slab (see ``omni_actors.transport.shm``)."""

    def put(self, data: memoryview) -> tuple[int, int, int] | None:
        """Copy ``data`` into a free slot: ``(slab, slot, offset)``, or None if none fits."""

    def cancel(self, slot: int) -> None:
        """Free a slot filled by ``put`` whose message will never be sent."""


class SlabReader(Protocol):
    """Receiver side: memory of a slot, released when the last view over it is dropped."""

    def view(self, slab: int, slot: int, offset: int, nbytes: int) -> memoryview:
        """A writable view of ``nbytes`` at ``offset`` in ``slot`` of ``slab``."""


def _torch_bytes(tensor: torch.Tensor) -> memoryview:
    try:
        # The common tensor (CPU, no grad, no conj/neg bit, a numpy dtype) converts as
        # is: one call. numpy() refuses every other kind, which the checks below handle.
        array = tensor.numpy()
    except (TypeError, RuntimeError):
        return _torch_bytes_converted(tensor)
    return array.reshape(-1).view(np.uint8).data  # reshape copies a strided one, once


def _torch_bytes_converted(tensor: torch.Tensor) -> memoryview:
    if tensor.device.type != "cpu":
        raise TypeError(
            f"cannot send a tensor on {tensor.device}: move it to the CPU first "
            "(device transfers are done by the stage, on its own stream)"
        )
    # Each torch call costs microseconds: only pay for the conversions a tensor needs.
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.is_conj() or tensor.is_neg():
        tensor = tensor.resolve_conj().resolve_neg()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()  # the one copy a strided tensor needs
    if tensor.dtype is torch.bfloat16:
        tensor = tensor.view(torch.int16)  # numpy has no bfloat16; the bytes are the same
    # numpy views cost a fraction of torch ops, and this runs for every tensor sent.
    return tensor.numpy().reshape(-1).view(np.uint8).data


class Encoder:
    """Encodes messages; one instance per sending link (it is not thread-safe).

    Args:
        inline_threshold: tensors smaller than this (bytes) are copied into the header.
        slab_writer: shared-memory slab for tensors of at least ``slab_threshold`` bytes.
        slab_threshold: see ``slab_writer``.
    """

    def __init__(
        self,
        inline_threshold: int = 64 * 1024,
        slab_writer: SlabWriter | None = None,
        slab_threshold: int = 1 << 20,
        ref_hook: Callable[[ActorRef[Any]], RefDesc] | None = None,
    ) -> None:
        self.inline_threshold = inline_threshold
        self.ref_hook = ref_hook
        self.slab_writer = slab_writer
        self.slab_threshold = slab_threshold
        self._buffers: list[Any] | None = None
        self._placed: list[int] = []
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)

    def encode_into(self, message: Any, buffers: list[Any]) -> bytes:
        """Encode ``message``; its out-of-band buffers are appended to ``buffers``.

        If encoding fails, ``buffers`` is left as it was and the slab slots taken so far
        are given back: the message will never be sent, so nobody else would free them.
        """
        self._buffers = buffers
        start = len(buffers)
        placed = self._placed
        placed.clear()
        try:
            return self._encoder.encode(message)
        except BaseException:
            del buffers[start:]
            if self.slab_writer is not None:
                for slot in placed:
                    self.slab_writer.cancel(slot)
            raise
        finally:
            self._buffers = None
            placed.clear()

    def encode(self, message: Any) -> list[Any]:
        """``[header, *buffers]`` for ``message``."""
        buffers: list[Any] = []
        header = self.encode_into(message, buffers)
        return [header, *buffers]

    def _enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            dtype = TORCH_NAMES.get(obj.dtype)
            if dtype is None:
                raise TypeError(f"tensor dtype {obj.dtype} cannot be sent")
            if obj.nbytes < self.inline_threshold:
                # Most tensors of a stream (token ids, a hidden row, a codec frame) are
                # small: their bytes go inline, in two calls where the general path
                # takes five.
                try:
                    data = obj.numpy().tobytes()
                except (TypeError, RuntimeError):  # see _torch_bytes
                    data = _torch_bytes(obj).tobytes()
                return TensorDesc(LIB_TORCH, dtype, tuple(obj.shape), data=data)
            return self._place(LIB_TORCH, dtype, tuple(obj.shape), _torch_bytes(obj))
        if isinstance(obj, np.ndarray):
            if obj.dtype.name not in NUMPY_DTYPES or obj.dtype.byteorder == ">":
                raise TypeError(f"numpy dtype {obj.dtype} cannot be sent")
            array = np.ascontiguousarray(obj)
            return self._place(
                LIB_NUMPY, obj.dtype.name, obj.shape, array.reshape(-1).view(np.uint8).data
            )
        if isinstance(obj, ActorRef):
            if self.ref_hook is None:
                raise TypeError("actor refs can only be sent between nodes")
            return self.ref_hook(obj)
        raise NotImplementedError(f"cannot encode {type(obj).__qualname__}")

    def _place(self, lib: int, dtype: str, shape: tuple[int, ...], data: memoryview) -> TensorDesc:
        nbytes = data.nbytes
        if nbytes < self.inline_threshold:
            return TensorDesc(lib, dtype, shape, data=data.tobytes())
        if self.slab_writer is not None and nbytes >= self.slab_threshold:
            placed = self.slab_writer.put(data)
            if placed is not None:
                slab, slot, offset = placed
                self._placed.append(slot)
                return TensorDesc(
                    lib, dtype, shape, slab=slab, slot=slot, offset=offset, nbytes=nbytes
                )
        buffers = self._buffers
        assert buffers is not None
        buffers.append(data)
        return TensorDesc(lib, dtype, shape, buffer=len(buffers) - 1)


class Decoder(Generic[T]):
    """Decodes messages of one type (a struct, a tagged union, or ``Any``).

    Args:
        type_: what the header must decode to.
        slab_reader: maps slab placements; without it they are a ``ProtocolError``.
        max_buffers: most out-of-band buffers one message may carry.
        max_header_bytes: largest header accepted.
    """

    def __init__(
        self,
        type_: Any,
        *,
        slab_reader: SlabReader | None = None,
        max_buffers: int = 1024,
        max_header_bytes: int = 16 << 20,
        ref_hook: Callable[[RefDesc], ActorRef[Any]] | None = None,
    ) -> None:
        self.type = type_
        self.ref_hook = ref_hook
        self.slab_reader = slab_reader
        self.max_buffers = max_buffers
        self.max_header_bytes = max_header_bytes
        self._decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(
            type_, dec_hook=self._dec_hook
        )
        self._buffers: Sequence[Any] = ()
        self._used: set[int] = set()

    def decode(self, header: Any, buffers: Sequence[Any] = ()) -> T:
        """Decode ``header``, building tensors over ``buffers`` (no copy).

        Raises:
            ProtocolError: the bytes are not a valid message of this decoder's type.
        """
        if len(buffers) > self.max_buffers:
            raise ProtocolError(f"{len(buffers)} buffers exceed the limit of {self.max_buffers}")
        try:
            size = memoryview(header).nbytes
        except TypeError:
            raise ProtocolError(f"header must be bytes-like, got {type(header).__name__}") from None
        if size > self.max_header_bytes:
            raise ProtocolError(f"header of {size} bytes exceeds {self.max_header_bytes}")
        self._buffers = [getattr(b, "buffer", b) for b in buffers]  # zmq.Frame -> memoryview
        self._used = set()
        try:
            message: T = self._decoder.decode(header)
        except ProtocolError:
            raise
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            cause = exc.__cause__
            if isinstance(cause, ProtocolError):
                raise ProtocolError(f"{cause} ({exc})") from None
            raise ProtocolError(f"malformed message: {exc}") from None
        except (ValueError, TypeError, OverflowError, RuntimeError, MemoryError) as exc:
            raise ProtocolError(f"malformed message: {exc}") from None
        finally:
            buffers_count = len(self._buffers)
            used = len(self._used)
            self._buffers = ()
        if used != buffers_count:
            raise ProtocolError(f"message references {used} of its {buffers_count} buffers")
        return message

    def decode_frames(self, frames: Sequence[Any]) -> T:
        """Decode ``[header, *buffers]`` as received from ZeroMQ."""
        if not frames:
            raise ProtocolError("empty frame list")
        first = getattr(frames[0], "buffer", frames[0])
        return self.decode(first, frames[1:])

    def _dec_hook(self, type_: Any, obj: Any) -> Any:
        if type_ is torch.Tensor:
            tensor = _inline_tensor(obj)
            if tensor is not None:
                return tensor
        if type_ is torch.Tensor or type_ is np.ndarray:
            try:
                desc = msgspec.convert(obj, TensorDesc)
            except msgspec.ValidationError as exc:
                raise ProtocolError(f"bad tensor descriptor: {exc}") from None
            return self._tensor(desc, want=LIB_TORCH if type_ is torch.Tensor else LIB_NUMPY)
        origin = typing.get_origin(type_) or type_
        if isinstance(origin, type) and issubclass(origin, ActorAddress):  # ActorRef too
            if self.ref_hook is None:
                raise ProtocolError("an actor ref arrived where refs cannot be resolved")
            try:
                ref_desc = msgspec.convert(obj, RefDesc)
            except msgspec.ValidationError as exc:
                raise ProtocolError(f"bad actor ref: {exc}") from None
            return self.ref_hook(ref_desc)
        raise NotImplementedError(f"cannot decode {type_!r}")

    def _tensor(self, desc: TensorDesc, want: int) -> Any:
        if desc.lib != want:
            raise ProtocolError("tensor library does not match the field type")
        table: dict[str, Any] = TORCH_DTYPES if want == LIB_TORCH else NUMPY_DTYPES
        dtype = table.get(desc.dtype)
        if dtype is None:
            raise ProtocolError(f"unknown dtype {desc.dtype!r}")
        shape = desc.shape
        if len(shape) > MAX_DIMS or any(d < 0 for d in shape):
            raise ProtocolError(f"invalid shape {shape}")
        itemsize = dtype.itemsize
        nbytes = math.prod(shape) * itemsize
        data = self._bytes_of(desc, nbytes)
        if data.nbytes != nbytes:
            raise ProtocolError(
                f"shape {shape} of {desc.dtype} needs {nbytes} bytes, got {data.nbytes}"
            )
        if want == LIB_NUMPY:
            return np.frombuffer(data, dtype=dtype).reshape(shape)
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        if dtype is torch.bfloat16:
            return torch.from_numpy(np.frombuffer(data, np.int16).reshape(shape)).view(dtype)
        # from_numpy keeps the array (and so the frame or slab slot) alive, no copy.
        return torch.from_numpy(np.frombuffer(data, _NUMPY_OF_TORCH[dtype]).reshape(shape))

    def _bytes_of(self, desc: TensorDesc, nbytes: int) -> memoryview:
        placements = (desc.data is not None) + (desc.buffer >= 0) + (desc.slab >= 0)
        if placements != 1:
            raise ProtocolError("a tensor needs exactly one placement")
        if desc.data is not None:
            # Inline bytes belong to the header; copy (they are small) to get writable memory.
            return memoryview(bytearray(desc.data))
        if desc.buffer >= 0:
            index = desc.buffer
            if index >= len(self._buffers):
                raise ProtocolError(f"buffer {index} missing: the message has {len(self._buffers)}")
            if index in self._used:
                raise ProtocolError(f"buffer {index} referenced twice")
            self._used.add(index)
            view = memoryview(self._buffers[index]).cast("B")
            # Tensors are always writable; over read-only memory (plain ``bytes``, not a
            # ZeroMQ frame) that would be unsafe, so those few get a private copy.
            return memoryview(bytearray(view)) if view.readonly else view
        if self.slab_reader is None:
            raise ProtocolError("shared-memory placement on a link without a slab")
        if desc.nbytes != nbytes:
            raise ProtocolError(f"slab placement of {desc.nbytes} bytes, tensor needs {nbytes}")
        return self.slab_reader.view(desc.slab, desc.slot, desc.offset, desc.nbytes)


_DESC_FIELDS = len(TensorDesc.__struct_fields__) + 1  # array-like, led by its tag
_DESC_SLAB = 1 + TensorDesc.__struct_fields__.index("slab")
_INLINE_NUMPY = {name: np.dtype(name) for name in TORCH_DTYPES if name != "bfloat16"}


def _inline_tensor(obj: Any) -> torch.Tensor | None:
    """The torch tensor of a well-formed, non-empty inline descriptor; None for any
    other, which then takes the general path and its checks and errors.

    Most tensors of a stream are small and inline, and ``msgspec.convert`` plus the
    general checks cost about as much as building the tensor: this reads the
    descriptor's fields in place and accepts only exactly what the general path would
    accept for them (exact types, one placement, the byte count its shape needs).
    """
    if type(obj) is not list or len(obj) != _DESC_FIELDS:
        return None
    tag, lib, name, shape, data, buffer, slab, slot, offset, nbytes = obj
    if (
        tag != "T"
        or type(lib) is not int
        or lib != LIB_TORCH
        or type(data) is not bytes
        or type(name) is not str
        or type(shape) is not list
        or len(shape) > MAX_DIMS
        or type(buffer) is not int
        or buffer >= 0
        or type(slab) is not int
        or slab >= 0
        or type(slot) is not int
        or type(offset) is not int
        or type(nbytes) is not int
    ):
        return None
    dtype = _INLINE_NUMPY.get(name)
    if dtype is None:
        return None
    count = 1
    for d in shape:
        if type(d) is not int or d < 0:
            return None
        count *= d
    if count == 0 or count * dtype.itemsize != len(data):
        return None
    # A private, writable copy of the header's bytes, as the general path makes.
    return torch.from_numpy(np.frombuffer(bytearray(data), dtype).reshape(shape))


def slab_slots(header: Any) -> list[tuple[int, int]]:
    """``(slab, slot)`` of every slab-placed tensor in an encoded message, undecoded.

    For messages that are dropped without being decoded: their slots must still be
    given back to the sender.
    """
    try:
        stack: list[Any] = [msgspec.msgpack.decode(header)]
    except (msgspec.DecodeError, TypeError, RecursionError):
        # Not our encoding (hostile or corrupt): it holds no slot we handed out.
        return []
    found = []
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            if len(item) == _DESC_FIELDS and item[0] == "T":
                slab, slot = item[_DESC_SLAB], item[_DESC_SLAB + 1]
                if isinstance(slab, int) and isinstance(slot, int) and slab >= 0:
                    found.append((slab, slot))
            else:
                stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return found
