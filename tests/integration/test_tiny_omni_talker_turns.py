"""The tiny-omni talker across the turns of a conversation.

The reference is HF's own ``Qwen3OmniMoeForConditionalGeneration.generate`` with the same
tiny weights, run on the whole conversation as one request: its talker conditions on
every user turn so far (the user-role positions, gathered) and on the last assistant
turn's prefix only. Our thinker and talker engines, driven turn by turn at one session
(the thinker's outputs fed to the talker as the stream edge would), must give the same
text and the same codes at every turn. The other tests pin what that rests on: user
turns prefilled while they arrive, state kept, rolled back and dropped as the engine
protocol says, the voice option, and truncation's frames -> tokens mapping.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from thinker_steps import talker_rows, tensor
from tiny_omni_ids import (
    ASSISTANT_OPENING,
    PRINTABLE_RANGES,
    TINY_TALKER,
    Tokens,
)
from tiny_omni_reference import (
    assistant_turn,
    audio_clip,
    hf_reply,
    hf_user_turn,
    reference_model,
)

from omni_actors.actors.engines.contract import (
    KEPT_FIELD,
    REPLY_FIELD,
    TURN_FIELD,
    Fields,
    ResponseOptions,
)
from omni_actors.actors.engines.qwen3_omni import configs
from omni_actors.actors.engines.qwen3_omni.talker_engine import TalkerArgs, TalkerEngine
from omni_actors.actors.engines.qwen3_omni.talker_input import TalkerInputError
from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerArgs, ThinkerEngine
from omni_actors.actors.engines.thinker_ports import USER_EDITS_FIELD
from omni_actors.actors.stage.accumulate import Accumulator
from omni_actors.models import cache as model_cache
from omni_actors.testing import eventually

pytestmark = pytest.mark.integration

TURNS = ["Hello there!", "What is the weather like?", "Thanks, bye."]
MIN_TOKENS, MAX_TOKENS = 8, 12
TALKER_FIELDS = tuple(TalkerEngine.inputs)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("model-cache")
    model_cache.prepare("tiny-omni", cache_dir=cache)
    return cache


@asynccontextmanager
async def talker(cache_dir: Path, **extra: Any) -> AsyncIterator[TalkerEngine]:
    extra = {**TINY_TALKER, **extra}
    engine = TalkerEngine(TalkerArgs(seed=0, cache_dir=str(cache_dir), **extra))
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


@asynccontextmanager
async def thinker(cache_dir: Path) -> AsyncIterator[ThinkerEngine]:
    args = ThinkerArgs(
        seed=0,
        cache_dir=str(cache_dir),
        min_new_tokens=MIN_TOKENS,
        max_new_tokens=MAX_TOKENS,
        allowed_token_ranges=PRINTABLE_RANGES,
    )
    engine = ThinkerEngine(args)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


class Inputs:
    """An engine's input stream, with the response's options as a stage's carries them."""

    def __init__(self, items: Iterable[Fields], options: ResponseOptions | None = None) -> None:
        self._items = iter(list(items))
        self.options = options or ResponseOptions()

    def __aiter__(self) -> Inputs:
        return self

    async def __anext__(self) -> Fields:
        try:
            return next(self._items)
        except StopIteration:
            raise StopAsyncIteration from None


class Pipe(Inputs):
    """Input that arrives in parts: ``items`` now, the rest (and the end) on ``send``."""

    def __init__(self, items: Iterable[Fields]) -> None:
        super().__init__(())
        self._queue: asyncio.Queue[Fields | None] = asyncio.Queue()
        for item in items:
            self._queue.put_nowait(item)

    def send(self, items: Iterable[Fields], end: bool = True) -> None:
        for item in items:
            self._queue.put_nowait(item)
        if end:
            self._queue.put_nowait(None)

    async def __anext__(self) -> Fields:
        item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        return item


async def failing_after(items: Iterable[Fields]) -> AsyncIterator[Fields]:
    """Yields ``items``, then fails (an upstream stage that failed mid-response)."""
    for item in items:
        yield item
    raise RuntimeError("upstream failed")


def edge(outputs: Sequence[Fields]) -> list[Fields]:
    """What a ``stream`` thinker -> talker edge delivers: one chunk per output."""
    return [{k: v for k, v in o.items() if k in TALKER_FIELDS} for o in outputs]


def token_ids(outputs: Sequence[Fields]) -> list[int]:
    return [int(tensor(o, "token_ids")) for o in outputs if "token_ids" in o]


async def speak(engine: TalkerEngine, session: str, inputs: AsyncIterator[Fields]) -> torch.Tensor:
    frames = [tensor(out, "codes") async for out in engine.generate(session, inputs)]
    return torch.cat(frames) if frames else torch.zeros(0, configs.DEFAULT_NUM_CODE_GROUPS)


@dataclass
class Turn:
    """One response: what the user sent, the thinker's outputs, the talker's codes."""

    user: Fields
    said: list[Fields]
    codes: torch.Tensor

    @property
    def ids(self) -> list[int]:
        return token_ids(self.said)


async def respond(think: ThinkerEngine, talk: TalkerEngine, inputs: list[Fields]) -> Turn:
    """One response at session ``s``: ``inputs`` through the thinker, its outputs through
    the talker (as the stream edge delivers them)."""
    said = [out async for out in think.generate("s", Inputs(inputs))]
    return Turn(inputs[-1], said, await speak(talk, "s", Inputs(edge(said))))


async def converse(cache_dir: Path, turns: Sequence[Fields], **talker_args: Any) -> list[Turn]:
    """Each user turn a response: through the thinker, then the talker, one session."""
    async with thinker(cache_dir) as think, talker(cache_dir, **talker_args) as talk:
        return [await respond(think, talk, [user]) for user in turns]


@pytest.fixture(scope="module")
def conversation(cache_dir: Path) -> list[Turn]:
    """The 3-turn text conversation most tests replay into the talker (its own loop:
    computed once for the module)."""
    return asyncio.run(converse(cache_dir, [{"text": t} for t in TURNS]))


# -- the reference -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(cache_dir: Path) -> Any:
    """HF's end-to-end model with the tiny weights; ``captured`` gets each reply's codes."""
    return reference_model(cache_dir)


def assert_reply_equal(reference: Any, conversation: list[int], turn: Turn, **audio: Any) -> None:
    """``turn``'s text and codes == HF's generate on ``conversation`` (the user turns and
    replies so far, ending with the user's), asked for a reply."""
    prompt = [*conversation, *ASSISTANT_OPENING]
    assert turn.codes.shape == (2 * len(turn.ids), configs.DEFAULT_NUM_CODE_GROUPS)
    reference.captured.clear()
    sequences, _ = hf_reply(
        reference, prompt, len(turn.ids), turn.codes.shape[0], MIN_TOKENS, **audio
    )
    assert sequences[0, len(prompt) :].tolist() == [*turn.ids, Tokens.IM_END]
    (codes,) = reference.captured
    assert torch.equal(codes[0].T, turn.codes)


def assert_equal_to_hf_generate(reference: Any, turns: list[Turn]) -> None:
    """Each turn's text and codes == HF's generate on the conversation up to that turn."""
    n_window = reference.config.thinker_config.audio_config.n_window
    conversation: list[int] = []
    audio: dict[str, torch.Tensor] = {}
    for turn in turns:
        ids, features = hf_user_turn(turn.user, n_window)
        assert not (audio and features), "HF's generate takes one audio clip per request"
        audio |= features
        conversation += ids
        assert_reply_equal(reference, conversation, turn, **audio)
        conversation += assistant_turn(turn.ids)


async def test_three_turn_conversation_equals_hf_generate_on_the_whole_conversation(
    cache_dir: Path, reference: Any
) -> None:
    turns = await converse(cache_dir, [{"text": t} for t in TURNS], speaker="ethan")
    assert_equal_to_hf_generate(reference, turns)
    # The later turns depend on the earlier ones (what a talker without state misses).
    async with talker(cache_dir, speaker="ethan") as engine:
        alone = await speak(engine, "fresh", Inputs(edge(turns[2].said)))
    assert not torch.equal(alone, turns[2].codes)


async def test_an_audio_user_turn_equals_hf_generate(cache_dir: Path, reference: Any) -> None:
    user: list[Fields] = [{"text": TURNS[0]}, {"audio": audio_clip(), "text": "Hi"}]
    turns = await converse(cache_dir, user, speaker="ethan")
    assert bool(tensor(turns[1].said[0], "user_mask").any())  # placeholder rows in play
    assert_equal_to_hf_generate(reference, turns)


# -- user turns as they arrive -----------------------------------------------------------


def split_user_rows(said: list[Fields], pieces: int) -> tuple[list[Fields], list[Fields]]:
    """``said`` with its user rows taken out into ``pieces`` chunks of their own (sent
    before the first token, as the thinker sends committed turns), and the rest."""
    rows = torch.cat([tensor(o, "user") for o in said if "user" in o])
    mask = torch.cat([tensor(o, "user_mask") for o in said if "user_mask" in o])
    cuts = torch.linspace(0, rows.shape[0], pieces + 1).long().tolist()
    early: list[Fields] = [
        {"user": rows[a:b], "user_mask": mask[a:b]} for a, b in itertools.pairwise(cuts)
    ]
    rows_fields = ("user", "user_mask", USER_EDITS_FIELD)  # rows without edits all join
    rest = [{k: v for k, v in o.items() if k not in rows_fields} for o in edge(said)]
    return early, rest


async def test_user_rows_are_prefilled_as_they_arrive_and_equal_all_at_once(
    cache_dir: Path, conversation: list[Turn]
) -> None:
    async with talker(cache_dir) as engine:
        for index, turn in enumerate(conversation):
            early, rest = split_user_rows(turn.said, pieces=3)
            before = engine.user_positions("s")
            pipe = Pipe(early)
            task = asyncio.ensure_future(speak(engine, "s", pipe))
            # Prefilled while the input goes on, before any token: during the user's turn.
            rows = sum(tensor(chunk, "user").shape[0] for chunk in early)
            await eventually(lambda: engine.user_positions("s") == before + rows)  # noqa: B023
            assert not task.done()
            pipe.send(rest)
            codes = await asyncio.wait_for(task, 30.0)
            assert engine.user_positions("s") == before + rows
            # == the conversation where each turn's rows came with its first token.
            assert torch.equal(codes, turn.codes), f"turn {index}"


# -- options, truncation, rollback, release ----------------------------------------------


async def test_voice_option_overrides_the_speaker_for_one_response(
    cache_dir: Path, conversation: list[Turn]
) -> None:
    first, second = conversation[:2]
    async with talker(cache_dir, speaker="ethan") as ethan:
        as_ethan = await speak(ethan, "s", Inputs(edge(first.said)))
    async with talker(cache_dir) as engine:  # chelsie by default
        voiced = await speak(engine, "s", Inputs(edge(first.said), ResponseOptions(voice="Ethan")))
        assert torch.equal(voiced, as_ethan)
        assert not torch.equal(voiced, first.codes)
        # The next response speaks with the default voice again; the conversation is the
        # same (the voice is in the reply's prefix, not in the user turns).
        assert torch.equal(await speak(engine, "s", Inputs(edge(second.said))), second.codes)
        # An unknown voice fails that response only; the session goes on from before it.
        kept = engine.user_positions("s")
        unknown = ResponseOptions(voice="nobody")
        known = "the checkpoint's voices are aiden, chelsie, ethan"
        with pytest.raises(TalkerInputError, match=rf"unknown voice 'nobody': {known}"):
            await speak(engine, "s", Inputs(edge(conversation[2].said), unknown))
        assert engine.user_positions("s") == kept
        third = await speak(engine, "s", Inputs(edge(conversation[2].said)))
        assert torch.equal(third, conversation[2].codes)


def with_token_changed(said: list[Fields], index: int) -> list[Fields]:
    """The edge's chunks of ``said`` with token ``index``'s embedding replaced."""
    chunks = [dict(chunk) for chunk in edge(said)]
    carrying = [chunk for chunk in chunks if "embed" in chunk]
    other = torch.randn(1, configs.HIDDEN, generator=torch.Generator().manual_seed(index))
    carrying[index]["embed"] = other
    return chunks


async def test_truncate_keeps_the_tokens_the_kept_frames_depend_on(
    cache_dir: Path, conversation: list[Turn]
) -> None:
    turn = conversation[0]
    n = len(turn.ids)
    async with talker(cache_dir) as engine:
        with pytest.raises(ValueError, match="no reply to truncate"):
            await engine.truncate("s", 1)
        # The dependency itself: changing token k changes frame k first.
        for k in (0, 1, 5, n - 2):
            changed = await speak(engine, f"changed-{k}", Inputs(with_token_changed(turn.said, k)))
            assert int((changed != turn.codes).any(dim=1).nonzero()[0]) == k, k

        async def cut(kept: int) -> int:
            await speak(engine, "s", Inputs(edge(turn.said)))  # a whole reply, then cut it
            return await engine.truncate("s", kept)

        cases = {0: 0, 1: 1, 2: 2, n - 1: n - 1, n: n, n + 1: n, 2 * n: n, 100 * n: n}
        for kept, tokens in cases.items():
            assert await cut(kept) == tokens, kept
        # A truncated reply stays truncated.
        assert await cut(5) == 5
        assert await engine.truncate("s", 2 * n) == 5
        with pytest.raises(ValueError, match="pass 0 or more"):
            await engine.truncate("s", -1)


def broken_layer(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("layer failed")


async def test_a_failed_response_rolls_back_to_its_start(
    cache_dir: Path, conversation: list[Turn]
) -> None:
    first, second, third = conversation
    early, rest = split_user_rows(second.said, pieces=2)
    async with talker(cache_dir) as engine:
        await speak(engine, "s", Inputs(edge(first.said)))
        kept = engine.user_positions("s")
        # Fails before the first token (its user turn prefilled), then after a few frames.
        for inputs in (early, [*early, *rest[:3]]):
            with pytest.raises(RuntimeError, match="upstream failed"):
                await speak(engine, "s", failing_after(inputs))
            assert engine.user_positions("s") == kept
            assert engine.generating == set()
        # A forward that fails part-way, its first layer's cache already extended.
        last = engine._model.talker.model.layers[-1]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(last, "forward", broken_layer)
            with pytest.raises(RuntimeError, match="layer failed"):
                await speak(engine, "s", Inputs(early))
        assert engine.user_positions("s") == kept
        assert await engine.truncate("s", 10**6) == len(first.ids)  # still the first reply
        # The conversation goes on as if the failed responses had never been.
        assert torch.equal(await speak(engine, "s", Inputs(edge(second.said))), second.codes)
        assert torch.equal(await speak(engine, "s", Inputs(edge(third.said))), third.codes)


async def test_a_cancelled_response_keeps_its_user_turn(
    cache_dir: Path, conversation: list[Turn]
) -> None:
    first, second, third = conversation
    async with talker(cache_dir) as engine:
        await speak(engine, "s", Inputs(edge(first.said)))
        outputs = engine.generate("s", Inputs(edge(second.said)))
        heard = torch.cat([tensor(await anext(outputs), "codes") for _ in range(3)])
        await outputs.aclose()  # barge-in
        assert engine.generating == set()
        assert torch.equal(heard, second.codes[:3])
        assert await engine.truncate("s", 3) == 3  # the cancelled reply is the last one
        # Its user turn stays, its assistant part goes: the next turn is the same as in
        # the conversation where the second reply was spoken to its end.
        assert torch.equal(await speak(engine, "s", Inputs(edge(third.said))), third.codes)


async def test_release_and_abort_drop_the_conversation(
    cache_dir: Path, conversation: list[Turn]
) -> None:
    first, second = conversation[:2]
    async with talker(cache_dir) as engine:
        alone = await speak(engine, "alone", Inputs(edge(second.said)))
        await engine.release("alone")
        assert not torch.equal(alone, second.codes)  # it matters what came before
        for end in (engine.release, engine.abort):
            await speak(engine, "s", Inputs(edge(first.said)))
            assert engine.active_sessions == {"s"}
            assert engine.user_positions("s") > 0
            await end("s")
            assert engine.active_sessions == set()
            assert engine.user_positions("s") == 0
            with pytest.raises(ValueError, match="no reply to truncate"):
                await engine.truncate("s", 1)
            # The key starts a new conversation: nothing of the first turn is left.
            assert torch.equal(await speak(engine, "s", Inputs(edge(second.said))), alone)
            await engine.release("s")


async def test_commits_and_a_truncated_reply_equal_hf_generate(
    cache_dir: Path, reference: Any
) -> None:
    """Two user turns committed before one reply, a reply cut where the user stopped
    listening (the talker maps heard frames to tokens, the thinker keeps those), and
    input cleared before its commit (never part of the conversation)."""
    first, second, third = ({"text": t} for t in TURNS)
    before, after = {"text": "One more thing."}, {"text": "Go on."}
    async with thinker(cache_dir) as think, talker(cache_dir, speaker="ethan") as talk:
        one = await respond(think, talk, [first])
        two = await respond(think, talk, [before, {TURN_FIELD: "commit"}, second])
        kept = await talk.truncate("s", 5)  # the user heard 5 frames of the reply
        cut = {TURN_FIELD: "truncate", KEPT_FIELD: torch.tensor(kept)}
        dropped = [{"text": "Never mind."}, {TURN_FIELD: "clear"}]  # rolled back unsaid
        three = await respond(think, talk, [cut, *dropped, third, {TURN_FIELD: "commit"}, after])
    assert kept == 5

    def user(*turns: Fields) -> list[int]:
        return [i for turn in turns for i in hf_user_turn(turn, 1)[0]]

    conversation = user(first)
    assert_reply_equal(reference, conversation, one)
    conversation += [*assistant_turn(one.ids), *user(before, second)]
    assert_reply_equal(reference, conversation, two)
    conversation += [*assistant_turn(two.ids[:kept]), *user(third, after)]
    assert_reply_equal(reference, conversation, three)


# -- a user turn while it is spoken ------------------------------------------------------

SPOKEN_S = 9.0
"""Past one encoder window (8 s): its rows are final before the clip ends."""
CLEAR: Fields = {TURN_FIELD: "clear"}


def spoken(seconds: float = SPOKEN_S) -> list[Fields]:
    """A clip as a microphone sends it: one chunk per second."""
    return [{"audio": piece} for piece in audio_clip(seconds).split(configs.AUDIO_SAMPLE_RATE)]


def heard(outputs: Sequence[Fields]) -> bool:
    """Whether rows of audio placeholders are among ``outputs``."""
    return any(bool(tensor(o, "user_mask").any()) for o in outputs if "user_mask" in o)


class Live:
    """One response with both engines running as a pipeline runs them: the caller's
    input through a pipe, each thinker output on to the talker as it is yielded (a
    ``stream`` edge), so the talker works while the input still arrives."""

    def __init__(self, think: ThinkerEngine, talk: TalkerEngine) -> None:
        self.input = Pipe(())
        self.edge = Pipe(())
        self.said: list[Fields] = []
        self.thinking = asyncio.ensure_future(self._think(think))
        self.speaking = asyncio.ensure_future(speak(talk, "s", self.edge))

    async def _think(self, think: ThinkerEngine) -> None:
        try:
            async for out in think.generate("s", self.input):
                self.said.append(out)
                self.edge.send([chunk for chunk in edge([out]) if chunk], end=False)
        finally:
            self.edge.send((), end=True)

    def send(self, *items: Fields) -> None:
        self.input.send(items, end=False)

    async def end(self, user: Fields) -> Turn:
        """The input ends (the turn is committed, the reply follows): the response."""
        self.input.send((), end=True)
        await asyncio.wait_for(self.thinking, 60.0)
        return Turn(user, self.said, await asyncio.wait_for(self.speaking, 60.0))

    async def __aenter__(self) -> Live:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in (self.thinking, self.speaking):
            task.cancel()
        await asyncio.gather(self.thinking, self.speaking, return_exceptions=True)


async def test_the_talker_prefills_a_turn_while_it_is_spoken(
    cache_dir: Path, reference: Any
) -> None:
    """The rows of a user turn reach the talker before the turn is committed: text as
    it arrives, audio once a window of it is encoded; the reply is HF's all the same."""
    user: Fields = {"audio": audio_clip(SPOKEN_S), "text": "Hi"}
    async with thinker(cache_dir) as think, talker(cache_dir, speaker="ethan") as talk:
        first = await respond(think, talk, [{"text": TURNS[0]}])
        before = talk.user_positions("s")
        async with Live(think, talk) as live:
            live.send(*spoken())
            # The clip goes on, the turn is open: its first window's rows are the talker's.
            await eventually(lambda: heard(live.said))
            sent = talker_rows(live.said).shape[0]
            await eventually(lambda: talk.user_positions("s") == before + sent)
            live.send({"text": "Hi"})
            second = await live.end(user)
        assert talk.user_positions("s") == before + talker_rows(second.said).shape[0]
    assert_equal_to_hf_generate(reference, [first, second])


async def spoken_then_cleared(
    think: ThinkerEngine, talk: TalkerEngine, first: Turn, second: Turn
) -> Turn:
    """At session ``s``: ``first``'s response, then a turn spoken and cleared (its rows
    the talker's by then, and taken back), then ``second``'s input, answered."""
    await respond(think, talk, [first.user])
    before = talk.user_positions("s")
    async with Live(think, talk) as live:
        live.send({"text": "Never mind"}, *spoken())
        await eventually(lambda: heard(live.said))
        await eventually(lambda: talk.user_positions("s") > before)
        live.send(CLEAR)
        await eventually(lambda: talk.user_positions("s") == before)
        live.send(second.user)
        return await live.end(second.user)


async def test_a_clear_mid_turn_leaves_the_talker_as_before_the_turn(
    cache_dir: Path, conversation: list[Turn]
) -> None:
    first, second = conversation[:2]
    async with thinker(cache_dir) as think, talker(cache_dir) as talk:
        cleared = await spoken_then_cleared(think, talk, first, second)
        after = talk.user_positions("s")
    # As if never spoken: the conversation's second reply, text and codes.
    assert cleared.ids == second.ids
    assert torch.equal(cleared.codes, second.codes)
    # A full edge's one chunk (rows and edits concatenated) leaves the talker the same.
    merged = Accumulator(TalkerEngine.inputs)
    for chunk in edge(cleared.said):
        merged.add(chunk)
    async with talker(cache_dir) as talk:
        await speak(talk, "s", Inputs(edge(first.said)))
        full = await speak(talk, "s", Inputs([merged.snapshot()]))
        assert talk.user_positions("s") == after
    assert torch.equal(full, second.codes)


async def test_a_replay_rebuilds_the_talkers_turns_as_they_were_spoken(
    cache_dir: Path, conversation: list[Turn]
) -> None:
    """A restarted stage gets the conversation again as the caller sent it (a cleared
    turn and its clear among it), all at once, through fresh engines: the talker ends
    with the same user rows and speaks the next reply the same."""
    first, second, third = conversation
    async with thinker(cache_dir) as think, talker(cache_dir) as talk:
        await spoken_then_cleared(think, talk, first, second)
        spoke = await respond(think, talk, [third.user])
        original = talk.user_positions("s")
    history: list[Fields] = [
        first.user,
        {TURN_FIELD: "commit"},
        {TURN_FIELD: "reply", REPLY_FIELD: torch.tensor(first.ids)},
        {"text": "Never mind"},
        *spoken(),
        CLEAR,
        second.user,
        {TURN_FIELD: "commit"},
        {TURN_FIELD: "reply", REPLY_FIELD: torch.tensor(second.ids)},
    ]
    async with thinker(cache_dir) as think, talker(cache_dir) as talk:
        # The history, then the caller's next input: one response.
        replayed = await respond(think, talk, [*history, third.user])
        assert talk.user_positions("s") == original
    assert replayed.ids == spoke.ids == third.ids
    assert torch.equal(replayed.codes, spoke.codes)
    assert torch.equal(replayed.codes, third.codes)


async def test_a_truncation_under_a_spoken_turn_sends_its_rows_again(
    cache_dir: Path, reference: Any
) -> None:
    """A barge-in: the user speaks over a reply and the caller cuts it to what was
    heard. The rows the open turn sent were computed behind the whole reply: they are
    taken back and sent again as computed behind the cut, so the reply to the turn is
    HF's on the conversation with the cut reply."""
    user: Fields = {"audio": audio_clip(SPOKEN_S), "text": "Hi"}
    async with thinker(cache_dir) as think, talker(cache_dir, speaker="ethan") as talk:
        first = await respond(think, talk, [{"text": TURNS[0]}])
        async with Live(think, talk) as live:
            live.send(*spoken())
            await eventually(lambda: heard(live.said))
            early = talker_rows(live.said)
            kept = await talk.truncate("s", 5)
            live.send({TURN_FIELD: "truncate", KEPT_FIELD: torch.tensor(kept)}, {"text": "Hi"})
            second = await live.end(user)
    assert kept == 5
    again = talker_rows(second.said)[: early.shape[0]]
    assert not torch.equal(again, early)  # the placeholders' rows changed with the cut
    n_window = reference.config.thinker_config.audio_config.n_window
    ids, audio = hf_user_turn(user, n_window)
    conversation = [*hf_user_turn(first.user, n_window)[0], *assistant_turn(first.ids[:kept])]
    assert_reply_equal(reference, [*conversation, *ids], second, **audio)
