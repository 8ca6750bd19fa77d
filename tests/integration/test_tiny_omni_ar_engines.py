"""The autoregressive tiny-omni engines: ``ThinkerEngine`` and ``TalkerEngine``.

They run the real (tiny) models, so these pin behaviour the pipeline relies on: the
fields and shapes each engine yields, determinism, streaming input equal to whole input,
resumable thinker sessions, prompt aborts, and a talker whose codes do not depend on how
the thinker's output was chunked and equal the step-by-step schedule that
``test_tiny_omni_models`` proves equal to HF ``generate``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from thinker_driving import started
from tiny_omni_ids import ASSISTANT_OPENING, PRINTABLE_RANGES, TINY_TALKER, Tokens, user_turn
from transformers import DynamicCache

from omni_actors.actors.engines.contract import Fields
from omni_actors.actors.engines.qwen3_omni import configs, stepping, weights
from omni_actors.actors.engines.qwen3_omni.talker_engine import TalkerArgs, TalkerEngine
from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerArgs, ThinkerEngine
from omni_actors.actors.engines.registry import EngineArgsError, build_engine
from omni_actors.actors.engines.thinker_ports import USER_EDITS_FIELD
from omni_actors.actors.stage.accumulate import Accumulator
from omni_actors.testing import consistently, eventually

pytestmark = pytest.mark.integration

TEXT = "Hello there, how are you today?"
TALKER_FIELDS = tuple(TalkerEngine.inputs)  # what the talker declares it takes


def _args(cache_dir: Path, **extra: Any) -> dict[str, Any]:
    return {"seed": 0, "cache_dir": str(cache_dir), **extra}


def thinker(cache_dir: Path, **extra: Any) -> AbstractAsyncContextManager[ThinkerEngine]:
    extra = {"allowed_token_ranges": PRINTABLE_RANGES, **extra}
    return started(ThinkerEngine(ThinkerArgs(**_args(cache_dir, **extra))))


def talker(cache_dir: Path, **extra: Any) -> AbstractAsyncContextManager[TalkerEngine]:
    extra = {**TINY_TALKER, **extra}
    return started(TalkerEngine(TalkerArgs(**_args(cache_dir, **extra))))


async def feed(items: Iterable[Fields], pause: float = 0.0) -> AsyncIterator[Fields]:
    """``items`` as an input stream; with ``pause``, each arrives that much later (input
    that streams in over time is the behaviour some tests are about)."""
    for item in items:
        if pause:
            await asyncio.sleep(pause)
        yield item


async def hang_after(items: Iterable[Fields]) -> AsyncIterator[Fields]:
    """Yields ``items``, then waits forever (an input stream that never ends)."""
    for item in items:
        yield item
    await asyncio.Event().wait()


async def run(engine: Any, session: str, inputs: AsyncIterator[Fields]) -> list[Fields]:
    return [out async for out in engine.generate(session, inputs)]


def tensor(fields: Fields, name: str) -> torch.Tensor:
    value = fields[name]
    assert isinstance(value, torch.Tensor), name
    return value


def tokens(outputs: list[Fields]) -> list[Fields]:
    """The outputs that carry a token (user rows may come in outputs of their own)."""
    return [o for o in outputs if "token_ids" in o]


def ids(outputs: list[Fields]) -> list[int]:
    return [int(tensor(o, "token_ids")) for o in tokens(outputs)]


def user_rows(outputs: list[Fields]) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``user`` rows and ``user_mask`` of a response, concatenated (the edge's rule)."""
    rows = [tensor(o, "user") for o in outputs if "user" in o]
    masks = [tensor(o, "user_mask") for o in outputs if "user_mask" in o]
    if not rows:
        return torch.zeros(0, 64), torch.zeros(0, dtype=torch.bool)
    return torch.cat(rows), torch.cat(masks)


def sine(seconds: float = 1.0) -> torch.Tensor:
    t = torch.arange(int(configs.AUDIO_SAMPLE_RATE * seconds)) / configs.AUDIO_SAMPLE_RATE
    return (0.3 * torch.sin(2 * math.pi * 440.0 * t)).to(torch.float32)


def stream_edge(outputs: list[Fields]) -> list[Fields]:
    """What a ``stream`` thinker -> talker edge delivers: one chunk per token."""
    return [{k: v for k, v in o.items() if k in TALKER_FIELDS} for o in outputs]


def full_edge(outputs: list[Fields]) -> list[Fields]:
    """What a ``full`` edge delivers: one chunk, fields merged by their accumulate rules."""
    merged = Accumulator(ThinkerEngine.outputs)
    for out in outputs:
        merged.add(out)
    return [{k: v for k, v in merged.snapshot().items() if k in TALKER_FIELDS}]


def codes(outputs: list[Fields]) -> torch.Tensor:
    return torch.cat([tensor(o, "codes") for o in outputs])


async def test_thinker_yields_tokens_and_the_talker_inputs_first(cache_dir: Path) -> None:
    async with thinker(cache_dir) as engine:
        everything = await run(engine, "s", feed([{"text": TEXT}]))
    outputs = tokens(everything)
    # The user turn's rows come first, in an output of their own, as prefilled; its
    # end comes with the first token.
    assert set(everything[0]) == {"user", "user_mask", USER_EDITS_FIELD}
    assert everything[1:] == outputs
    assert 8 <= len(outputs) <= 48
    table = weights.load(cache_dir / "tiny-omni" / "seed-0", "thinker").get_input_embeddings()
    for k, out in enumerate(outputs):
        token = tensor(out, "token_ids")
        assert token.dtype == torch.int64
        assert token.shape == (1,)
        assert 32 <= int(token) <= 126
        assert out["text"] == chr(int(token))
        embed = tensor(out, "embed")
        assert embed.shape == (1, 64)
        assert embed.dtype == torch.float32
        assert torch.equal(embed, table(token))
        assert ("opening" in out) == ("tts" in out) == (k == 0)
    user, mask = user_rows(everything)
    opening, tts = (tensor(outputs[0], k) for k in ("opening", "tts"))
    turn = user_turn(TEXT)
    assert user.shape == (len(turn), 64)
    assert torch.equal(user, table(torch.tensor(turn)))  # text only: embeddings
    assert mask.dtype == torch.bool
    assert mask.shape == (len(turn),)
    assert not mask.any()
    assert torch.equal(opening, table(torch.tensor(ASSISTANT_OPENING)))
    assert torch.equal(tts, table(torch.tensor([Tokens.TTS_BOS, Tokens.TTS_EOS, Tokens.TTS_PAD])))


async def test_thinker_is_deterministic(cache_dir: Path) -> None:
    async with thinker(cache_dir) as engine:
        first = await run(engine, "a", feed([{"text": TEXT}]))
        second = await run(engine, "b", feed([{"text": TEXT}]))
    async with thinker(cache_dir) as engine:
        third = await run(engine, "a", feed([{"text": TEXT}]))
    assert ids(first) == ids(second) == ids(third)
    pairs = zip(tokens(first), tokens(third), strict=True)
    assert all(torch.equal(tensor(a, "embed"), tensor(b, "embed")) for a, b in pairs)


@pytest.mark.parametrize(("low", "high"), [(0, 3), (5, 5), (20, 24), (8, 48)])
async def test_thinker_respects_min_and_max_new_tokens(
    cache_dir: Path, low: int, high: int
) -> None:
    async with thinker(cache_dir, min_new_tokens=low, max_new_tokens=high) as engine:
        outputs = tokens(await run(engine, "s", feed([{"text": TEXT}])))
    assert low <= len(outputs) <= high
    assert Tokens.IM_END not in ids(outputs)


async def test_the_talker_refuses_a_speaker_the_checkpoint_lacks(cache_dir: Path) -> None:
    """The voices are the checkpoint's ``talker_config.speaker_id``, known once it loads."""
    engine = build_engine("qwen3-omni.talker", _args(cache_dir, speaker="Nobody"))
    voices = "the checkpoint's voices are aiden, chelsie, ethan"
    try:
        with pytest.raises(ValueError, match=f"unknown speaker 'nobody': {voices}"):
            await engine.start()
    finally:
        await engine.stop()
    async with talker(cache_dir, speaker="Ethan") as engine:
        assert engine.voices == ["aiden", "chelsie", "ethan"]


def test_thinker_rejects_bad_args(cache_dir: Path) -> None:
    with pytest.raises(EngineArgsError, match=r"engine\.args\.min_new_tokens: Input should be"):
        build_engine("qwen3-omni.thinker", _args(cache_dir, min_new_tokens=-1))
    small = build_engine("qwen3-omni.thinker", _args(cache_dir, max_new_tokens=4))
    assert isinstance(small, ThinkerEngine)
    assert small.min_new_tokens == 4
    with pytest.raises(EngineArgsError, match=r"engine\.args\.max_tokens: Extra inputs"):
        build_engine("qwen3-omni.thinker", _args(cache_dir, max_tokens=8))
    with pytest.raises(EngineArgsError, match="stop_at_codec_eos"):
        build_engine("qwen3-omni.talker", _args(cache_dir, stop_at_codec_eos="yes"))


async def test_thinker_text_in_chunks_equals_one_chunk(cache_dir: Path) -> None:
    pieces = [{"text": TEXT[i : i + 7]} for i in range(0, len(TEXT), 7)]
    async with thinker(cache_dir) as engine:
        whole = await run(engine, "whole", feed([{"text": TEXT}]))
        chunked = await run(engine, "chunked", feed(pieces, pause=0.005))
    assert ids(chunked) == ids(whole)
    assert torch.equal(user_rows(chunked)[0], user_rows(whole)[0])


async def test_thinker_takes_audio(cache_dir: Path) -> None:
    async with thinker(cache_dir) as engine:
        heard = await run(engine, "a", feed([{"audio": sine()}, {"text": "Hi!"}]))
        split = await run(
            engine,
            "b",
            feed([{"audio": sine()[:8000]}, {"audio": sine()[8000:], "text": "Hi!"}]),
        )
        plain = await run(engine, "c", feed([{"text": "Hi!"}]))
        blip = await run(engine, "d", feed([{"audio": sine()[:200]}, {"text": "Hi!"}]))
    assert 8 <= len(ids(heard)) <= 48
    assert ids(heard) != ids(plain)
    mask = user_rows(heard)[1]
    assert int(mask.sum()) == 13  # 1 s -> 100 mel frames -> 13 audio positions
    assert mask[:4].tolist() == [False] * 4  # im_start user \n audio_start
    # Chunks of one audio run make one clip.
    assert ids(split) == ids(heard)
    assert ids(blip) == ids(plain)  # under one STFT window: dropped, nothing to hear


async def test_thinker_session_resumes_where_it_stopped(cache_dir: Path) -> None:
    async with thinker(cache_dir, min_new_tokens=6, max_new_tokens=6) as engine:
        first = await run(engine, "s", feed([{"text": "Hi!"}]))
        after_first = engine.cached_tokens("s")
        second = await run(engine, "s", feed([{"text": "And?"}]))
        after_second = engine.cached_tokens("s")
        fresh = await run(engine, "t", feed([{"text": "And?"}]))
        assert engine.active_sessions == {"s", "t"}
        await engine.release("s")
        assert engine.active_sessions == {"t"}
        assert engine.cached_tokens("s") == 0
    lengths = [user_rows(o)[0].shape[0] for o in (first, second)]
    assert lengths == [3 + 3 + 2, 3 + 4 + 2]  # each segment's own user turn
    # The 6th token is not fed; the next segment feeds it with <|im_end|> \n first.
    assert after_first == lengths[0] + 3 + 5
    assert after_second == after_first + 3 + lengths[1] + 3 + 5
    assert len(ids(second)) == len(ids(fresh)) == 6
    assert ids(second) != ids(fresh)  # the first exchange is in context


async def test_thinker_abort_mid_decode_ends_promptly(cache_dir: Path) -> None:
    async with thinker(cache_dir, min_new_tokens=48, max_new_tokens=48) as engine:
        outputs = engine.generate("s", feed([{"text": TEXT}]))
        for _ in range(3):
            await anext(outputs)
        assert engine.generating == {"s"}
        await engine.abort("s")
        rest = [out async for out in outputs]
        assert len(rest) <= 1  # at most the step already in flight, not the 45 left
        assert engine.active_sessions == set()
        assert engine.generating == set()


async def test_thinker_abort_while_waiting_for_input(cache_dir: Path) -> None:
    async with thinker(cache_dir) as engine:
        got: list[Fields] = []

        async def collect() -> None:
            async for out in engine.generate("s", hang_after([{"text": "Hi"}])):
                got.append(out)

        task = asyncio.ensure_future(collect())
        # The turn's rows go as soon as they are prefilled; then the input hangs.
        await eventually(lambda: len(got) == 1)
        assert engine.generating == {"s"}
        await engine.abort("s")
        await asyncio.wait_for(task, 5.0)
        # No reply after the rows.
        assert [set(out) for out in got] == [{"user", "user_mask", USER_EDITS_FIELD}]
        assert engine.active_sessions == set()


async def run_list(outputs: AsyncIterator[Fields]) -> list[Fields]:
    return [out async for out in outputs]


async def _thinker_output(cache_dir: Path, inputs: list[Fields], **extra: Any) -> list[Fields]:
    async with thinker(cache_dir, **extra) as engine:
        return await run(engine, "s", feed(inputs))


async def test_talker_stream_and_full_input_give_the_same_codes(cache_dir: Path) -> None:
    said = await _thinker_output(cache_dir, [{"text": TEXT}], max_new_tokens=12)
    async with talker(cache_dir) as engine:
        streamed = await run(engine, "stream", feed(stream_edge(said), pause=0.002))
        whole = await run(engine, "full", feed(full_edge(said)))
        assert engine.generating == set()
    assert len(streamed) == len(whole) == 2 * len(ids(said))
    assert torch.equal(codes(streamed), codes(whole))
    frames = codes(whole)
    assert frames.dtype == torch.int64
    assert frames.shape == (2 * len(ids(said)), configs.DEFAULT_NUM_CODE_GROUPS)
    assert all(tensor(out, "codes").shape == (1, 4) for out in whole)
    assert int(frames.min()) >= 0
    assert int(frames.max()) < configs.CODEBOOK_SIZE


async def test_talker_follows_hf_schedule_with_audio_prompt(cache_dir: Path) -> None:
    """Frame k's text is token k, then TTS_EOS, then TTS_PAD (the HF-equal loop)."""
    said = await _thinker_output(
        cache_dir, [{"audio": sine(), "text": "Hi"}], min_new_tokens=4, max_new_tokens=4
    )
    async with talker(cache_dir, frames_per_token=3, speaker="ethan") as engine:
        ours = codes(await run(engine, "s", feed(stream_edge(said))))

    model: Any = weights.load(cache_dir / "tiny-omni" / "seed-0", "talker")
    rows, mask = user_rows(said)
    opening, tts = (tensor(tokens(said)[0], k) for k in ("opening", "tts"))
    assert mask.any()
    embeds = [tensor(o, "embed")[None] for o in tokens(said)]
    user = stepping.talker_user_part(model, rows[None], rows[None], mask[None])
    prefix = stepping.talker_assistant_prefix(
        model,
        torch.cat((opening[None], embeds[0]), dim=1),
        (tts[None, 0:1], tts[None, 2:3]),
        model.config.speaker_id["ethan"],
    )
    texts = [*embeds[1:], tts[None, 1:2]]
    cache = DynamicCache(config=model.config.text_config)
    inputs = torch.cat((user, prefix), dim=1)
    hidden, logits = stepping.talker_forward(model, inputs, cache, 0)
    position, frames = inputs.shape[1], []
    vocab, eos = model.config.text_config.vocab_size, model.config.codec_eos_token_id
    for k in range(3 * len(embeds)):
        code0 = stepping.greedy(stepping.mask_codec_logits(logits, vocab, eos))
        frame, carry = stepping.code_predictor_frame(model, hidden, code0)
        frames.append(frame)
        text = texts[k] if k < len(texts) else tts[None, 2:3]
        hidden, logits = stepping.talker_forward(
            model, carry + model.text_projection(text), cache, position
        )
        position += 1
    assert torch.equal(ours, torch.cat(frames))


async def test_talker_waits_for_tokens_it_needs(cache_dir: Path) -> None:
    said = await _thinker_output(cache_dir, [{"text": TEXT}], max_new_tokens=6)
    async with talker(cache_dir) as engine:
        second = said.index(tokens(said)[1])  # the output with token 1
        outputs = engine.generate("s", hang_after(stream_edge(said)[: second + 1]))
        got = [await anext(outputs) for _ in range(2)]  # frames 0 and 1: tokens 0 and 1
        pending = asyncio.ensure_future(anext(outputs))
        # frame 2 needs token 2, which never comes
        await consistently(lambda: not pending.done(), duration=0.1)
        await engine.abort("s")
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(pending, 5.0)
        assert engine.active_sessions == set()  # abort drops the session's state
        alone = await run(engine, "t", feed(full_edge(said)))
    assert torch.equal(codes(got), codes(alone)[:2])


async def test_talker_abort_mid_segment_frees_it(cache_dir: Path) -> None:
    said = await _thinker_output(cache_dir, [{"text": TEXT}], min_new_tokens=24)
    async with talker(cache_dir) as engine:
        outputs = engine.generate("s", feed(full_edge(said)))
        await anext(outputs)
        assert engine.active_sessions == {"s"}
        await engine.abort("s")
        rest = await asyncio.wait_for(run_list(outputs), 1.0)
        assert len(rest) <= 1
        assert engine.active_sessions == set()


async def test_talker_interleaved_sessions_match_running_alone(cache_dir: Path) -> None:
    said_a = await _thinker_output(cache_dir, [{"text": TEXT}], max_new_tokens=10)
    said_b = await _thinker_output(cache_dir, [{"audio": sine(0.5)}], max_new_tokens=10)
    # One session per forward: interleaving alone must not mix their state. (Batched
    # forwards may differ in the last bits: test_tiny_omni_talker_batching covers them.)
    async with talker(cache_dir, max_batch=1) as engine:
        alone_a = codes(await run(engine, "a", feed(full_edge(said_a))))
        alone_b = codes(await run(engine, "b", feed(full_edge(said_b))))
        # Fresh sessions: "a" and "b" now hold their first exchange.
        both = await asyncio.gather(
            run(engine, "a2", feed(stream_edge(said_a), pause=0.003)),
            run(engine, "b2", feed(stream_edge(said_b), pause=0.002)),
        )
        assert engine.generating == set()
    assert torch.equal(codes(both[0]), alone_a)
    assert torch.equal(codes(both[1]), alone_b)
    assert not torch.equal(alone_a[: len(alone_b)], alone_b[: len(alone_a)])


async def test_talker_without_tokens_says_nothing(cache_dir: Path) -> None:
    async with talker(cache_dir) as engine:
        assert await run(engine, "s", feed([])) == []
        with pytest.raises(ValueError, match="opening or tts"):
            await run(engine, "t", feed([{"embed": torch.zeros(1, 64)}]))
        assert engine.generating == set()


async def test_talker_codec_eos_is_masked_unless_asked_to_stop(cache_dir: Path) -> None:
    # With seed 0 the talker picks codec EOS at frame 91 of this answer's 256.
    said = await _thinker_output(
        cache_dir, [{"text": "Tell me a story."}], max_new_tokens=128, min_new_tokens=128
    )
    async with talker(cache_dir) as engine:
        masked = codes(await run(engine, "s", feed(full_edge(said))))
    async with talker(cache_dir, stop_at_codec_eos=True) as engine:
        stopped = codes(await run(engine, "s", feed(stream_edge(said))))
        assert engine.generating == set()
    assert masked.shape[0] == 2 * len(ids(said))
    assert 0 < stopped.shape[0] < masked.shape[0]
    assert torch.equal(stopped, masked[: stopped.shape[0]])  # the same frames up to EOS


async def test_by_default_a_reply_ends_at_codec_eos_or_max_frames(cache_dir: Path) -> None:
    said = await _thinker_output(
        cache_dir, [{"text": "Tell me a story."}], max_new_tokens=16, min_new_tokens=16
    )
    assert TalkerArgs().frames_per_token is None
    assert TalkerArgs().stop_at_codec_eos
    plain = {"frames_per_token": None, "stop_at_codec_eos": True}  # TalkerArgs' defaults
    async with talker(cache_dir, **plain, max_frames=300) as engine:
        spoken = codes(await run(engine, "s", feed(stream_edge(said))))
    async with talker(cache_dir) as engine:  # tiny-omni's presets: 2 frames per token
        planned = codes(await run(engine, "s", feed(stream_edge(said))))
    # No cap per token: the reply goes on past 2 frames per token, the same frames.
    assert planned.shape[0] == 2 * len(ids(said))
    assert planned.shape[0] < spoken.shape[0] <= 300
    assert torch.equal(spoken[: planned.shape[0]], planned)
    async with talker(cache_dir, **plain, max_frames=40) as engine:
        short = codes(await run(engine, "s", feed(stream_edge(said))))
    assert torch.equal(short, spoken[:40])
    with pytest.raises(EngineArgsError, match="would end only at max_frames"):
        build_engine("qwen3-omni.talker", _args(cache_dir, stop_at_codec_eos=False))
