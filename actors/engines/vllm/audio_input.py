"""Audio input for the vLLM thinker: clips cut into windows, their items, the talker's rows.

A run of consecutive ``audio`` chunks is one clip, as for tiny-omni's torch thinker, and
it is heard as it arrives, as there: the audio encoder attends only within windows of
``n_window_infer`` log-mel frames (8 s on Qwen3-Omni and tiny-omni), so a window's
encoder outputs are final once its last frame is (``qwen3_omni.audio_stream``). Each
time a whole window's samples are in, :class:`ClipStream` hands the window over and the
engine sends it to vLLM at once, as an audio item of its own, prefilled (and its hidden
states taken) while the user goes on speaking. When the clip ends (the next text, mark
or instruction, or the end of input) only its last, partial window is left to send, so
the work left when the user stops speaking is bounded by one window, whatever the
clip's length.

**Each window is framed on its own.** In the token list a clip of several windows is a
run of window clips, each ``<|audio_start|>``, its placeholders, ``<|audio_end|>``; the
torch thinker frames a whole clip once. vLLM's Qwen3-Omni positions
(``get_mrope_input_positions``) assume that every audio item is followed by exactly one
token, its ``<|audio_end|>``: two items back to back inside one framing make it fail
the request ("Position ids length mismatch"). A clip of one window or less is framed as
the torch thinker frames it; a longer one holds two more tokens per further window, and
the states from its second window on see those tokens (the encoder outputs themselves
are the same: the encoder attends within windows). The last partial window is encoded
alone, where the torch thinker encodes a partial window shorter than one encoder chunk
behind the window before it: the two differ by the encoder's padding only (about 1e-6).

**Features are ours.** Each item is sent as log-mel features (vLLM's
``input_audio_features`` items, which need ``enable_mm_embeds``), computed by the
streaming front end the torch thinker uses (``qwen3_omni.log_mel``: exact across window
edges, floored at the maximum so far). So both thinkers see the same features; vLLM's
own front end would compute each window alone, with its own floor and reflect padding
at the window's edges.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from omni_actors.actors.engines.qwen3_omni.audio_stream import MIN_SAMPLES, MelWindows
from omni_actors.actors.engines.qwen3_omni.hf import WhisperFeatureExtractor
from omni_actors.actors.engines.qwen3_omni.log_mel import LogMel
from omni_actors.actors.engines.qwen3_omni.stepping import audio_token_count
from omni_actors.actors.engines.vllm.conversation import Clip, History, VllmInputError
from omni_actors.errors import EngineError

__all__ = ["AudioSpec", "ClipStream", "audio_items", "user_rows"]


@dataclass(frozen=True, slots=True)
class AudioSpec:
    """What the checkpoint says about audio input.

    Attributes:
        ids: ``(<|audio_start|>, placeholder, <|audio_end|>)`` token ids.
        rate: the feature extractor's sampling rate (the ``audio`` field's rate).
        n_window: the audio encoder's ``n_window`` (chunks of ``2 * n_window`` frames).
        n_window_infer: its attention window in log-mel frames.
        accept_layer: the talker's ``accept_hidden_layer``.
        features: the feature extractor's settings (``processor_config.json``).
    """

    ids: tuple[int, int, int]
    rate: int
    n_window: int
    n_window_infer: int
    accept_layer: int
    features: Mapping[str, Any]

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
        audio = config["thinker_config"]["audio_config"]
        return cls(
            ids=(start, placeholder, end),
            rate=int(features["sampling_rate"]),
            n_window=int(audio["n_window"]),
            n_window_infer=int(audio["n_window_infer"]),
            accept_layer=int(config["talker_config"]["accept_hidden_layer"]),
            features=dict(features),
        )

    def extractor(self) -> WhisperFeatureExtractor:
        """The Whisper front end whose parameters the log-mel is computed with."""
        f = self.features
        return WhisperFeatureExtractor(  # type: ignore[no-untyped-call]
            feature_size=int(f["feature_size"]),
            sampling_rate=int(f["sampling_rate"]),
            hop_length=int(f["hop_length"]),
            chunk_length=int(f.get("chunk_length", 30)),
            n_fft=int(f["n_fft"]),
        )

    def count(self, frames: int) -> int:
        """Placeholders for ``frames`` log-mel frames: one per audio-encoder output."""
        return audio_token_count(frames, self.n_window)


class ClipStream:
    """The clip being received, handed over window by window (see the module docstring).

    Args:
        spec: the checkpoint's audio settings.
        extractor: its Whisper front end (:meth:`AudioSpec.extractor`), shared by clips.
    """

    def __init__(self, spec: AudioSpec, extractor: WhisperFeatureExtractor) -> None:
        self._spec = spec
        self._extractor = extractor
        self._windows: MelWindows | None = None
        self._sent = 0
        """Windows of the clip handed over so far."""

    def push(self, audio: object) -> list[Clip]:
        """Add an ``audio`` field's samples; the windows they made whole (often none).

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
        if not samples.numel():
            return []
        if self._windows is None:
            spec = self._spec
            mel = LogMel(self._extractor, block=2 * spec.n_window)
            self._windows = MelWindows(mel, spec.n_window, spec.n_window_infer)
        self._windows.push(samples.cpu().numpy())
        return self._clips(self._windows.whole()) if self._windows.ready() else []

    def end(self) -> list[Clip]:
        """End the clip: its windows not handed over yet, the last partial one included
        (none if there are none, or the clip is too short to hear)."""
        windows, sent, self._windows, self._sent = self._windows, self._sent, None, 0
        if windows is None or (sent == 0 and windows.samples < MIN_SAMPLES):
            return []
        mels = windows.whole()
        tail = windows.rest()
        return self._clips([*mels, *([] if tail is None else [tail])])

    def drop(self) -> None:
        """Forget the clip (a ``clear``, or the end of a response): the windows handed
        over already are the token list's to keep or cut."""
        self._windows, self._sent = None, 0

    def _clips(self, mels: list[torch.Tensor]) -> list[Clip]:
        self._sent += len(mels)
        return [Clip(mel, self._spec.count(mel.shape[1]), uuid.uuid4().hex) for mel in mels]


def audio_items(clips: Sequence[Clip]) -> dict[str, torch.Tensor]:
    """vLLM's audio items of ``clips``, in order: their log-mel features.

    The form vLLM's Qwen3-Omni parser takes precomputed features in: features of all
    items side by side, each item's length, and an attention mask (required by its
    input schema, unused by the encoder).
    """
    lengths = [clip.features.shape[1] for clip in clips]
    mask = torch.zeros(len(clips), max(lengths, default=0), dtype=torch.bool)
    for i, length in enumerate(lengths):
        mask[i, :length] = True
    return {
        "input_audio_features": torch.cat([clip.features for clip in clips], dim=1),
        "audio_feature_lengths": torch.tensor(lengths, dtype=torch.long),
        "feature_attention_mask": mask,
    }


def user_rows(history: History, turn: range, embeddings: torch.Tensor) -> dict[str, torch.Tensor]:
    """The talker's rows of a user turn's positions ``turn`` (all of a committed turn,
    or part of an open one whose clips there have their states): input embeddings, and
    at each clip's placeholders the thinker's hidden states there (``user_mask`` True).

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
