"""Audio input for the vLLM thinker: clips, their placeholders, and the talker's rows.

A run of consecutive ``audio`` chunks is one clip, as for tiny-omni's torch thinker. The
torch thinker encodes a clip window by window while it arrives; vLLM's audio encoder
takes a clip whole, so here the samples are buffered and the clip is sent (and
prefilled) when it ends: at the next text, mark or instruction, or the end of input.
The work left when the user stops speaking therefore grows with the clip's length
(the torch thinker's is bounded by one encoder window).

vLLM computes the log-mel with the checkpoint's own feature extractor (Whisper's, whose
floor is the clip's maximum minus 80 dB); tiny-omni's streaming front end floors at the
maximum *so far* (``tiny_omni.log_mel``). The two agree from the clip's loudest frame
on, so they agree everywhere on a clip that is loudest at its start.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omni_actors.actors.engines.qwen3_omni.audio_stream import MIN_SAMPLES
from omni_actors.actors.engines.qwen3_omni.stepping import audio_token_count
from omni_actors.actors.engines.vllm.conversation import Clip, History, VllmInputError
from omni_actors.errors import EngineError

__all__ = ["AudioSpec", "ClipBuffer", "user_rows"]


@dataclass(frozen=True, slots=True)
class AudioSpec:
    """What the checkpoint says about audio input.

    Attributes:
        ids: ``(<|audio_start|>, placeholder, <|audio_end|>)`` token ids.
        rate: the feature extractor's sampling rate (the ``audio`` field's rate).
        hop: its hop length: a clip of ``n`` samples has ``n // hop`` log-mel frames.
        n_window: the audio encoder's ``n_window`` (chunks of ``2 * n_window`` frames).
        accept_layer: the talker's ``accept_hidden_layer``.
    """

    ids: tuple[int, int, int]
    rate: int
    hop: int
    n_window: int
    accept_layer: int

    @classmethod
    def of(
        cls, tokenizer: Any, config: Mapping[str, Any], processor: Mapping[str, Any]
    ) -> AudioSpec:
        """Read it from the tokenizer, ``config.json`` and ``processor_config.json``."""
        names = ("audio_bos_token", "audio_token", "audio_eos_token")
        start, placeholder, end = (
            tokenizer.convert_tokens_to_ids(getattr(tokenizer, n)) for n in names
        )
        features = processor.get("feature_extractor", processor)
        return cls(
            ids=(start, placeholder, end),
            rate=int(features["sampling_rate"]),
            hop=int(features["hop_length"]),
            n_window=int(config["thinker_config"]["audio_config"]["n_window"]),
            accept_layer=int(config["talker_config"]["accept_hidden_layer"]),
        )

    def count(self, samples: int) -> int:
        """Placeholders for a clip of ``samples``: one per audio-encoder output."""
        return audio_token_count(samples // self.hop, self.n_window)


class ClipBuffer:
    """The samples of the clip being received."""

    def __init__(self) -> None:
        self._pieces: list[np.ndarray] = []

    def push(self, audio: object) -> None:
        """Add an ``audio`` field's samples.

        Raises:
            VllmInputError: not a floating-point tensor, or not finite.
        """
        if not isinstance(audio, torch.Tensor) or not audio.is_floating_point():
            raise VllmInputError(
                "'audio' must be a floating-point tensor of mono samples, got "
                f"{audio.dtype if isinstance(audio, torch.Tensor) else type(audio).__name__}"
            )
        samples = audio.detach().to(torch.float32).reshape(-1)
        if not bool(torch.isfinite(samples).all()):
            raise VllmInputError("'audio' holds NaN or infinite samples")
        if samples.numel():
            self._pieces.append(samples.numpy().copy())

    def drop(self) -> None:
        """Forget the clip (a ``clear``)."""
        self._pieces = []

    def take(self, spec: AudioSpec) -> Clip | None:
        """The clip, ended; None if there is none or it is too short to hear."""
        pieces, self._pieces = self._pieces, []
        if not pieces:
            return None
        samples = np.concatenate(pieces)
        if samples.size < MIN_SAMPLES:
            return None
        return Clip(samples, spec.count(samples.size), uuid.uuid4().hex)


def user_rows(
    history: History, turn: range, embeddings: torch.Tensor
) -> dict[str, torch.Tensor | str]:
    """The talker's rows of a committed user turn: input embeddings, and at each clip's
    placeholders the thinker's hidden states there (``user_mask`` True).

    Raises:
        EngineError: a clip of the turn has no states (it was never prefilled).
    """
    rows = embeddings[history.tokens[turn.start : turn.stop]]
    mask = torch.zeros(len(turn), dtype=torch.bool)
    for start, clip in history.clips.items():
        if start in turn:
            if clip.states is None:
                raise EngineError("an audio clip of the turn has no hidden states")
            at = start - turn.start
            rows[at : at + clip.count] = clip.states
            mask[at : at + clip.count] = True
    return {"user": rows, "user_mask": mask}
