"""Audio samples as callers hand them over: torch tensors, numpy arrays, PCM16 bytes.

A voice app's audio comes from many places: a torch model hands tensors, a numpy
pipeline arrays, a microphone or a websocket raw little-endian PCM16 bytes.
``Session.send`` takes each as it comes and makes it a tensor here, once, so what
follows (the send's checks, the resampler, the chunk on the wire) sees tensors only.
Arrays and bytes are copied: the caller may reuse its buffer (a microphone's ring
buffer) as soon as ``send`` returns, while the chunk may still wait for a credit.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import torch

from omni_actors.errors import InvalidRequestError

__all__ = ["AudioInput", "audio_tensor", "pcm16_tensor"]

AudioInput: TypeAlias = torch.Tensor | npt.NDArray[Any] | bytes | bytearray | memoryview
"""What ``Session.send(audio=...)`` takes: a tensor or numpy array of float or int16
samples, or PCM16 bytes (little-endian, mono)."""

_ARRAY_DTYPES = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int16))


def audio_tensor(audio: object) -> torch.Tensor:
    """``audio`` as a tensor of the samples the caller sent (float or int16, unscaled).

    A tensor is returned as it is. A numpy array of float16/32/64 or int16 samples
    becomes a tensor of its own (native byte order). Bytes, a bytearray or a
    memoryview are PCM16 (:func:`pcm16_tensor`). The shape and the samples' values
    are checked later, with a tensor's (``CallerAudio.take``).

    Raises:
        InvalidRequestError: a type or numpy dtype not listed above, or bytes that
            are not whole PCM16 samples.
    """
    if isinstance(audio, torch.Tensor):
        return audio
    if isinstance(audio, np.ndarray):
        native = audio.dtype.newbyteorder("=")
        if native not in _ARRAY_DTYPES:
            raise InvalidRequestError(
                f"audio must be float or int16 samples, not a numpy array of {audio.dtype}"
            )
        return torch.from_numpy(np.array(audio, dtype=native, order="C"))  # a copy
    if isinstance(audio, bytes | bytearray | memoryview):
        return pcm16_tensor(audio)
    raise InvalidRequestError(
        f"audio must be a torch.Tensor, a numpy array or PCM16 bytes, not {type(audio).__name__}"
    )


def pcm16_tensor(data: bytes | bytearray | memoryview) -> torch.Tensor:
    """16-bit little-endian PCM bytes as a 1-D int16 tensor (a copy, native byte order).

    Raises:
        InvalidRequestError: an odd number of bytes (not whole samples), or a
            memoryview that is not contiguous.
    """
    view = memoryview(data)
    if not view.c_contiguous:
        raise InvalidRequestError("PCM16 audio must be contiguous bytes; send bytes(view)")
    if view.nbytes % 2:
        raise InvalidRequestError(
            f"PCM16 audio has 2 bytes per sample; {view.nbytes} bytes are not whole "
            "samples: send an even number of bytes"
        )
    # astype copies into native byte order: a writable array torch can own.
    samples = np.frombuffer(view.cast("B"), dtype="<i2").astype(np.int16)
    return torch.from_numpy(samples)
