"""The vLLM thinker driven directly, against tiny-omni's torch thinker on the same weights.

Every comparison runs one session at a time (greedy, float32): tokens, the talker's rows
and embeddings must equal the torch thinker's exactly, through turns, instructions, a
clear, a truncation and a cancelled reply (each rollback reopens the vLLM request). A
clip longer than one encoder window is the exception: vLLM frames each window on its own
(``audio_input``), so it is compared where the two token lists agree.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch
from thinker_steps import talker_rows, tensor

from omni_actors.actors.engines.contract import (
    INSTRUCTIONS_FIELD,
    KEPT_FIELD,
    NO_OPTIONS,
    TOOL_CALLS_FIELD,
    TOOL_RESULT_FIELD,
    TOOLS_FIELD,
    TURN_FIELD,
    Fields,
    ResponseOptions,
)
from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerEngine
from omni_actors.actors.engines.thinker_ports import USER_EDITS_FIELD
from omni_actors.testing import eventually

from .conftest import thinkers

COMMIT: Fields = {TURN_FIELD: "commit"}
CLEAR: Fields = {TURN_FIELD: "clear"}
LIMITS = {"max_new_tokens": 10, "min_new_tokens": 4}


def truncate(kept: int) -> Fields:
    return {TURN_FIELD: "truncate", KEPT_FIELD: torch.tensor(kept)}


class Inputs:
    """A response's input as a stage hands it over: the items, then ``options``."""

    def __init__(self, items: Iterable[Fields], options: ResponseOptions = NO_OPTIONS) -> None:
        self.items = list(items)
        self.options = options

    def __aiter__(self) -> AsyncIterator[Fields]:
        return self

    async def __anext__(self) -> Fields:
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)


pytestmark = pytest.mark.asyncio(loop_scope="module")  # one vLLM for the module


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engines(cache_dir: Path) -> AsyncIterator[tuple[Any, ThinkerEngine]]:
    async with thinkers(cache_dir, LIMITS) as pair:
        yield pair


def merged(outputs: list[Fields]) -> dict[str, Any]:
    """A response's outputs by field: tokens as a list, tensors concatenated, the
    talker's rows as it keeps them (``user_edits`` applied)."""
    tokens = [int(o["token_ids"][0]) for o in outputs if "token_ids" in o]  # type: ignore[index]
    sent = any("user" in o or USER_EDITS_FIELD in o for o in outputs)
    embeds = [o["embed"] for o in outputs if "embed" in o]
    first = next((o for o in outputs if "opening" in o), {})
    return {
        "tokens": tokens,
        "text": "".join(str(o["text"]) for o in outputs if "text" in o),
        "user": talker_rows(outputs) if sent else None,
        "user_mask": talker_rows(outputs, "user_mask") if sent else None,
        "embed": torch.cat(embeds) if embeds else None,  # type: ignore[arg-type]
        "opening": first.get("opening"),
        "tts": first.get("tts"),
    }


async def respond(
    engine: Any, session: str, items: Iterable[Fields], **options: Any
) -> dict[str, Any]:
    inputs = Inputs(items, ResponseOptions(**options))
    return merged([out async for out in engine.generate(session, inputs)])


async def both(
    engines: tuple[Any, ThinkerEngine],
    session: str,
    items: list[Fields],
    rows_atol: float = 0.0,
    **options: Any,
) -> dict[str, Any]:
    """Run ``items`` on both thinkers; equal outputs (the talker's rows within
    ``rows_atol``: hidden states at audio positions come from two attention kernels) and
    prompt tokens."""
    vllm, torch_thinker = engines
    got = await respond(vllm, session, list(items), **options)
    want = await respond(torch_thinker, session, list(items), **options)
    assert got["tokens"] == want["tokens"]
    assert got["text"] == want["text"]  # printable bytes: the torch thinker's text too
    for field in ("user", "user_mask", "embed", "opening", "tts"):
        if want[field] is None:
            assert got[field] is None, field
        elif field == "user" and rows_atol:
            torch.testing.assert_close(got[field], want[field], atol=rows_atol, rtol=0)
        else:
            assert torch.equal(got[field], want[field]), field
    # The context each reply came from, as each engine counts it (audio as expanded).
    assert vllm.prompt_tokens(session) == torch_thinker.prompt_tokens(session)
    return got


async def test_a_conversation_of_four_responses_equals_the_torch_thinker(engines: Any) -> None:
    vllm, torch_thinker = engines
    first = await both(engines, "three", [{"text": "Hello there!"}])
    assert len(first["tokens"]) >= LIMITS["min_new_tokens"]
    assert first["user"] is not None
    request = vllm.running_requests()
    await both(engines, "three", [{"text": "How are you?"}, COMMIT, {"text": "And you?"}])
    await both(engines, "three", [{INSTRUCTIONS_FIELD: "Be brief."}, {"text": "Bye"}], max_tokens=3)
    # That reply stopped at its limit: vLLM holds all but its last token, which the
    # next turn feeds first.
    await both(engines, "three", [{"text": "Really?"}])
    # No rollback happened: one vLLM request held the whole conversation.
    assert vllm.running_requests() == request
    await vllm.release("three")
    await torch_thinker.release("three")


async def test_tools_results_and_calls_taken_back_equal_the_torch_thinker(engines: Any) -> None:
    function = {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    tools = json.dumps([{"type": "function", "function": function}])
    call = {"type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    calls = json.dumps({"content": "Let me see.", "tool_calls": [call]})
    await both(
        engines, "tools", [{INSTRUCTIONS_FIELD: "Be brief.", TOOLS_FIELD: tools}, {"text": "Hi"}]
    )
    await both(
        engines,
        "tools",
        [
            {"text": "Weather?"},
            {TURN_FIELD: "reply", TOOL_CALLS_FIELD: calls},
            {TOOL_RESULT_FIELD: "sunny"},
            {TOOL_RESULT_FIELD: "warm"},
        ],
    )
    for engine in engines:
        await engine.release("tools")


async def test_clear_and_truncate_reopen_the_request_and_still_match(engines: Any) -> None:
    vllm, torch_thinker = engines
    await both(engines, "cut", [{"text": "Hi"}])
    before = vllm.running_requests()
    await both(engines, "cut", [{"text": "never mind"}, CLEAR, {"text": "Tell me more"}])
    after_clear = vllm.running_requests()
    assert after_clear != before  # the cleared turn had been prefilled: reopened
    await both(engines, "cut", [truncate(2), {"text": "What?"}])
    assert vllm.running_requests() != after_clear
    await vllm.release("cut")
    await torch_thinker.release("cut")


async def test_a_cancelled_reply_keeps_what_was_yielded(engines: Any) -> None:
    vllm, torch_thinker = engines
    for engine in (vllm, torch_thinker):
        replies = engine.generate("barge", Inputs([{"text": "Say a lot"}]))
        tokens = 0
        while tokens < 2:  # the turn's rows may come on their own first
            tokens += "token_ids" in await anext(replies)
        await replies.aclose()
    await both(engines, "barge", [{"text": "Go on"}])
    for engine in (vllm, torch_thinker):
        await engine.release("barge")


async def test_a_response_closed_at_rows_sent_ahead_commits_its_turn(engines: Any) -> None:
    vllm, torch_thinker = engines
    for engine in (vllm, torch_thinker):
        replies = engine.generate("closed", Inputs([{"text": "Hi"}, {"text": "there"}]))
        assert "user" in await anext(replies)  # the open turn's rows, ahead of its commit
        await replies.aclose()
        assert engine.last_reply("closed") is None
    # The talker holds the turn's rows: it stays, committed without a reply.
    await both(engines, "closed", [{"text": "Go on"}])
    await asyncio.gather(vllm.release("closed"), torch_thinker.release("closed"))


async def test_a_request_right_after_a_closed_session_is_answered_as_the_first(
    engines: Any,
) -> None:
    vllm, _ = engines
    items = [{"text": "Same words twice"}]
    first = await respond(vllm, "before", list(items))
    await vllm.release("before")  # its streaming request is closed, not aborted
    again = await respond(vllm, "after", list(items))
    await vllm.release("after")
    assert again["tokens"] == first["tokens"]
    assert torch.equal(again["user"], first["user"])


async def test_abort_mid_reply_leaves_no_request_in_vllm(engines: Any) -> None:
    vllm, _ = engines
    replies = vllm.generate("gone", Inputs([{"text": "Talk"}], ResponseOptions(max_tokens=10)))
    got = await anext(replies)
    assert "user" in got
    while "token_ids" not in await anext(replies):  # the turn's end, then a token
        pass
    await vllm.abort("gone")  # vLLM is decoding
    rest = [out async for out in replies]
    assert all("token_ids" in out for out in rest)  # it ends, with nothing else
    assert vllm.running_requests() == set()

    async def vllm_forgot() -> None:
        assert vllm.unfinished_requests() == 0

    await eventually(vllm_forgot, timeout=10)
    # Aborted at the rows of the turn's end, before the reply: no request is sent.
    replies = vllm.generate("gone", Inputs([{"text": "Talk"}]))
    assert "user" in await anext(replies)  # ahead
    assert "user" in await anext(replies)  # at the commit
    await vllm.abort("gone")
    assert [out async for out in replies] == []
    assert vllm.running_requests() == set()
    await eventually(vllm_forgot, timeout=10)


def noise(seconds: float, seed: int) -> torch.Tensor:
    """White noise at a speaking level (both thinkers compute the same log-mel of it)."""
    generator = torch.Generator().manual_seed(seed)
    return 0.1 * torch.randn(int(seconds * 16_000), generator=generator)


ATOL = 1e-4
WINDOW = 104
"""Encoder outputs of one whole encoder window (800 log-mel frames, 8 s)."""


async def test_audio_turns_give_the_torch_thinkers_rows_and_tokens(engines: Any) -> None:
    vllm, torch_thinker = engines
    # Clips of one encoder window or less are framed as the torch thinker frames them.
    clip = noise(3.0, 1)
    pieces = [{"audio": piece} for piece in clip.split(16_000)]
    first = await both(
        engines, "heard", [*pieces[:-1], {**pieces[-1], "text": "What was that?"}], ATOL
    )
    assert int(first["user_mask"].sum()) == 39  # 300 log-mel frames: 13 per second
    await both(engines, "heard", [{"text": "Listen:"}, {"audio": noise(1.5, 2)}, COMMIT], ATOL)
    # A clip in a cleared turn is gone; a truncation then reopens the request, which
    # sends both clips left in the conversation again (their states are not taken again).
    await both(engines, "heard", [{"audio": noise(1.0, 3)}, CLEAR, {"text": "no"}], ATOL)
    before = vllm.running_requests()
    await both(engines, "heard", [truncate(1), {"audio": noise(0.5, 4)}], ATOL)
    assert vllm.running_requests() != before
    await asyncio.gather(vllm.release("heard"), torch_thinker.release("heard"))


class Watched:
    """A response's input that runs ``check`` before each item after the first: the
    engine took every item before it (it asks for the next once it has)."""

    def __init__(self, items: list[Fields], check: Any) -> None:
        self.items, self.check, self.taken = items, check, 0

    def __aiter__(self) -> AsyncIterator[Fields]:
        return self

    async def __anext__(self) -> Fields:
        if self.taken == len(self.items):
            raise StopAsyncIteration
        if self.taken:
            self.check(self.taken)
        self.taken += 1
        return self.items[self.taken - 1]


async def test_a_long_clip_is_prefilled_window_by_window_while_it_arrives(
    engines: Any,
) -> None:
    vllm, torch_thinker = engines
    second = 16_000
    pieces = [{"audio": p} for p in noise(17.5, 5).split(second // 2)]
    seen: list[tuple[int, int, int]] = []  # (pieces taken, windows vLLM holds, states)

    def check(taken: int) -> None:
        state = vllm._sessions["windows"]
        held = [c for s, c in state.history.clips.items() if s < state.fed]
        seen.append((taken, len(held), sum(c.states is not None for c in held)))

    got = merged([o async for o in vllm.generate("windows", Watched(pieces, check))])
    # vLLM holds a window, and its states were taken, as soon as its 8 s (and the
    # 12.5 ms the STFT looks ahead) arrived: long before the clip ended.
    assert [held for _, held, _ in seen] == [0] * 16 + [1] * 16 + [2] * 2
    assert all(held == states for _, held, states in seen)
    # The talker's rows: each window framed on its own, its placeholders hidden states.
    mask = got["user_mask"]
    assert int(mask.sum()) == 2 * WINDOW + 20  # 1750 log-mel frames
    start = int(mask.int().argmax())
    runs = mask[start:].int().diff().nonzero().flatten().tolist()
    assert runs == [WINDOW - 1, WINDOW + 1, 2 * WINDOW + 1, 2 * WINDOW + 3, 2 * WINDOW + 23]
    want = await respond(torch_thinker, "windows", [dict(p) for p in pieces])
    # Up to the end of the first window the token lists are the same: so are the rows.
    until = start + WINDOW
    torch.testing.assert_close(got["user"][:until], want["user"][:until], atol=ATOL, rtol=0)
    # The torch thinker frames the clip once: two tokens fewer per further window.
    assert len(got["user"]) == len(want["user"]) + 4
    assert int(want["user_mask"].sum()) == int(mask.sum())
    assert vllm.prompt_tokens("windows") == torch_thinker.prompt_tokens("windows") + 4
    # The rows away from audio are input embeddings there: the torch thinker's, less
    # the <|audio_end|> <|audio_start|> pairs between windows.
    between = [start + WINDOW, start + WINDOW + 1, start + 2 * WINDOW + 2, start + 2 * WINDOW + 3]
    keep = torch.ones(len(mask), dtype=torch.bool)
    keep[between] = False
    text_rows = got["user"][keep][~mask[keep]]
    assert torch.equal(text_rows, want["user"][~want["user_mask"]])
    await asyncio.gather(vllm.release("windows"), torch_thinker.release("windows"))


async def test_a_clear_after_windows_were_sent_rolls_them_back(engines: Any) -> None:
    vllm, torch_thinker = engines
    await both(engines, "unsaid", [{"text": "Hi"}])
    before = vllm.running_requests()
    spoken = [{"audio": p} for p in noise(9.0, 6).split(16_000)]
    # The first window was prefilled before the clear: it goes with the cleared turn.
    await both(engines, "unsaid", [*spoken, CLEAR, {"text": "Sorry, go on"}], ATOL)
    assert vllm.running_requests() != before  # the request holding the window ended
    state = vllm._sessions["unsaid"]
    assert state.history.clips == {}
    await both(engines, "unsaid", [{"text": "And?"}])
    await asyncio.gather(vllm.release("unsaid"), torch_thinker.release("unsaid"))
    # The window's rows went to the talker as soon as it was prefilled; the clear takes
    # them back at once, in an output of its own.
    items = [*spoken, CLEAR, {"text": "Sorry, go on"}]
    outputs: list[Fields] = []
    split = Split(items, outputs)
    async for out in vllm.generate("unsaid", split):
        outputs.append(out)
    sent = len(vllm.turns.user.prefix) + WINDOW + 2
    assert [edits(o) for o in outputs[: split.before[-1]]] == [[sent], [-sent]]
    assert "user" not in outputs[split.before[-1] - 1]
    await vllm.release("unsaid")


class Split:
    """A response's input that notes how many outputs came before each item was taken
    (the engine asks for the next item once it yielded what the last one gave)."""

    def __init__(self, items: list[Fields], outputs: list[Fields]) -> None:
        self.items, self.outputs, self.before = items, outputs, []

    def __aiter__(self) -> AsyncIterator[Fields]:
        return self

    async def __anext__(self) -> Fields:
        if len(self.before) == len(self.items):
            raise StopAsyncIteration
        self.before.append(len(self.outputs))
        return self.items[len(self.before) - 1]


def edits(output: Fields) -> list[int]:
    value = output[USER_EDITS_FIELD]
    assert isinstance(value, torch.Tensor)
    return [int(n) for n in value.tolist()]


async def test_a_turns_rows_reach_the_talker_while_it_is_spoken(engines: Any) -> None:
    from omni_actors.actors.engines.vllm.audio_input import user_rows

    vllm, torch_thinker = engines
    items: list[Fields] = [
        {"text": "Listen:"},
        *({"audio": p} for p in noise(9.0, 7).split(16_000)),
        {"text": "What was it?"},
        COMMIT,
    ]
    outputs: list[Fields] = []
    split = Split(items, outputs)
    async for out in vllm.generate("ahead", split):
        outputs.append(out)
    early = outputs[: split.before[-1]]  # before the commit
    # The text, then the first window once its 8 s were in (states taken), then the
    # last window and the text after it: all before the commit, each in one output.
    assert split.before == [0, *[1] * 9, 2, 3]  # the window went out with the 9th second
    assert [edits(o) for o in early] == [[len(tensor(o, "user"))] for o in early]
    assert [int(tensor(o, "user_mask").sum()) for o in early] == [0, WINDOW, 13]
    assert len(tensor(early[1], "user")) == WINDOW + 2  # <|audio_start|> … <|audio_end|>
    # The commit sends what is left: the turn's end.
    assert [edits(o) for o in outputs[split.before[-1] :] if "user" in o] == [[2]]
    # Applied, the rows are those the turn gives at once when committed.
    history = vllm._sessions["ahead"].history
    turn = range(history.reply.start - len(vllm.turns.opening))
    whole = user_rows(history, turn, vllm.embeddings)
    assert torch.equal(talker_rows(outputs), whole["user"])
    assert torch.equal(talker_rows(outputs, "user_mask"), whole["user_mask"])
    # ... and the torch thinker's, which also sent them ahead, as far as the two token
    # lists agree (to the first window's end: vLLM frames the second on its own).
    want = merged([o async for o in torch_thinker.generate("ahead", Inputs(items))])
    until = int(whole["user_mask"].int().argmax()) + WINDOW
    got = talker_rows(outputs)[:until]
    torch.testing.assert_close(got, want["user"][:until], atol=ATOL, rtol=0)
    assert vllm._sessions["ahead"].history.ahead.sent == 0  # the next turn counts afresh
    await asyncio.gather(vllm.release("ahead"), torch_thinker.release("ahead"))


async def test_bad_audio_and_bad_marks_are_refused_and_the_session_goes_on(engines: Any) -> None:
    from omni_actors.actors.engines.vllm.thinker import VllmInputError

    vllm, torch_thinker = engines
    with pytest.raises(VllmInputError, match="floating-point"):
        await respond(vllm, "bad", [{"audio": torch.zeros(1600, dtype=torch.int16)}])
    with pytest.raises(VllmInputError, match="NaN"):
        await respond(vllm, "bad", [{"audio": torch.full((1600,), float("nan"))}])
    with pytest.raises(VllmInputError, match="unknown turn mark"):
        await respond(vllm, "bad", [{TURN_FIELD: "undo"}])
    with pytest.raises(VllmInputError, match="no reply to truncate"):
        await respond(vllm, "bad", [truncate(1)])
    await both(engines, "bad", [{"text": "Fine?"}])
    await asyncio.gather(vllm.release("bad"), torch_thinker.release("bad"))


async def test_engine_args_may_not_turn_the_feature_input_off(cache_dir: Path) -> None:
    from omni_actors.actors.engines.vllm.thinker import VllmThinkerArgs, VllmThinkerEngine
    from omni_actors.errors import EngineError

    engine = VllmThinkerEngine(
        VllmThinkerArgs(
            model="tiny-omni", cache_dir=cache_dir, engine_args={"enable_mm_embeds": False}
        )
    )
    with pytest.raises(EngineError, match="enable_mm_embeds must stay on"):
        await engine.start()
    assert engine.runtime is None  # refused before vLLM started
