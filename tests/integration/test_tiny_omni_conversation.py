"""A tiny-omni conversation through the whole pipeline, as a voice agent holds one.

Each reply — text and audio, at every turn — must equal HF's end-to-end
``Qwen3OmniMoeForConditionalGeneration.generate`` on the conversation so far as one
request (``tiny_omni_reference``): the stages keep the conversation between turns
(the thinker its KV cache, the talker every user turn), and a barge-in (cancel, then
truncate to what was heard) leaves every stage where the reference conversation with
the heard part of the reply stands. An assistant turn the caller gives is an assistant
message of the reference conversation, and a response's own instructions a system
message of that response's alone.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from tiny_omni_ids import ASSISTANT_OPENING, Tokens, system_turn
from tiny_omni_reference import assistant_turn, hf_reply, hf_user_turn, reference_model

from omni_actors.actors.engines.contract import INSTRUCTIONS_FIELD
from omni_actors.actors.engines.qwen3_omni import configs
from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerEngine
from omni_actors.models.cache import prepare
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.session import Session
from omni_actors.pipeline.spec.pipeline import PipelineSpec, load_pipeline
from omni_actors.protocols.events import AudioDelta, Event, ResponseDone, TextDelta
from omni_actors.testing import eventually, kill_worker, worker_pid
from omni_actors.testing.inspection import actor_instance

pytestmark = pytest.mark.integration

MIN_TOKENS, MAX_TOKENS = 8, 10
TURNS = ["Hello there!", "What is the weather like?", "Thanks, bye."]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("weights")
    prepare("tiny-omni", cache_dir=root)
    return root


@pytest.fixture(scope="module")
def reference(cache: Path) -> Any:
    return reference_model(cache)


def spec(cache: Path) -> PipelineSpec:
    raw = load_pipeline("tiny-omni").with_weights(cache_dir=cache).model_dump(by_alias=True)
    thinker = next(s for s in raw["stages"] if s["name"] == "thinker")
    thinker["engine"]["args"].update(min_new_tokens=MIN_TOKENS, max_new_tokens=MAX_TOKENS)
    return PipelineSpec.model_validate(raw)


async def reply(session: Session, text: str) -> tuple[str, torch.Tensor, ResponseDone]:
    await session.send(text=text)
    return await answer(session)


async def answer(session: Session) -> tuple[str, torch.Tensor, ResponseDone]:
    """The reply to the conversation so far."""
    response = await session.respond(voice="ethan")
    events: list[Event] = [e async for e in response.events()]
    done = events[-1]
    assert isinstance(done, ResponseDone), done
    said = "".join(e.text for e in events if isinstance(e, TextDelta))
    audio = [e.audio for e in events if isinstance(e, AudioDelta)]
    return said, torch.cat(audio) if audio else torch.zeros(0), done


def assert_like_reference(
    reference: Any, conversation: list[int], said: str, audio: torch.Tensor
) -> None:
    """``said`` and ``audio`` == HF's reply to ``conversation`` (ending with a user turn, or
    a system turn behind one)."""
    prompt = [*conversation, *ASSISTANT_OPENING]
    ids = [ord(c) for c in said]  # byte-level tokens of printable text
    reference.captured.clear()
    sequences, wav = hf_reply(reference, prompt, len(ids), 2 * len(ids), MIN_TOKENS)
    assert sequences[0, len(prompt) :].tolist() == [*ids, Tokens.IM_END]
    expected = wav.reshape(-1)
    # HF trims the decoder's last 555 samples (they wait for a next frame); the stream
    # ends the utterance with them.
    assert audio.numel() == expected.numel() + 555
    assert (audio[: expected.numel()] - expected).abs().max().item() < 1e-4


async def test_three_turns_through_the_pipeline_equal_hf_generate(
    cache: Path, reference: Any
) -> None:
    conversation: list[int] = []
    async with OmniPipeline(spec(cache)) as omni, omni.session() as session:
        for text in TURNS:
            said, audio, done = await reply(session, text)
            assert done.status == "completed"
            assert said
            conversation += hf_user_turn({"text": text}, 1)[0]
            assert_like_reference(reference, conversation, said, audio)
            conversation += assistant_turn([ord(c) for c in said])


async def test_instructions_through_the_pipeline_equal_hf_generate_with_a_system_message(
    cache: Path, reference: Any
) -> None:
    """HF's talker skips system turns: ours never gets their rows, and the audio agrees."""
    instructions = ["You answer briefly.", "Now you are cheerful.", "Say goodbye."]
    conversation: list[int] = []
    replies: list[str] = []
    async with OmniPipeline(spec(cache)) as omni:
        async with omni.session() as session:
            plain = (await reply(session, TURNS[0]))[0]
        async with omni.session() as session:
            for turn, (text, system) in enumerate(zip(TURNS, instructions, strict=True)):
                user = hf_user_turn({"text": text}, 1)[0]
                if turn < 2:  # set between replies: before the user turn
                    await session.send(fields={INSTRUCTIONS_FIELD: system})
                    await session.send(text=text)
                    conversation += [*system_turn(system), *user]
                else:  # set while the user turn is open: right behind it
                    await session.send(text=text)
                    await session.send(fields={INSTRUCTIONS_FIELD: system})
                    conversation += [*user, *system_turn(system)]
                said, audio, done = await answer(session)
                assert done.status == "completed"
                assert_like_reference(reference, conversation, said, audio)
                conversation += assistant_turn([ord(c) for c in said])
                replies.append(said)
    assert replies[0] != plain  # the instructions were read


async def test_an_assistant_turn_given_as_history_equals_hf_generate_with_it(
    cache: Path, reference: Any
) -> None:
    """HF's talker skips earlier assistant turns: so does ours, given or generated."""
    given = "Sure, it is sunny."
    async with OmniPipeline(spec(cache)) as omni, omni.session() as session:
        await session.send(text=TURNS[0])
        await session.add_reply(given)
        said, audio, done = await reply(session, TURNS[1])
    assert done.status == "completed"
    conversation = [
        *hf_user_turn({"text": TURNS[0]}, 1)[0],
        *assistant_turn([ord(c) for c in given]),  # byte-level tokens of printable text
        *hf_user_turn({"text": TURNS[1]}, 1)[0],
    ]
    assert_like_reference(reference, conversation, said, audio)


async def test_a_responses_own_instructions_through_the_pipeline_hold_for_it_alone(
    cache: Path, reference: Any
) -> None:
    own = "You answer briefly."
    conversation: list[int] = []
    async with OmniPipeline(spec(cache)) as omni, omni.session() as session:
        await session.send(text=TURNS[0])
        response = await session.respond(voice="ethan", instructions=own)
        events: list[Event] = [e async for e in response.events()]
        said = "".join(e.text for e in events if isinstance(e, TextDelta))
        audio = torch.cat([e.audio for e in events if isinstance(e, AudioDelta)])
        conversation += hf_user_turn({"text": TURNS[0]}, 1)[0]
        assert_like_reference(reference, [*conversation, *system_turn(own)], said, audio)
        conversation += assistant_turn([ord(c) for c in said])  # and no system turn
        said, audio, done = await reply(session, TURNS[1])
        assert done.status == "completed"
        conversation += hf_user_turn({"text": TURNS[1]}, 1)[0]
        assert_like_reference(reference, conversation, said, audio)


async def test_barge_in_then_truncate_leaves_every_stage_where_the_user_stopped_listening(
    cache: Path, reference: Any
) -> None:
    async with OmniPipeline(spec(cache)) as omni, omni.session() as session:
        await session.send(text=TURNS[0])
        response = await session.respond(voice="ethan")
        said, heard = "", 0
        async for event in response.events():
            if isinstance(event, TextDelta):
                said += event.text
            elif isinstance(event, AudioDelta):
                heard += event.audio.numel()
                await response.cancel()  # the user spoke over the first audio
        assert isinstance(response.done, ResponseDone)
        assert response.done.status == "cancelled"
        heard_ms = 1000 * heard / configs.OUTPUT_SAMPLE_RATE
        await session.truncate(audio_ms=heard_ms)
        # The talker maps the heard frames to the tokens they voiced: frame k is
        # conditioned on tokens 0..k, and a stream's first frame lacks 555 samples.
        frames = math.ceil((heard + 555) / configs.SAMPLES_PER_FRAME)
        kept = said[: min(frames, len(said))]
        assert 0 < len(kept) < len(said)
        # The tiny thinker's next reply barely depends on what it said before (random
        # weights): read its cache to see the cut.
        thinker = actor_instance((await omni.stages())["thinker"]).engine
        assert isinstance(thinker, ThinkerEngine)
        opened = len(hf_user_turn({"text": TURNS[0]}, 1)[0]) + 3  # + assistant opening

        async def cut() -> None:
            assert thinker.cached_tokens(session._key) == opened + len(kept)

        await eventually(cut, timeout=10)

        next_said, next_audio, done = await reply(session, TURNS[1])
        assert done.status == "completed"
        conversation = [
            *hf_user_turn({"text": TURNS[0]}, 1)[0],
            *assistant_turn([ord(c) for c in kept]),
            *hf_user_turn({"text": TURNS[1]}, 1)[0],
        ]
        assert_like_reference(reference, conversation, next_said, next_audio)


async def test_cleared_input_is_as_if_never_sent(cache: Path) -> None:
    async with OmniPipeline(spec(cache)) as omni:
        async with omni.session() as session:
            await session.send(text="Something to take back")
            await session.clear()
            cleared = await reply(session, TURNS[0])
        async with omni.session() as session:
            plain = await reply(session, TURNS[0])
    assert cleared[0] == plain[0]
    assert torch.equal(cleared[1], plain[1])


@pytest.mark.parametrize("victim", ["thinker", "talker"])
async def test_a_stage_killed_during_a_reply_costs_that_reply_not_the_conversation(
    cache: Path, reference: Any, victim: str
) -> None:
    """SIGKILL a stage's worker during turn 2's reply: that reply fails with
    ``stage_failed``, the session stays open, and responding again (its user turn stays
    committed) gives the reply HF gives to the conversation as if nothing had happened,
    and so does turn 3: the conversation was replayed onto the restarted stages."""
    raw = spec(cache).model_dump(by_alias=True)
    for stage in raw["stages"]:
        stage["process"] = True  # a kill needs a worker
    conversation: list[int] = []
    async with (
        OmniPipeline(PipelineSpec.model_validate(raw)) as omni,
        omni.session() as session,
    ):
        said, audio, _ = await reply(session, TURNS[0])
        conversation += hf_user_turn({"text": TURNS[0]}, 1)[0]
        assert_like_reference(reference, conversation, said, audio)
        conversation += assistant_turn([ord(c) for c in said])

        await session.send(text=TURNS[1])
        response = await session.respond(voice="ethan")
        killed = 0
        async for event in response.events():
            if isinstance(event, TextDelta) and not killed:
                killed = kill_worker((await omni.stages())[victim])
        failed = response.done
        assert isinstance(failed, ResponseDone), failed
        assert (failed.status, failed.code, failed.stage) == ("failed", "stage_failed", victim)
        assert not session.ended

        said, audio, done = await answer(session)  # respond again
        assert done.status == "completed", done
        conversation += hf_user_turn({"text": TURNS[1]}, 1)[0]
        assert_like_reference(reference, conversation, said, audio)
        conversation += assistant_turn([ord(c) for c in said])

        said, audio, done = await reply(session, TURNS[2])
        conversation += hf_user_turn({"text": TURNS[2]}, 1)[0]
        assert_like_reference(reference, conversation, said, audio)
        assert worker_pid((await omni.stages())[victim]) != killed
