"""Step-by-step forwards of the Qwen3-Omni stages, as a streaming engine drives them.

Hugging Face only ships ``generate`` loops that run each stage to completion; a streaming
pipeline instead advances the thinker one token, the talker one codec frame and code2wav
one chunk at a time. These functions are those single steps, written against the real
``transformers`` classes and checked (``tests/integration/test_tiny_omni_models.py``) to
reproduce ``Qwen3OmniMoeForConditionalGeneration.generate`` exactly. They hold no state:
the caller owns each session's ``DynamicCache`` and position counter.

Positions are always passed explicitly. The HF forwards otherwise derive them from
``rope_deltas`` stored on the *model*, which is shared by every session an engine serves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from omni_actors.actors.engines.qwen3_omni.hf import (
    DynamicCache,
    Qwen3OmniMoeCode2Wav,
    Qwen3OmniMoeTalkerForConditionalGeneration,
    Qwen3OmniMoeThinkerForConditionalGeneration,
)

__all__ = [
    "ThinkerStep",
    "audio_token_count",
    "code_predictor_frame",
    "decode_window",
    "encode_audio",
    "greedy",
    "mask_codec_logits",
    "talker_assistant_prefix",
    "talker_forward",
    "talker_user_part",
    "thinker_forward",
]

Pick = Callable[[torch.Tensor], torch.Tensor]
"""Chooses token ids [B, 1] from logits [B, V] (greedy, or a sampler)."""


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Argmax over the last dim, keeping it: [B, V] -> [B, 1]."""
    return logits.argmax(dim=-1, keepdim=True)


class ThinkerStep(NamedTuple):
    """What one thinker forward yields for the positions it consumed."""

    logits: torch.Tensor
    """[B, L, vocab]; the next token comes from ``logits[:, -1]``."""
    embeds: torch.Tensor
    """[B, L, H] input embeddings (audio features merged in): the talker's text input."""
    accept_hidden: torch.Tensor
    """[B, L, H] hidden state at ``talker_config.accept_hidden_layer``: the talker's input
    for audio/image/video placeholder positions of the user turn."""


def audio_token_count(mel_frames: int, n_window: int) -> int:
    """How many AUDIO_PAD placeholders a clip of ``mel_frames`` log-mel frames fills.

    The audio encoder cuts the mel into chunks of ``2 * n_window`` frames and runs each
    through three stride-2 convolutions (kernel 3, padding 1), each rounding up, so a
    chunk of ``n`` frames yields ``ceil(n / 8)`` embeddings. The prompt needs exactly one
    placeholder per embedding. transformers computes this with a private function whose
    name and signature are not part of its API, so the arithmetic is ours, checked against
    the encoder's real output (``tests/integration/test_tiny_omni_models.py``).
    """
    if mel_frames < 0 or n_window < 1:
        raise ValueError(f"need mel_frames >= 0 and n_window >= 1, got {mel_frames}, {n_window}")
    chunk = 2 * n_window
    full, rest = divmod(mel_frames, chunk)
    return full * -(-chunk // 8) + -(-rest // 8)


@torch.no_grad()
def encode_audio(
    thinker: Qwen3OmniMoeThinkerForConditionalGeneration, mel: torch.Tensor
) -> torch.Tensor:
    """The audio encoder's embeddings [tokens, H] for one log-mel [n_mels, frames].

    The call HF's thinker forward makes for a clip (``get_audio_features``), so pieces
    encoded here and spliced with ``audio_embeds`` reproduce the one-shot forward.
    """
    mel = mel.to(thinker.device)  # computed on the host
    mask = torch.ones(1, mel.shape[1], dtype=torch.long, device=mel.device)
    out = thinker.get_audio_features(mel[None], feature_attention_mask=mask)
    # A model output from 5.x on; a bare tensor in releases that returned one.
    hidden = out if isinstance(out, torch.Tensor) else out.last_hidden_state
    assert isinstance(hidden, torch.Tensor)
    return hidden


@torch.no_grad()
def thinker_forward(
    thinker: Qwen3OmniMoeThinkerForConditionalGeneration,
    input_ids: torch.Tensor,
    cache: DynamicCache,
    start: int,
    *,
    accept_layer: int,
    input_features: torch.Tensor | None = None,
    feature_attention_mask: torch.Tensor | None = None,
    audio_embeds: torch.Tensor | None = None,
) -> ThinkerStep:
    """Run the thinker over ``input_ids`` [B, L] at positions ``start .. start+L-1``.

    Prefill passes the whole prompt (with ``input_features`` [B, 128, frames] and
    ``feature_attention_mask`` [B, frames] when it holds AUDIO_PAD placeholders); decode
    passes the last sampled token with ``start`` = tokens already in ``cache``. Text and
    audio use plain sequential positions (HF's 3-D rope only departs from them for
    image/video grids).

    A streaming prefill passes ``audio_embeds`` [n, H] instead of features: the audio
    encoder's output (:func:`encode_audio`) for the ``n`` AUDIO_PAD positions of
    ``input_ids``, in order, spliced in as HF splices the encoder's output for a clip.
    """
    batch, length = input_ids.shape
    positions = torch.arange(start, start + length).expand(batch, length)
    ids: torch.Tensor | None = input_ids
    embeds: torch.Tensor | None = None
    if audio_embeds is not None:
        if input_features is not None:
            raise ValueError("pass input_features or audio_embeds, not both")
        embeds = thinker.get_input_embeddings()(input_ids)  # type: ignore[no-untyped-call,unused-ignore]
        assert isinstance(embeds, torch.Tensor)
        placeholders = (input_ids == thinker.config.audio_token_id)[..., None]
        embeds = embeds.masked_scatter(placeholders.expand_as(embeds), audio_embeds.to(embeds))
        ids = None
    out = thinker(
        input_ids=ids,
        inputs_embeds=embeds,
        input_features=input_features,
        feature_attention_mask=feature_attention_mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        output_hidden_states=True,
    )
    hidden = out.hidden_states
    return ThinkerStep(out.logits, hidden[0], hidden[accept_layer])


@torch.no_grad()
def talker_user_part(
    talker: Qwen3OmniMoeTalkerForConditionalGeneration,
    embeds: torch.Tensor,
    accept_hidden: torch.Tensor,
    multimodal: torch.Tensor,
) -> torch.Tensor:
    """Talker inputs for the user turn (``<|im_start|>user ... <|im_end|>\\n``).

    Args:
        talker: The talker model.
        embeds: [B, L, H] thinker input embeddings of the user turn.
        accept_hidden: [B, L, H] thinker hidden states of the same positions.
        multimodal: [B, L] bool, True at audio/image/video placeholder positions.

    Returns:
        [B, L, talker_hidden]: ``hidden_projection`` of the thinker state at placeholders,
        ``text_projection`` of the embedding elsewhere (HF ``_get_talker_user_parts``).
    """
    text = talker.text_projection(embeds)
    media = talker.hidden_projection(accept_hidden)
    return torch.where(multimodal.unsqueeze(-1), media, text)


@torch.no_grad()
def talker_assistant_prefix(
    talker: Qwen3OmniMoeTalkerForConditionalGeneration,
    first_four: torch.Tensor,
    tts_bos_pad: tuple[torch.Tensor, torch.Tensor],
    speaker_id: int,
) -> torch.Tensor:
    """The 9 talker inputs that open the assistant turn (HF ``_get_talker_assistant_parts``).

    Args:
        talker: The talker model.
        first_four: [B, 4, H] thinker embeddings of ``<|im_start|> assistant \\n`` and of
            the first generated token, so the talker can start after one thinker step.
        tts_bos_pad: Thinker embeddings [1, 1, H] of TTS_BOS and TTS_PAD.
        speaker_id: Codec id of the voice (``talker_config.speaker_id[name]``).

    Returns:
        [B, 9, talker_hidden]. Each later talker step adds ``text_projection`` of the next
        generated token's embedding, then of TTS_EOS once the text ends, then of TTS_PAD.
    """
    cfg = talker.config
    batch = first_four.shape[0]
    text = talker.text_projection(first_four)
    bos, pad = (talker.text_projection(e).expand(batch, 1, -1) for e in tts_bos_pad)
    text_part = torch.cat((text[:, :3], pad.expand(batch, 4, -1), bos, text[:, 3:4]), dim=1)
    codec_ids = torch.tensor(
        [
            cfg.codec_nothink_id,
            cfg.codec_think_bos_id,
            cfg.codec_think_eos_id,
            speaker_id,
            cfg.codec_pad_id,
            cfg.codec_bos_id,
        ]
    ).expand(batch, -1)
    codec = talker.model.codec_embedding(codec_ids)
    codec = torch.cat((codec.new_zeros(batch, 3, codec.shape[-1]), codec), dim=1)
    return text_part + codec


@torch.no_grad()
def talker_forward(
    talker: Qwen3OmniMoeTalkerForConditionalGeneration,
    inputs_embeds: torch.Tensor,
    cache: DynamicCache,
    start: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the talker backbone over ``inputs_embeds`` [B, L, Ht] at ``start ..``.

    Calls ``talker.model`` and ``talker.codec_head`` directly: ``talker.forward`` needs
    a ``generation_step`` bookkeeping argument on every decode step and keeps rope deltas
    on the model instance.

    Returns:
        ``(last_hidden [B, 1, Ht], logits [B, talker_vocab])`` for the last position; mask
        the logits with :func:`mask_codec_logits` before picking the frame's first code.
    """
    batch, length = inputs_embeds.shape[:2]
    positions = torch.arange(start, start + length).expand(batch, length)
    out = talker.model(
        inputs_embeds=inputs_embeds, position_ids=positions, past_key_values=cache, use_cache=True
    )
    last = out.last_hidden_state[:, -1:]
    return last, talker.codec_head(last)[:, -1]


def mask_codec_logits(
    logits: torch.Tensor, talker_vocab_size: int, codec_eos_id: int
) -> torch.Tensor:
    """Forbid the talker's special ids except codec EOS, as HF ``generate`` does.

    The top 1024 ids of the talker vocabulary are control tokens; only codebook entries
    (and EOS, which ends the speech) may start a frame, since code2wav indexes its
    embedding table with them.
    """
    masked = logits.clone()
    eos = masked[..., codec_eos_id].clone()
    masked[..., talker_vocab_size - 1024 :] = float("-inf")
    masked[..., codec_eos_id] = eos
    return masked


@torch.no_grad()
def code_predictor_frame(
    talker: Qwen3OmniMoeTalkerForConditionalGeneration,
    last_hidden: torch.Tensor,
    code0: torch.Tensor,
    pick: Pick = greedy,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Complete a codec frame from its first code, and embed it for the next talker step.

    The code predictor is a small causal LM run afresh per frame: prefill
    ``[talker last_hidden, embed(code0)]``, then one forward per remaining group, group
    ``j`` embedded by ``codec_embedding[j-1]`` and scored by ``lm_head[j]``
    (``num_code_groups - 1`` forwards in all).

    Args:
        talker: The talker model.
        last_hidden: [B, 1, Ht] from :func:`talker_forward` (the step that scored code0).
        code0: [B, 1] the frame's first code (must not be codec EOS).
        pick: Chooses each residual code from its logits.

    Returns:
        ``(codes [B, num_code_groups], next_input [B, 1, Ht])``. ``next_input`` is the sum
        of all the frame's code embeddings; add the projected text embedding to it to form
        the talker's next input.
    """
    predictor = talker.code_predictor
    groups = talker.config.num_code_groups
    embed0 = talker.model.codec_embedding(code0)
    cache = DynamicCache(config=predictor.config)
    hidden = predictor.model(
        inputs_embeds=torch.cat((last_hidden, embed0), dim=1), past_key_values=cache, use_cache=True
    ).last_hidden_state
    codes, embeds = [code0], [embed0]
    for group in range(1, groups):
        code = pick(predictor.lm_head[group - 1](hidden[:, -1]))
        embed = predictor.model.codec_embedding[group - 1](code)
        codes.append(code)
        embeds.append(embed)
        if group < groups - 1:
            hidden = predictor.model(
                inputs_embeds=embed, past_key_values=cache, use_cache=True
            ).last_hidden_state
    return torch.cat(codes, dim=1), torch.cat(embeds, dim=1).sum(dim=1, keepdim=True)


@torch.no_grad()
def decode_window(
    code2wav: Qwen3OmniMoeCode2Wav, codes: torch.Tensor, context_frames: int
) -> torch.Tensor:
    """Decode a chunk with left context and return only the samples it adds to the stream.

    code2wav is causal, but each of its transposed convolutions trims its last output
    step, so ``n`` frames decode to ``1920 * n - 555`` samples and the tail of every chunk
    is only produced once the next frame is known. HF ``chunked_decode`` drops that tail
    (555 samples, 23 ms, lost at every chunk boundary); this keeps the stream continuous by
    emitting, after the first chunk, from the end of what the previous chunk emitted.
    Concatenated outputs equal the full decode once ``context_frames`` covers the receptive
    field (20 frames for tiny-omni; the real model's 72-frame attention window needs more).

    Args:
        code2wav: The decoder.
        codes: [B, num_quantizers, context_frames + new_frames]; all rows the same length,
            so several sessions' chunks batch on dim 0.
        context_frames: Leading frames already decoded in an earlier call (0 for the first).

    Returns:
        [B, samples]: ``1920 * new - 555`` samples for a first chunk, ``1920 * new`` after.
    """
    wav: torch.Tensor = code2wav(codes)[:, 0]
    if context_frames == 0:
        return wav
    lost = int(code2wav.total_upsample) * codes.shape[-1] - wav.shape[-1]
    return wav[:, context_frames * int(code2wav.total_upsample) - lost :]
