"""The vLLM thinker taking a conversation back: ``reply`` marks and ``last_reply``.

When a stage restarts, the session sends the whole conversation through the thinker
again: the caller's chunks and marks as they were sent, each earlier reply as a
``reply`` mark carrying the token ids the engine reported (``last_reply``). The
yardstick is the original session on the same engine (greedy, float32): a replayed
conversation must leave the same token list and answer token for token as the original
does, truncations included, and give the talker the same user rows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch
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

from omni_actors.actors.engines.contract import (
    INSTRUCTIONS_FIELD,
    REPLY_FIELD,
    TURN_FIELD,
    Fields,
    ResponseOptions,
)
from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerEngine
from omni_actors.actors.engines.thinker_ports import THINKER_INPUTS

from .conftest import thinkers

LIMITS = {"max_new_tokens": 10, "min_new_tokens": 4}


pytestmark = pytest.mark.asyncio(loop_scope="module")  # one vLLM for the module


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engines(cache_dir: Path) -> AsyncIterator[tuple[Any, ThinkerEngine]]:
    async with thinkers(cache_dir, LIMITS) as pair:
        yield pair


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def no_session_left(engines: tuple[Any, ThinkerEngine]) -> AsyncIterator[None]:
    """Every test's sessions are dropped after it, failed or not: vLLM runs at most
    ``max_num_seqs`` requests, and a session left open holds one (the next would wait)."""
    yield
    vllm, torch_thinker = engines
    for session in list(vllm._sessions):
        await vllm.abort(session)
    for session in list(torch_thinker.active_sessions):
        await torch_thinker.abort(session)


def token_list(vllm: Any, session: str) -> list[int]:
    """The conversation as the session's vLLM request should hold it (the engine's
    own bookkeeping: what a replay must rebuild exactly)."""
    return list(vllm._sessions[session].history.tokens)


def requests_of(vllm: Any, session: str) -> set[str]:
    return {r for r in vllm.running_requests() if r.endswith(f"-{session}")}


# -- replay ---------------------------------------------------------------------------


async def test_a_replayed_conversation_answers_as_the_original(engines: Any) -> None:
    vllm, torch_thinker = engines
    assert REPLY_FIELD in vllm.inputs
    assert REPLY_FIELD in THINKER_INPUTS  # every thinker takes replies back
    first = await respond(vllm, "a", HI)
    r1 = ids(first)
    assert len(r1) >= LIMITS["min_new_tokens"]
    assert vllm.last_reply("a") == tuple(r1)
    second = await respond(vllm, "a", AND)
    r2 = ids(second)
    assert vllm.last_reply("a") == tuple(r2)
    replayed = await respond(vllm, "b", HI, COMMIT, reply(r1), AND)
    assert ids(replayed) == r2
    assert vllm.last_reply("b") == tuple(r2)
    assert token_list(vllm, "b") == token_list(vllm, "a")
    # The talker gets the user turns' rows as the first time, and nothing for the reply.
    assert torch.equal(user_rows(replayed), user_rows(first + second))
    # The conversation goes on alike.
    after_a, after_b = [ids(await respond(vllm, s, {"text": "Ok"})) for s in "ab"]
    assert after_b == after_a
    # tiny-omni's torch thinker takes the same replay to the same answer.
    on_torch = await respond(torch_thinker, "b", HI, COMMIT, reply(r1), AND)
    assert ids(on_torch) == r2
    assert vllm.last_reply("unknown") is None


@pytest.mark.parametrize("kept", [0, 2])
async def test_a_truncation_after_a_replayed_reply_cuts_it_as_the_original(
    engines: Any, kept: int
) -> None:
    vllm, _ = engines
    a, b, c = (f"{name}{kept}" for name in "abc")
    r1 = ids(await respond(vllm, a, HI))
    r2 = ids(await respond(vllm, a, truncate(kept), AND))
    opened: list[set[str]] = []

    async def note_request() -> None:
        opened.append(requests_of(vllm, b))

    replayed = await respond(
        vllm, b, HI, note_request, COMMIT, reply(r1), truncate(kept), note_request, AND
    )
    assert ids(replayed) == r2
    assert token_list(vllm, b) == token_list(vllm, a)
    # The reply waited for what follows it: the cut touched nothing vLLM held, and the
    # request opened for the first turn still holds the conversation.
    assert len(opened[0]) == 1
    assert opened[1] == opened[0]
    uncut = ids(await respond(vllm, c, HI, COMMIT, reply(r1), AND))
    assert uncut != r2  # the cut changed the context


async def test_a_reply_mark_commits_the_open_turn_and_its_waiting_instructions(
    engines: Any,
) -> None:
    vllm, _ = engines
    brief: Fields = {INSTRUCTIONS_FIELD: "Be brief."}
    first = await respond(vllm, "a", HI, brief)
    r1 = ids(first)
    r2 = ids(await respond(vllm, "a", AND))
    # No commit before the reply mark: it closes the turn (instructions behind it).
    replayed = await respond(vllm, "b", HI, brief, reply(r1), AND)
    assert ids(replayed) == r2
    assert token_list(vllm, "b") == token_list(vllm, "a")
    # The turn's rows go out as it is prefilled, the rest when the reply mark commits
    # it, before anything else.
    assert torch.equal(user_rows(replayed[:2]), user_rows(first))


async def test_an_empty_reply_mark_is_an_assistant_turn_as_on_torch(engines: Any) -> None:
    vllm, torch_thinker = engines
    got = await respond(vllm, "e", HI, COMMIT, reply([]))
    want = await respond(torch_thinker, "e", HI, COMMIT, reply([]))
    assert ids(got) == ids(want)
    assert torch.equal(user_rows(got), user_rows(want))


async def test_an_assistant_turn_given_by_its_words_is_its_encoded_ids(engines: Any) -> None:
    vllm, torch_thinker = engines
    words = "Sure, here it is."
    encoded = vllm.tokenizer.encode(words, add_special_tokens=False)
    given = await respond(vllm, "w", HI, {TURN_FIELD: "reply", "text": words}, AND)
    as_ids = await respond(vllm, "i", HI, COMMIT, reply(encoded), AND)
    assert ids(given) == ids(as_ids)
    assert token_list(vllm, "w") == token_list(vllm, "i")
    assert torch.equal(user_rows(given), user_rows(as_ids))
    on_torch = await respond(torch_thinker, "w", HI, {TURN_FIELD: "reply", "text": words}, AND)
    assert ids(on_torch) == ids(given)


class _Options:
    """A response's input with its options, as a stage hands it to the engine."""

    def __init__(self, steps: list[Fields], options: ResponseOptions) -> None:
        self.options = options
        self._items = items(steps)

    def __aiter__(self) -> _Options:
        return self

    async def __anext__(self) -> Fields:
        return await anext(self._items)


async def test_a_responses_own_instructions_hold_for_its_reply_alone(engines: Any) -> None:
    vllm, torch_thinker = engines
    own = ResponseOptions(instructions="Answer in one word.")
    first = [out async for out in vllm.generate("own", _Options([HI], own))]
    r1 = ids(first)
    assert vllm.last_reply("own") == tuple(r1)
    second = await respond(vllm, "own", AND)
    plain = await respond(vllm, "plain", HI, COMMIT, reply(r1), AND)
    assert ids(second) == ids(plain)
    assert token_list(vllm, "own") == token_list(vllm, "plain")  # no system turn left
    assert torch.equal(user_rows(first + second), user_rows(plain))
    # tiny-omni's torch thinker follows them to the same reply.
    on_torch = [out async for out in torch_thinker.generate("own", _Options([HI], own))]
    assert ids(on_torch) == r1


# -- last_reply -----------------------------------------------------------------------


async def test_last_reply_is_the_decoded_reply_as_far_as_it_was_yielded(engines: Any) -> None:
    vllm, _ = engines
    r1 = ids(await respond(vllm, "a", HI))
    # Input of replay marks only: the reply decoded at its end is the one reported.
    decoded = ids(await respond(vllm, "b", HI, COMMIT, reply(r1)))
    assert vllm.last_reply("b") == tuple(decoded)
    assert decoded != r1
    # A replay closed at the rows of its turn, before any token, reports none.
    outputs = vllm.generate("c", items([HI, COMMIT, reply(r1)]))
    assert "user" in await anext(outputs)
    await outputs.aclose()
    assert vllm.last_reply("c") is None
    # A reply closed after two tokens is reported as far as it was yielded.
    outputs = vllm.generate("d", items([HI]))
    got: list[Fields] = []
    while len(ids(got)) < 2:  # the turn's rows, then two tokens
        got.append(await anext(outputs))
    await outputs.aclose()
    assert vllm.last_reply("d") == tuple(ids(got)) == tuple(r1[:2])
    # A failed response reports none, even after a reply it decoded before.
    with pytest.raises(RuntimeError, match="input broke"):
        await respond(vllm, "a", AND, broken)
    assert vllm.last_reply("a") is None
    await vllm.release("a")
    assert vllm.last_reply("a") is None


# -- failure --------------------------------------------------------------------------


async def test_a_failed_replay_rolls_back_to_where_it_started(engines: Any) -> None:
    vllm, _ = engines
    r1 = ids(await respond(vllm, "a", HI))
    await respond(vllm, "a", truncate(2), AND)
    for session in "bc":
        await respond(vllm, session, {"text": "Before"})
    before = token_list(vllm, "b")
    for cut in ([], [truncate(2)]):  # a cut of a reply taken back goes with it
        with pytest.raises(RuntimeError, match="input broke"):
            await respond(vllm, "b", HI, COMMIT, reply(r1), *cut, AND, broken)
        assert token_list(vllm, "b") == before
        assert vllm.last_reply("b") is None
    # The session goes on as its twin that never failed.
    replay = [HI, COMMIT, reply(r1), truncate(2), AND]
    got, want = [ids(await respond(vllm, s, *replay)) for s in "bc"]
    assert got == want
    assert token_list(vllm, "b") == token_list(vllm, "c")


async def test_a_malformed_reply_mark_is_refused_and_the_session_goes_on(engines: Any) -> None:
    from omni_actors.actors.engines.vllm.thinker import VllmInputError

    vllm, _ = engines
    r1 = ids(await respond(vllm, "a", HI))
    r2 = ids(await respond(vllm, "a", AND))
    vocab = vllm.embeddings.shape[0]
    bad: list[tuple[Fields, str]] = [
        ({TURN_FIELD: "reply"}, "a 1-D integer tensor of token ids, got nothing"),
        ({TURN_FIELD: "reply", REPLY_FIELD: "Hi"}, "got a str"),
        ({**reply(r1), REPLY_FIELD: torch.tensor([r1])}, "got a 2-D torch.int64 tensor"),
        ({**reply(r1), REPLY_FIELD: torch.tensor(r1, dtype=torch.float32)}, "float32"),
        (reply([*r1, vocab]), rf"must be in \[0, {vocab}\).*got {vocab}"),
        (reply([-1]), "got -1"),
    ]
    for mark, message in bad:
        with pytest.raises(VllmInputError, match=message):
            await respond(vllm, "b", HI, COMMIT, mark, AND)
        assert token_list(vllm, "b") == []
        assert vllm.last_reply("b") is None
    replayed = ids(await respond(vllm, "b", HI, COMMIT, reply(r1), AND))
    assert replayed == r2
