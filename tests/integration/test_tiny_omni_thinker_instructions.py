"""tiny-omni's thinker following instructions (a system prompt), driven directly.

The yardstick is the one of ``test_tiny_omni_thinker_turns``: the conversation written
out token by token, with each system turn where the instructions were set, decoded by
plain forwards. Every rollback (a clear, a truncation, a cancelled or failed response)
must keep the instructions, and no row of a system turn may reach the talker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from test_tiny_omni_thinker_turns import (
    CLEAR,
    COMMIT,
    Inputs,
    assistant,
    cached_at,
    ids,
    reference,
    respond,
    thinker,
    truncate,
    user,
    user_outputs,
)
from thinker_steps import talker_rows
from tiny_omni_ids import (
    encode,
    system_turn,
)

from omni_actors.actors.engines.contract import INSTRUCTIONS_FIELD, Fields
from omni_actors.actors.engines.qwen3_omni.vocabulary import Vocabulary
from omni_actors.pipeline.spec.pipeline import load_pipeline

pytestmark = pytest.mark.integration

TERSE, CHATTY = "Answer in one word.", "Talk a lot, please."


def instruct(text: str) -> Fields:
    return {INSTRUCTIONS_FIELD: text}


def system(text: str) -> list[int]:
    """A system turn of the chat template, written out."""
    return system_turn(text)


def test_the_tiny_omni_thinker_declares_instructions(cache_dir: Path) -> None:
    assert INSTRUCTIONS_FIELD in load_pipeline("tiny-omni").entry_inputs()
    vocabulary = Vocabulary.load(cache_dir / "tiny-omni" / "seed-0")
    assert list(vocabulary.system_turn(TERSE)) == system(TERSE)
    assert vocabulary.system_turn("") == ()


async def test_instructions_come_as_a_system_turn_before_the_user_turn(
    cache_dir: Path, model: Any
) -> None:
    async with thinker(cache_dir) as engine:
        instructed = await respond(
            engine,
            "s",
            instruct(TERSE),
            cached_at(engine, "s", len(system(TERSE))),  # prefilled at once
            {"text": "Hi"},
        )
        plain = await respond(engine, "t", {"text": "Hi"})
    expected = reference(model, [*system(TERSE), *user("Hi")], 6)
    assert ids(instructed) == expected
    assert expected != ids(plain)  # the instructions changed the answer
    # The talker's rows are the user turn's alone, as without instructions.
    assert torch.equal(torch.cat(user_outputs(instructed)), torch.cat(user_outputs(plain)))
    assert torch.equal(
        torch.cat(user_outputs(instructed)), model.get_input_embeddings()(torch.tensor(user("Hi")))
    )


async def test_instructions_in_a_chunk_with_text_come_first(cache_dir: Path, model: Any) -> None:
    async with thinker(cache_dir) as engine:
        together = await respond(engine, "s", {**instruct(TERSE), "text": "Hi"})
    assert ids(together) == reference(model, [*system(TERSE), *user("Hi")], 6)


async def test_changed_instructions_come_between_the_turns(cache_dir: Path, model: Any) -> None:
    async with thinker(cache_dir) as engine:
        first = ids(await respond(engine, "s", instruct(TERSE), {"text": "Hi"}))
        second = await respond(engine, "s", instruct(CHATTY), {"text": "And?"})
    conversation = [
        *system(TERSE),
        *user("Hi"),
        *assistant(first),
        *system(CHATTY),
        *user("And?"),
    ]
    assert ids(second) == reference(model, conversation, 6)


async def test_instructions_during_a_user_turn_wait_for_its_commit(
    cache_dir: Path, model: Any
) -> None:
    async with thinker(cache_dir) as engine:
        committed = await respond(
            engine,
            "s",
            {"text": "Hel"},
            instruct(TERSE),  # replaced before the commit: never prefilled
            instruct(CHATTY),
            {"text": "lo"},
            COMMIT,
            cached_at(engine, "s", len(user("Hello")) + len(system(CHATTY))),
            {"text": "Hi"},
            instruct(TERSE),  # waits for the end of input: between the turn and the reply
        )
    conversation = [*user("Hello"), *system(CHATTY), *user("Hi"), *system(TERSE)]
    assert ids(committed) == reference(model, conversation, 6)
    table = model.get_input_embeddings()  # the user turns' rows, no system turn's
    assert torch.equal(talker_rows(committed), table(torch.tensor([*user("Hello"), *user("Hi")])))


async def test_empty_instructions_set_none(cache_dir: Path, model: Any) -> None:
    async with thinker(cache_dir) as engine:
        empty = await respond(
            engine,
            "s",
            instruct(""),
            cached_at(engine, "s", 0),
            {"text": "Hi"},
            instruct(TERSE),
            instruct(""),  # takes back the waiting ones
        )
        with pytest.raises(ValueError, match="must be text"):
            await respond(engine, "t", {INSTRUCTIONS_FIELD: torch.zeros(1)})
    assert ids(empty) == reference(model, user("Hi"), 6)


async def test_a_clear_keeps_the_instructions(cache_dir: Path, model: Any) -> None:
    async with thinker(cache_dir) as engine:
        prefilled = await respond(
            engine, "s", instruct(TERSE), {"text": "junk"}, CLEAR, {"text": "Hi"}
        )
        waiting = await respond(
            engine,
            "t",
            {"text": "junk"},
            instruct(TERSE),
            CLEAR,  # the turn is gone: the instructions are prefilled now
            cached_at(engine, "t", len(system(TERSE))),
            {"text": "Hi"},
        )
    expected = reference(model, [*system(TERSE), *user("Hi")], 6)
    assert ids(prefilled) == ids(waiting) == expected


async def test_a_truncation_keeps_the_instructions_after_the_reply(
    cache_dir: Path, model: Any
) -> None:
    async def broken() -> None:
        raise RuntimeError("input broke")

    async with thinker(cache_dir) as engine:
        sessions = ("marked", "late", "failed", "waiting")
        first = {s: ids(await respond(engine, s, {"text": "Hi"})) for s in sessions}
        marked = await respond(engine, "marked", instruct(TERSE), truncate(2), {"text": "And?"})
        # Input behind the system turn when the cut comes: both are fed again.
        late = await respond(
            engine, "late", instruct(TERSE), {"text": "And"}, truncate(2), {"text": "?"}
        )
        # A failure after the cut comes back to it, instructions included, once.
        for session, before_cut in (("failed", True), ("waiting", False)):
            steps = [instruct(TERSE), {"text": "x"}]
            steps = steps if before_cut else steps[::-1]
            with pytest.raises(RuntimeError, match="input broke"):
                await respond(engine, session, *steps, truncate(2), broken)
        failed = await respond(engine, "failed", {"text": "And?"})
        waiting = await respond(engine, "waiting", {"text": "And?"})
    assert len(set(map(tuple, first.values()))) == 1
    heard = [*user("Hi"), *assistant(first["marked"][:2]), *system(TERSE)]
    expected = reference(model, [*heard, *user("And?")], 6)
    assert ids(marked) == ids(late) == ids(failed) == ids(waiting) == expected


async def test_a_failed_response_keeps_the_instructions_it_set(cache_dir: Path, model: Any) -> None:
    async def broken() -> None:
        raise RuntimeError("input broke")

    async with thinker(cache_dir) as engine:
        first = ids(await respond(engine, "s", {"text": "Hi"}))
        before = engine.cached_tokens("s")
        with pytest.raises(RuntimeError, match="input broke"):
            await respond(engine, "s", instruct(TERSE), {"text": "lost"}, COMMIT, broken)
        assert engine.cached_tokens("s") == before  # the turns it committed are gone
        with pytest.raises(RuntimeError, match="input broke"):
            # Waiting behind an open turn when the response fails: kept all the same.
            await respond(engine, "t", {"text": "lost"}, instruct(TERSE), broken)
        after = await respond(engine, "s", {"text": "And?"})
        fresh = await respond(engine, "t", {"text": "And?"})
    conversation = [*user("Hi"), *assistant(first), *system(TERSE), *user("And?")]
    assert ids(after) == reference(model, conversation, 6)
    assert ids(fresh) == reference(model, [*system(TERSE), *user("And?")], 6)


async def test_a_reply_cancelled_before_its_first_token_keeps_waiting_instructions(
    cache_dir: Path, model: Any
) -> None:
    async with thinker(cache_dir) as engine:
        inputs = Inputs([{"text": "Hi"}, instruct(TERSE), {"text": "!"}])
        outputs = engine.generate("s", inputs)
        sent = [await anext(outputs) for _ in range(2)]  # the turn's rows, as prefilled
        assert all("token_ids" not in out for out in sent)
        await outputs.aclose()
        # The turn is committed, the instructions behind it; no reply.
        turn = [*user("Hi")[:-2], *encode("!"), *user("Hi")[-2:]]
        assert engine.cached_tokens("s") == len(turn) + len(system(TERSE))
        answer = await respond(engine, "s")
    assert torch.equal(talker_rows(sent), model.get_input_embeddings()(torch.tensor(turn[:-2])))
    assert ids(answer) == reference(model, [*turn, *system(TERSE)], 6)
