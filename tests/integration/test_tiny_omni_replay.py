"""tiny-omni's thinker taking a conversation back: ``reply`` marks and ``last_reply``.

When a stage restarts, the session sends the whole conversation through the thinker
again: the caller's chunks and marks as they were sent, each earlier reply as a
``reply`` mark carrying the token ids the engine reported (``last_reply``). The
yardstick is the original session: a replayed conversation must leave the engine
answering token for token as the original does, truncations and instructions included,
and give the talker the same user rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from thinker_driving import thinker
from thinker_steps import (
    AND,
    COMMIT,
    HI,
    broken,
    ids,
    items,
    reply,
    respond,
    truncate,
    user_rows,
)
from tiny_omni_ids import (
    ASSISTANT_OPENING,
    PRINTABLE,
    assistant_turn,
    user_turn,
)
from transformers import DynamicCache

from omni_actors.actors.engines.contract import (
    INSTRUCTIONS_FIELD,
    REPLY_FIELD,
    TURN_FIELD,
    Fields,
)
from omni_actors.actors.engines.qwen3_omni import stepping
from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerEngine
from omni_actors.actors.engines.thinker_ports import THINKER_INPUTS
from omni_actors.actors.engines.turn_marks import TurnMarkError

pytestmark = pytest.mark.integration


def user(text: str) -> list[int]:
    return user_turn(text)


def assistant(tokens: Sequence[int]) -> list[int]:
    return assistant_turn(tokens)


def reference(model: Any, conversation: list[int], count: int = 6) -> list[int]:
    """The greedy reply to ``conversation`` by plain forwards (the engine's token rules,
    ``<|im_end|>`` allowed from ``count`` tokens on)."""
    prompt = [*conversation, *ASSISTANT_OPENING]
    allowed = torch.full((model.config.text_config.vocab_size,), float("-inf"))
    allowed[list(PRINTABLE)] = 0.0
    cache = DynamicCache(config=model.config.text_config)
    step = stepping.thinker_forward(model, torch.tensor([prompt]), cache, 0, accept_layer=1)
    out: list[int] = []
    while len(out) < count:
        token = int((step.logits[0, -1] + allowed).argmax())
        out.append(token)
        position = len(prompt) + len(out) - 1
        step = stepping.thinker_forward(
            model, torch.tensor([[token]]), cache, position, accept_layer=1
        )
    return out


# -- replay ---------------------------------------------------------------------------


async def test_a_replayed_conversation_answers_as_the_original(cache_dir: Path, model: Any) -> None:
    assert REPLY_FIELD in ThinkerEngine.inputs
    assert REPLY_FIELD in THINKER_INPUTS  # every thinker takes replies back
    async with thinker(cache_dir) as engine:
        first = await respond(engine, "a", HI)
        r1 = ids(first)
        assert engine.last_reply("a") == tuple(r1)
        second = await respond(engine, "a", AND)
        r2 = ids(second)
        assert engine.last_reply("a") == tuple(r2)
        replayed = await respond(engine, "b", HI, COMMIT, reply(r1), AND)
        assert engine.last_reply("b") == tuple(r2)
        assert engine.cached_tokens("b") == engine.cached_tokens("a")
        # The conversation goes on alike: the carries match too.
        after_a, after_b = [ids(await respond(engine, s, {"text": "Ok"})) for s in "ab"]
        assert engine.last_reply("unknown") is None
    assert ids(replayed) == r2
    assert r2 == reference(model, [*user("Hi"), *assistant(r1), *user(str(AND["text"]))])
    # The talker gets the user turns' rows as the first time, and nothing for the reply.
    assert torch.equal(user_rows(replayed), user_rows(first + second))
    assert after_b == after_a


@pytest.mark.parametrize("kept", [0, 2, 6])
async def test_a_truncation_after_a_replayed_reply_cuts_it_as_the_original(
    cache_dir: Path, kept: int
) -> None:
    async with thinker(cache_dir) as engine:
        r1 = ids(await respond(engine, "a", HI))
        r2 = ids(await respond(engine, "a", truncate(kept), AND))
        replayed = await respond(engine, "b", HI, COMMIT, reply(r1), truncate(kept), AND)
        assert engine.cached_tokens("b") == engine.cached_tokens("a")
        uncut = ids(await respond(engine, "c", HI, COMMIT, reply(r1), AND))
    assert ids(replayed) == r2
    assert (uncut == r2) == (kept == len(r1))  # a cut changes the context


async def test_a_reply_mark_commits_the_open_turn_and_its_waiting_instructions(
    cache_dir: Path,
) -> None:
    brief: Fields = {INSTRUCTIONS_FIELD: "Be brief."}
    async with thinker(cache_dir) as engine:
        first = await respond(engine, "a", HI, brief)
        r1 = ids(first)
        r2 = ids(await respond(engine, "a", AND))
        # No commit before the reply mark: it closes the turn (instructions behind it).
        replayed = await respond(engine, "b", HI, brief, reply(r1), AND)
    assert ids(replayed) == r2
    # The turn's rows go out as prefilled, its end when the reply mark commits it,
    # before anything else.
    assert all("token_ids" not in out for out in replayed[:2])
    assert torch.equal(user_rows(replayed[:2]), user_rows(first))


async def test_an_empty_reply_is_an_assistant_turn(cache_dir: Path, model: Any) -> None:
    async with thinker(cache_dir) as engine:
        out = await respond(engine, "s", HI, COMMIT, reply([]))
        # The turn, the empty reply, the next reply's opening and 5 of its 6 tokens.
        assert engine.cached_tokens("s") == len(user("Hi")) + len(assistant([])) + 3 + 5
    assert ids(out) == reference(model, [*user("Hi"), *assistant([])])


async def test_a_replay_with_a_deleted_turn_answers_the_conversation_without_it(
    cache_dir: Path, model: Any
) -> None:
    """What a deleted item leaves to replay: a reply with no user turn before it (the
    first turn deleted), or two user turns in a row (the reply between them deleted)."""
    async with thinker(cache_dir) as engine:
        r1 = ids(await respond(engine, "a", HI))
        no_first_turn = ids(await respond(engine, "b", COMMIT, reply(r1), AND))
        no_first_reply = ids(await respond(engine, "c", HI, COMMIT, COMMIT, AND))
    assert no_first_turn == reference(model, [*assistant(r1), *user(str(AND["text"]))])
    assert no_first_reply == reference(model, [*user("Hi"), *user(str(AND["text"]))])


# -- last_reply -----------------------------------------------------------------------


async def test_last_reply_is_the_decoded_reply_never_a_replayed_one(cache_dir: Path) -> None:
    async with thinker(cache_dir) as engine:
        r1 = ids(await respond(engine, "a", HI))
        # Input of replay marks only: the reply decoded at its end is the one reported.
        decoded = ids(await respond(engine, "b", HI, COMMIT, reply(r1)))
        assert engine.last_reply("b") == tuple(decoded)
        assert decoded != r1
        # A replay whose response is closed before its first token reports none.
        outputs = engine.generate("c", items([HI, COMMIT, reply(r1)]))
        assert "user" in await anext(outputs)
        await outputs.aclose()
        assert engine.last_reply("c") is None
        # A failed response reports none, even after a reply it decoded before.
        with pytest.raises(RuntimeError, match="input broke"):
            await respond(engine, "a", AND, broken)
        assert engine.last_reply("a") is None
        await engine.release("a")
        assert engine.last_reply("a") is None


# -- cancel ---------------------------------------------------------------------------


async def test_closing_a_replay_keeps_what_it_took(cache_dir: Path) -> None:
    async with thinker(cache_dir) as engine:
        r1 = ids(await respond(engine, "a", HI))
        r2 = ids(await respond(engine, "a", AND))
        # Closed at the rows the turn sent ahead of the reply mark: the turn stays,
        # committed; the mark is not taken.
        outputs = engine.generate("b", items([HI, reply(r1), AND]))
        await anext(outputs)
        await outputs.aclose()
        assert engine.cached_tokens("b") == len(user("Hi"))
        assert engine.last_reply("b") is None
        # Closed at the last turn's rows, sent as prefilled: the reply stays, the turn
        # stays committed, and the next response answers it.
        outputs = engine.generate("c", items([HI, reply(r1), AND]))
        rows = ["user", "user_edits", "user_mask"]
        assert [sorted(await anext(outputs)) for _ in range(3)] == [rows] * 3
        await outputs.aclose()
        assert engine.cached_tokens("c") == len(user("Hi")) + 3 + len(r1) + 2 + len(
            user(str(AND["text"]))
        )
        assert engine.last_reply("c") is None
        answer = ids(await respond(engine, "c"))
        assert engine.last_reply("c") == tuple(answer)
        # Closed in the reply decoded after a replay: it is reported as far as yielded.
        outputs = engine.generate("d", items([HI, COMMIT, reply(r1), AND]))
        got = [await anext(outputs) for _ in range(5)]  # three rows, two tokens
        await outputs.aclose()
        assert engine.last_reply("d") == tuple(ids(got)) == tuple(r2[:2])
        assert engine.generating == set()
    assert answer == r2


# -- failure --------------------------------------------------------------------------


async def test_a_failed_replay_rolls_back_to_where_it_started(cache_dir: Path) -> None:
    async with thinker(cache_dir) as engine:
        r1 = ids(await respond(engine, "a", HI))
        r2 = ids(await respond(engine, "a", truncate(2), AND))
        await respond(engine, "b", {"text": "Before"})
        before = engine.cached_tokens("b")
        for cut in ([], [truncate(2)]):  # a cut of a reply taken back goes with it
            with pytest.raises(RuntimeError, match="input broke"):
                await respond(engine, "b", HI, COMMIT, reply(r1), *cut, AND, broken)
            assert engine.cached_tokens("b") == before
            assert engine.last_reply("b") is None
        replayed = ids(await respond(engine, "c", HI, COMMIT, reply(r1), truncate(2), AND))
        assert engine.active_sessions == {"a", "b", "c"}
    assert replayed == r2


async def test_a_malformed_reply_mark_is_refused_and_the_session_goes_on(
    cache_dir: Path,
) -> None:
    async with thinker(cache_dir) as engine:
        r1 = ids(await respond(engine, "a", HI))
        r2 = ids(await respond(engine, "a", AND))
        vocab = engine._model.text_config.vocab_size
        bad: list[tuple[Fields, str]] = [
            ({TURN_FIELD: "reply"}, "a 1-D integer tensor of token ids, got nothing"),
            ({TURN_FIELD: "reply", REPLY_FIELD: "Hi"}, "got a str"),
            ({**reply(r1), REPLY_FIELD: torch.tensor([r1])}, "got a 2-D torch.int64 tensor"),
            ({**reply(r1), REPLY_FIELD: torch.tensor(r1, dtype=torch.float32)}, "float32"),
            (reply([*r1, vocab]), rf"must be in \[0, {vocab}\).*got {vocab}"),
            (reply([-1]), "got -1"),
        ]
        for mark, message in bad:
            with pytest.raises(TurnMarkError, match=message):
                await respond(engine, "b", HI, COMMIT, mark, AND)
            assert engine.cached_tokens("b") == 0
            assert engine.active_sessions == {"a", "b"}
        replayed = ids(await respond(engine, "b", HI, COMMIT, reply(r1), AND))
    assert replayed == r2
