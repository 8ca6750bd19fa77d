"""tiny-omni's thinker hears audio as it arrives: window by window, exactly.

Streamed encoding (20 ms frames, as a realtime client sends them) must equal the
one-shot encoding of the whole clip — HF's audio encoder over its whole log-mel — and
the work left when the input ends must not grow with the input's length.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")

import torch
from thinker_driving import thinker
from thinker_steps import OneShot, ids, respond
from tiny_omni_ids import (
    ASSISTANT_OPENING,
    PRINTABLE,
    Tokens,
    encode,
    feature_extractor,
)
from transformers import DynamicCache

from omni_actors.actors.engines.contract import Fields
from omni_actors.actors.engines.qwen3_omni import configs, stepping
from omni_actors.actors.engines.qwen3_omni.audio_stream import AudioClip
from omni_actors.actors.engines.qwen3_omni.log_mel import LogMel

pytestmark = pytest.mark.integration

RATE = configs.AUDIO_SAMPLE_RATE
FRAME = RATE // 50  # 20 ms
WINDOW_TOKENS = stepping.audio_token_count(800, 50)  # one 8 s attention window: 104


def speech(seconds: float, seed: int = 0) -> np.ndarray:
    """A loud-first tone in noise: something to hear, different every second."""
    n = int(RATE * seconds)
    t = np.arange(n) / RATE
    rng = np.random.default_rng(seed)
    wave = 0.2 * np.sin(2 * np.pi * (300.0 + 40.0 * np.floor(t)) * t)
    wave += 0.05 * rng.standard_normal(n)
    wave[:400] *= 3.0
    return wave.astype(np.float32)


def frames(samples: np.ndarray) -> list[Fields]:
    return [
        {"audio": torch.from_numpy(samples[i : i + FRAME])} for i in range(0, len(samples), FRAME)
    ]


def whole_mel(samples: np.ndarray) -> torch.Tensor:
    mel = LogMel(feature_extractor(), block=100)
    mel.push(samples)
    return torch.cat((mel.take(), mel.finish()), dim=1)


def user_rows(outputs: list[Fields]) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [o["user"] for o in outputs if "user" in o]
    masks = [o["user_mask"] for o in outputs if "user_mask" in o]
    assert all(isinstance(r, torch.Tensor) for r in [*rows, *masks])
    return torch.cat(rows), torch.cat(masks)  # type: ignore[arg-type]


@pytest.mark.parametrize("seconds", [0.7, 3.3, 8.5, 9.3, 16.6, 17.05])
def test_streamed_windows_equal_the_one_shot_encoder(model: Any, seconds: float) -> None:
    """8.5 s and 16.6 s end with less than one conv chunk after a whole window: the case
    where encoding the last window alone would differ (padding, see ``audio_stream``);
    17.05 s ends with just over one."""
    samples = speech(seconds)
    mel = whole_mel(samples)
    one_shot = model.get_audio_features(
        mel[None], feature_attention_mask=torch.ones(1, mel.shape[1], dtype=torch.long)
    ).last_hidden_state

    def encode(piece: torch.Tensor) -> torch.Tensor:
        return stepping.encode_audio(model, piece)

    clip = AudioClip(LogMel(feature_extractor(), block=100), 50, 800)
    pieces = []
    for start in range(0, len(samples), FRAME):
        clip.push(samples[start : start + FRAME])
        if clip.ready():
            pieces.append(clip.windows(encode))
    pieces.append(clip.finish(encode))
    streamed = torch.cat([p for p in pieces if p is not None])
    assert streamed.shape == one_shot.shape
    assert clip.tokens == one_shot.shape[0]
    assert torch.allclose(streamed, one_shot, atol=1e-7, rtol=0)


@pytest.mark.parametrize(
    "compiled",
    [{}, {"compile_prefill": True, "compile_backend": "aot_eager"}],
    ids=["eager", "compiled-prefill"],
)
async def test_streamed_audio_turn_equals_the_one_shot_forward(
    cache_dir: Path, model: Any, compiled: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    """The turn's rows and reply equal HF's one-shot forward, its prefill forwards' layers
    compiled or not (the audio rows scattered in, the talker's rows from the accept
    layer's hook)."""
    if compiled:
        request.getfixturevalue("fresh_compiles")
    samples = speech(8.5)
    async with thinker(cache_dir, **compiled) as engine:
        assert engine._model.prefill_compiled == ("compiled" if compiled else "off")
        streamed = await respond(engine, "streamed", *frames(samples), {"text": "?"})
        at_once = await respond(
            engine, "at-once", {"audio": torch.from_numpy(samples)}, {"text": "?"}
        )
    rows, mask = user_rows(streamed)
    assert torch.equal(rows, user_rows(at_once)[0])
    assert ids(streamed) == ids(at_once)

    # HF's one-shot forward: the whole turn, the clip's whole log-mel through the encoder.
    mel = whole_mel(samples)
    n_audio = stepping.audio_token_count(mel.shape[1], 50)
    turn = [Tokens.IM_START, Tokens.USER, 10, Tokens.AUDIO_START, *[Tokens.AUDIO_PAD] * n_audio]
    turn += [Tokens.AUDIO_END, *encode("?"), Tokens.IM_END, 10]
    prompt = torch.tensor([[*turn, *ASSISTANT_OPENING]])
    cache = DynamicCache(config=model.config.text_config)
    step = stepping.thinker_forward(
        model,
        prompt,
        cache,
        0,
        accept_layer=1,
        input_features=mel[None],
        feature_attention_mask=torch.ones(1, mel.shape[1], dtype=torch.long),
    )
    placeholders = prompt[0, : len(turn)] == Tokens.AUDIO_PAD
    expected = torch.where(
        placeholders[:, None], step.accept_hidden[0, : len(turn)], step.embeds[0, : len(turn)]
    )
    assert torch.equal(mask, placeholders)
    assert torch.allclose(rows, expected, atol=1e-5, rtol=0)
    allowed = torch.full((model.config.text_config.vocab_size,), float("-inf"))
    allowed[list(PRINTABLE)] = 0.0
    reply, position = [], prompt.shape[1]
    for _ in range(6):
        reply.append(int((step.logits[0, -1] + allowed).argmax()))
        step = stepping.thinker_forward(
            model, torch.tensor([[reply[-1]]]), cache, position, accept_layer=1
        )
        position += 1
    assert ids(streamed) == reply


async def test_work_left_at_the_end_of_input_does_not_grow_with_its_length(
    cache_dir: Path,
) -> None:
    left: dict[float, int] = {}
    async with thinker(cache_dir) as engine:
        for seconds in (12.0, 36.0):
            session = f"s{seconds}"
            prefilled = 0

            async def input_ended(session: str = session) -> None:
                nonlocal prefilled
                prefilled = engine.cached_tokens(session)  # every chunk has been taken

            outputs = await respond(engine, session, *frames(speech(seconds)), input_ended)
            turn = user_rows(outputs)[0].shape[0]
            left[seconds] = turn - prefilled
    # What is left: the last partial window (4 s: 52 positions), <|audio_end|>,
    # <|im_end|> \n; never more than a window and a chunk.
    assert left[12.0] == left[36.0] == 52 + 3
    assert left[36.0] <= WINDOW_TOKENS + 13 + 3


async def test_a_one_shot_clip_and_the_reply_s_opening_share_one_forward(
    cache_dir: Path,
) -> None:
    """A clip sent whole with the reply asked for (a one-shot request) is encoded once,
    at the end of input, and fed with the reply's opening: one prefill step, the same
    rows and tokens as the clip taken before the reply."""
    samples = torch.from_numpy(speech(8.5))
    async with thinker(cache_dir) as engine:
        taken = await respond(engine, "taken", {"audio": samples})
        before = engine.loop.statistics()
        one_shot = [out async for out in engine.generate("one-shot", OneShot([{"audio": samples}]))]
        after = engine.loop.statistics()
    assert after.steps - before.steps - (after.decode_rows - before.decode_rows) == 1
    assert ids(one_shot) == ids(taken)
    rows, mask = user_rows(one_shot)
    assert torch.equal(mask, user_rows(taken)[1])
    torch.testing.assert_close(rows, user_rows(taken)[0], rtol=0, atol=1e-5)
