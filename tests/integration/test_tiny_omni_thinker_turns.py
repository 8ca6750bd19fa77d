"""tiny-omni's thinker as a conversation engine, driven directly: turn marks, options,
cancel and failure.

The yardstick is a conversation written out token by token (the chat template of
``actors/engines/qwen3_omni/conversation.py``) and decoded greedily by plain forwards
(:func:`reference`): every rollback — a clear, a truncation, a cancelled reply, a failed
response — must leave the engine answering exactly as that conversation does.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from thinker_driving import thinker
from thinker_steps import OneShot, ids, talker_rows, tensor, truncate
from tiny_omni_ids import (
    ASSISTANT_OPENING,
    PRINTABLE,
    Tokens,
    assistant_turn,
    user_turn,
)
from transformers import DynamicCache

from omni_actors.actors.engines.contract import TURN_FIELD, Fields, ResponseOptions
from omni_actors.actors.engines.qwen3_omni import stepping
from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerEngine
from omni_actors.actors.engines.thinker_ports import USER_EDITS_FIELD
from omni_actors.testing import eventually

pytestmark = pytest.mark.integration

COMMIT: Fields = {TURN_FIELD: "commit"}
CLEAR: Fields = {TURN_FIELD: "clear"}
ACCEPT_LAYER = 1  # tiny-omni's talker_config.accept_hidden_layer


Step = Fields | Callable[[], Awaitable[None]]
"""An input item, or something to wait for before the next one."""


class Inputs:
    """A response's input stream as a stage hands it over: items, then ``options``.

    Callables among the items are awaited between items (conditions to wait for, with a
    deadline): the engine has taken every item before them by then, since it reads the
    next item only after it prefilled the last.
    """

    def __init__(self, steps: Iterable[Step], options: ResponseOptions | None = None) -> None:
        self.options = options
        self._items = self._run(list(steps))

    async def _run(self, steps: list[Step]) -> AsyncIterator[Fields]:
        for step in steps:
            if callable(step):
                await step()
            else:
                yield step

    def __aiter__(self) -> Inputs:
        return self

    async def __anext__(self) -> Fields:
        return await anext(self._items)


async def respond(
    engine: ThinkerEngine, session: str, *steps: Step, **options: Any
) -> list[Fields]:
    inputs = Inputs(steps, ResponseOptions(**options) if options else None)
    return [out async for out in engine.generate(session, inputs)]


def user_outputs(outputs: list[Fields]) -> list[torch.Tensor]:
    """The ``user`` rows of each output that has them."""
    return [tensor(o, "user") for o in outputs if "user" in o]


def user(text: str) -> list[int]:
    """A user turn of the chat template."""
    return user_turn(text)


def assistant(tokens: list[int]) -> list[int]:
    """A closed assistant turn."""
    return assistant_turn(tokens)


def reference(model: Any, conversation: list[int], count: int, least: int = 6) -> list[int]:
    """The greedy reply to ``conversation`` (its assistant opening added), by plain
    forwards: one prefill, then one token at a time, with the engine's token rules
    (printable bytes; ``<|im_end|>`` from ``least`` tokens on)."""
    prompt = [*conversation, *ASSISTANT_OPENING]
    allowed = torch.full((model.config.text_config.vocab_size,), float("-inf"))
    allowed[list(PRINTABLE)] = 0.0
    cache = DynamicCache(config=model.config.text_config)
    step = stepping.thinker_forward(model, torch.tensor([prompt]), cache, 0, accept_layer=1)
    reply: list[int] = []
    position = len(prompt)
    while len(reply) < count:
        mask = allowed.clone()
        if len(reply) >= least:
            mask[Tokens.IM_END] = 0.0
        token = int((step.logits[0, -1] + mask).argmax())
        if token == Tokens.IM_END:
            break
        reply.append(token)
        step = stepping.thinker_forward(
            model, torch.tensor([[token]]), cache, position, accept_layer=1
        )
        position += 1
    return reply


def cached_at(engine: ThinkerEngine, session: str, expected: int) -> Callable[[], Awaitable[None]]:
    """A step that checks the session's cache length when the engine reaches it."""

    async def check() -> None:
        assert engine.cached_tokens(session) == expected

    return check


# -- commit ---------------------------------------------------------------------------


async def test_a_turns_rows_go_out_as_prefilled_and_its_commit_sends_its_end(
    cache_dir: Path, model: Any
) -> None:
    seen: list[Fields] = []
    async with thinker(cache_dir) as engine:
        outputs = engine.generate(
            "s",
            Inputs(
                [
                    {"text": "Hi"},
                    lambda: eventually(lambda: len(seen) == 1),  # before the commit
                    COMMIT,
                    COMMIT,  # nothing sent since the last commit: no empty turn
                    lambda: eventually(lambda: len(seen) == 2),  # before the input goes on
                    {"text": "there"},
                    COMMIT,
                    {"text": "!"},
                ]
            ),
        )
        async for out in outputs:
            seen.append(out)
        cached = engine.cached_tokens("s")
    table = model.get_input_embeddings()
    turns = [user("Hi"), user("there"), user("!")]
    # Per turn: the rows prefilled, sent at once (<|im_start|> user \n and the text),
    # then its end (<|im_end|> \n) with its commit; the last turn's end, computed with
    # the reply's opening when the input ended, comes with the first token.
    sent = [int(tensor(o, "user").shape[0]) for o in seen if "user" in o]
    assert sent == [n for turn in turns for n in (len(turn) - 2, 2)]
    assert all("token_ids" not in o for o in seen[:5])  # rows come without a token
    assert "token_ids" in seen[5]
    for out in seen[:6]:  # every one counts its rows: they all join the talker's
        assert tensor(out, USER_EDITS_FIELD).tolist() == [tensor(out, "user").shape[0]]
    rows = talker_rows(seen)
    assert torch.equal(rows, table(torch.tensor([i for t in turns for i in t])))
    conversation = [i for t in turns for i in t]
    assert ids(seen) == reference(model, conversation, 6)
    # The 6th token waits, unfed, in the carry.
    assert cached == len(conversation) + 3 + 5


async def test_a_response_without_input_replies_to_the_conversation_so_far(
    cache_dir: Path, model: Any
) -> None:
    async with thinker(cache_dir) as engine:
        first = ids(await respond(engine, "s", {"text": "Hi"}))
        again = await respond(engine, "s")
    assert user_outputs(again) == []
    assert ids(again) == reference(model, [*user("Hi"), *assistant(first)], 6)


# -- clear ----------------------------------------------------------------------------


async def test_clear_rolls_back_to_the_last_commit(cache_dir: Path, model: Any) -> None:
    async with thinker(cache_dir) as engine:
        committed = len(user("Hello"))
        cleared = await respond(
            engine,
            "s",
            {"text": "Hello"},
            COMMIT,
            {"text": "never mind"},
            {"audio": torch.zeros(16000)},
            CLEAR,
            cached_at(engine, "s", committed),
            {"text": "world"},
        )
        plain = await respond(engine, "t", {"text": "Hello"}, COMMIT, {"text": "world"})
    assert ids(cleared) == ids(plain) == reference(model, [*user("Hello"), *user("world")], 6)
    # The rows of "never mind" went ahead of the clear, which takes them back.
    taken_back = next(tensor(o, USER_EDITS_FIELD).tolist() for o in cleared if "user" not in o)
    assert taken_back == [-len(user("never mind")) + 2]  # sent: all but <|im_end|> \n
    assert talker_rows(cleared).shape[0] == 7 + 3 + 5 + 5
    assert torch.equal(talker_rows(cleared), talker_rows(plain))


async def test_clear_after_a_reply_restores_its_carry(cache_dir: Path) -> None:
    async with thinker(cache_dir) as engine:
        for session in ("s", "t"):
            await respond(engine, session, {"text": "Hi"})
        after_reply = engine.cached_tokens("s")
        cleared = await respond(
            engine,
            "s",
            {"text": "junk"},  # fed behind the carry: the last token, <|im_end|> \n
            CLEAR,
            cached_at(engine, "s", after_reply),
            {"text": "And?"},
        )
        plain = await respond(engine, "t", {"text": "And?"})
    assert ids(cleared) == ids(plain)
    assert torch.equal(talker_rows(cleared), talker_rows(plain))


# -- truncate -------------------------------------------------------------------------


async def test_truncate_cuts_the_reply_to_what_was_heard(cache_dir: Path, model: Any) -> None:
    async with thinker(cache_dir) as engine:
        first = ids(await respond(engine, "s", {"text": "Hi"}))
        marked = await respond(engine, "s", truncate(2), {"text": "And then?"})
        # The same cut with input already prefilled behind the reply: it is fed again.
        await respond(engine, "t", {"text": "Hi"})
        late = await respond(engine, "t", {"text": "And"}, truncate(2), {"text": " then?"})
        # Between responses, as a stage after the entry one would be asked.
        await respond(engine, "u", {"text": "Hi"})
        assert await engine.truncate("u", 2) == 0
        between = await respond(engine, "u", {"text": "And then?"})
    expected = reference(model, [*user("Hi"), *assistant(first[:2]), *user("And then?")], 6)
    assert ids(marked) == ids(late) == ids(between) == expected
    unheard = reference(model, [*user("Hi"), *assistant(first), *user("And then?")], 6)
    assert expected != unheard  # the cut changed the context


async def test_truncate_after_a_commit_fails_the_response_only(cache_dir: Path) -> None:
    async with thinker(cache_dir) as engine:
        with pytest.raises(ValueError, match="no reply"):
            await engine.truncate("s", 1)
        await respond(engine, "s", {"text": "Hi"})
        before = engine.cached_tokens("s")
        with pytest.raises(ValueError, match="committed after the last reply"):
            await respond(engine, "s", {"text": "x"}, COMMIT, truncate(1))
        assert engine.cached_tokens("s") == before
        assert engine.active_sessions == {"s"}


# -- cancel ---------------------------------------------------------------------------


async def test_cancel_keeps_exactly_the_yielded_reply(cache_dir: Path, model: Any) -> None:
    async with thinker(cache_dir, min_new_tokens=20, max_new_tokens=20) as engine:
        outputs = engine.generate("s", Inputs([{"text": "Hi"}]))
        got = [await anext(outputs) for _ in range(4)]  # the rows, then 3 tokens
        # A decode step for token 4 runs by now (started before token 3 was yielded).
        await outputs.aclose()
        heard = ids(got)
        assert len(heard) == 3
        assert engine.generating == set()
        # The cache holds the turn, the opening and the 3 yielded tokens, no more.
        assert engine.cached_tokens("s") == len(user("Hi")) + 3 + 3
        after = await respond(engine, "s", {"text": "And?"})
    assert heard == reference(model, user("Hi"), 20, 20)[:3]
    conversation = [*user("Hi"), *assistant(heard), *user("And?")]
    assert ids(after) == reference(model, conversation, 20, 20)


async def test_cancel_at_the_last_token_feeds_it_with_the_turns_end(
    cache_dir: Path, model: Any
) -> None:
    async with thinker(cache_dir, min_new_tokens=3, max_new_tokens=3) as engine:
        outputs = engine.generate("s", Inputs([{"text": "Hi"}]))
        got = [await anext(outputs) for _ in range(4)]  # rows + 3 tokens: no step after
        await outputs.aclose()
        assert engine.cached_tokens("s") == len(user("Hi")) + 3 + 2
        after = await respond(engine, "s", {"text": "And?"})
    conversation = [*user("Hi"), *assistant(ids(got)), *user("And?")]
    assert ids(after) == reference(model, conversation, 3, 3)


async def test_cancel_before_the_first_token_keeps_the_committed_turn(
    cache_dir: Path, model: Any
) -> None:
    async with thinker(cache_dir) as engine:
        outputs = engine.generate("s", Inputs([{"text": "Hi"}]))
        first = await anext(outputs)  # the turn's rows so far, sent as prefilled
        assert "token_ids" not in first
        await outputs.aclose()
        # The talker has those rows: the turn stays, closed, with no reply after it.
        assert engine.cached_tokens("s") == len(user("Hi"))
        answer = await respond(engine, "s")
    assert ids(answer) == reference(model, user("Hi"), 6)


# -- failure --------------------------------------------------------------------------


async def test_a_failed_response_rolls_back_to_where_it_started(
    cache_dir: Path, model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken() -> None:
        raise RuntimeError("input broke")

    async with thinker(cache_dir) as engine:
        first = ids(await respond(engine, "s", {"text": "Hi"}))
        before = engine.cached_tokens("s")
        with pytest.raises(RuntimeError, match="input broke"):
            await respond(engine, "s", {"text": "lost"}, COMMIT, {"text": "too"}, broken)
        assert engine.cached_tokens("s") == before
        # A model call failing mid-reply (a decode step in flight) rolls back the same way.
        decode, calls = engine._model.step, 0

        def failing(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 3:
                raise RuntimeError("decode broke")
            return decode(*args)

        with monkeypatch.context() as patch:
            patch.setattr(engine._model, "step", failing)
            with pytest.raises(RuntimeError, match="decode broke"):
                await respond(engine, "s", {"text": "lost"})
            assert calls == 3
        assert engine.cached_tokens("s") == before
        assert engine.active_sessions == {"s"}
        after = await respond(engine, "s", {"text": "And?"})
    assert ids(after) == reference(model, [*user("Hi"), *assistant(first), *user("And?")], 6)


async def test_a_truncation_stays_when_the_response_after_it_fails(
    cache_dir: Path, model: Any
) -> None:
    async def broken() -> None:
        raise RuntimeError("input broke")

    async with thinker(cache_dir) as engine:
        first = ids(await respond(engine, "s", {"text": "Hi"}))
        with pytest.raises(RuntimeError, match="input broke"):
            await respond(engine, "s", {"text": "lost"}, truncate(2), {"text": "too"}, broken)
        assert engine.cached_tokens("s") == len(user("Hi")) + 3 + 2
        after = await respond(engine, "s", {"text": "And?"})
    expected = reference(model, [*user("Hi"), *assistant(first[:2]), *user("And?")], 6)
    assert ids(after) == expected


async def test_abort_still_drops_the_session(cache_dir: Path) -> None:
    async with thinker(cache_dir, min_new_tokens=40, max_new_tokens=40) as engine:
        await respond(engine, "s", {"text": "Hi"})
        task = asyncio.ensure_future(respond(engine, "s", {"text": "And?"}))
        await eventually(lambda: engine.generating == {"s"})
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5.0)
        assert engine.active_sessions == set()


# -- options --------------------------------------------------------------------------


async def test_max_tokens_overrides_the_limit_for_one_response(cache_dir: Path) -> None:
    async with thinker(cache_dir, min_new_tokens=8, max_new_tokens=48) as engine:
        short = ids(await respond(engine, "s", {"text": "Hi"}, max_tokens=3))
        usual = ids(await respond(engine, "t", {"text": "Hi"}))
        with pytest.raises(ValueError, match="max_tokens must be >= 1"):
            await respond(engine, "u", {"text": "Hi"}, max_tokens=0)
    assert len(short) == 3  # the minimum of 8 is capped to it
    assert 8 <= len(usual) <= 48
    assert short == usual[:3]


async def test_temperature_samples_reproducibly_per_session(cache_dir: Path) -> None:
    async def reply(engine: ThinkerEngine, session: str, **options: Any) -> list[int]:
        return ids(await respond(engine, session, {"text": "Hi"}, **options))

    async with thinker(cache_dir, min_new_tokens=24, max_new_tokens=24) as engine:
        greedy = await reply(engine, "g")
        zero = await reply(engine, "z", temperature=0.0)
        hot = await reply(engine, "a#1", temperature=1.5)
        other = await reply(engine, "b#1", temperature=1.5)
    async with thinker(cache_dir, min_new_tokens=24, max_new_tokens=24) as engine:
        again = await reply(engine, "a#1", temperature=1.5)
    assert zero == greedy
    assert hot != greedy
    assert hot == again  # the same seed and session key draw the same reply
    assert hot != other  # another session draws from its own stream
    assert all(32 <= t <= 126 for t in hot)


# -- usage ----------------------------------------------------------------------------


async def test_prompt_tokens_are_the_conversation_each_reply_was_made_from(
    cache_dir: Path,
) -> None:
    async with thinker(cache_dir) as engine:
        assert engine.prompt_tokens("s") is None  # no reply yet
        first = ids(await respond(engine, "s", {"text": "Hi"}))
        assert engine.prompt_tokens("s") == len(user("Hi")) + len(ASSISTANT_OPENING)
        await respond(engine, "s", {"text": "there"})
        conversation = [*user("Hi"), *assistant(first), *user("there")]
        assert engine.prompt_tokens("s") == len(conversation) + len(ASSISTANT_OPENING)


# -- one-shot requests ----------------------------------------------------------------


@pytest.mark.parametrize("ahead", [True, False])
async def test_a_one_shot_prompt_and_the_reply_s_opening_share_one_forward(
    cache_dir: Path, model: Any, ahead: bool
) -> None:
    async with thinker(cache_dir, rows_ahead=ahead) as engine:
        before = engine.loop.statistics()
        got = [out async for out in engine.generate("s", OneShot([{"text": "Hi"}]))]
        after = engine.loop.statistics()
    decodes = after.decode_rows - before.decode_rows
    assert after.steps - before.steps - decodes == 1  # one step of prefills
    assert after.prefill_chunks - before.prefill_chunks == 2  # the turn, the opening
    assert ids(got) == reference(model, user("Hi"), 6)
    if ahead:
        # The text's rows are its input embeddings: they go ahead, before the forward
        # (the talker prefills them meanwhile); the turn's end comes with the first token.
        assert set(got[0]) == {"user", "user_mask", USER_EDITS_FIELD}
        assert "token_ids" in got[1]
        assert got[1]["user"].shape[0] == len(user("Hi")) - got[0]["user"].shape[0] == 2
    else:  # all with the first token: the talker opens in one forward
        assert "token_ids" in got[0]
    table = model.get_input_embeddings()
    assert torch.equal(talker_rows(got), table(torch.tensor(user("Hi"))))
    assert not talker_rows(got, "user_mask").any()


async def test_a_one_shot_text_s_rows_leave_before_its_forward_runs(
    cache_dir: Path, model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The talker may prefill a one-shot prompt while the thinker's forward of it runs
    (or waits for its step): the prompt's rows come out while that forward is held."""
    async with thinker(cache_dir) as engine:
        step, held = engine._model.step, threading.Event()

        def holding(chunks: Any, **kw: Any) -> Any:
            if not all(chunk.work.decode for chunk in chunks):
                assert held.wait(timeout=30), "the test never let the forward go"
            return step(chunks, **kw)

        monkeypatch.setattr(engine._model, "step", holding)
        got, task = await rows_first(engine)
        try:
            assert engine.loop.statistics().prefill_steps == 0  # its forward has not ended
        finally:
            held.set()
            await task
    assert ids(got) == reference(model, user("Hi"), 6)


async def rows_first(engine: ThinkerEngine) -> tuple[list[Fields], asyncio.Task[None]]:
    """A one-shot "Hi" under way, its outputs so far once its first (its rows sent
    ahead) is out, and the task that takes the rest."""
    got: list[Fields] = []

    async def run() -> None:
        async for out in engine.generate("s", OneShot([{"text": "Hi"}])):
            got.append(out)

    task = asyncio.create_task(run())
    try:
        await eventually(lambda: bool(got))
    except BaseException:
        task.cancel()
        raise
    assert set(got[0]) == {"user", "user_mask", USER_EDITS_FIELD}
    return got, task


async def test_a_one_shot_text_s_rows_leave_while_the_model_thread_is_busy(
    cache_dir: Path, model: Any
) -> None:
    """Its rows are a lookup, not a step: they do not queue behind what the model thread
    runs (on a GPU, a wave's prefill step), and neither does the prompt they go ahead of."""
    async with thinker(cache_dir) as engine:
        held = threading.Event()
        busy = asyncio.create_task(engine.call(held.wait, 30))
        try:
            got, task = await rows_first(engine)
            assert not busy.done()  # the model thread is still held
        finally:
            held.set()
            await busy
        await task
    assert ids(got) == reference(model, user("Hi"), 6)
    table = model.get_input_embeddings()
    assert torch.equal(talker_rows(got), table(torch.tensor(user("Hi"))))


async def test_a_failed_one_shot_forward_fails_the_response_and_rolls_back(
    cache_dir: Path, model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with thinker(cache_dir) as engine:
        first = ids(await respond(engine, "s", {"text": "Hi"}))
        before = engine.cached_tokens("s")
        step = engine._model.step

        def failing(chunks: Any, **kw: Any) -> Any:
            if len(chunks) > 1:
                raise RuntimeError("prefill broke")
            return step(chunks, **kw)

        with monkeypatch.context() as patch:
            patch.setattr(engine._model, "step", failing)
            with pytest.raises(RuntimeError, match="prefill broke"):
                async for _ in engine.generate("s", OneShot([{"text": "lost"}])):
                    pass
        assert engine.cached_tokens("s") == before
        assert engine.active_sessions == {"s"}
        after = await respond(engine, "s", {"text": "And?"})
    assert ids(after) == reference(model, [*user("Hi"), *assistant(first), *user("And?")], 6)


async def test_a_long_text_is_encoded_off_the_event_loop(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt's encoding (6 ms for 2500 tokens at full size; a wave of 32 arrives at
    once) runs in a worker thread, the tokenizer letting go of the GIL: the event loop
    goes on meanwhile. A short text stays on the loop (a thread hop would cost more)."""
    async with thinker(cache_dir) as engine:
        tokenizer = engine.vocabulary.tokenizer
        encode = tokenizer.encode
        threads: list[int] = []

        def recorded(text: str, **kw: Any) -> Any:
            threads.append(threading.get_ident())
            return encode(text, **kw)

        monkeypatch.setattr(tokenizer, "encode", recorded)
        loop = threading.get_ident()
        long = " ".join(["Hi there"] * 300)  # 2699 characters
        assert ids(await respond(engine, "long", {"text": long})) != []
        assert threads[-1] != loop
        assert ids(await respond(engine, "short", {"text": "Hi"})) != []
        assert threads[-1] == loop
