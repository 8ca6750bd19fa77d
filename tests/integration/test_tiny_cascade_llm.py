"""The cascade's LLM (``cascade.llm``) on tiny-cascade: its tokens are HF ``generate``'s."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from omni_actors.actors.engines.cascade.llm_engine import LlmArgs, LlmEngine
from omni_actors.actors.engines.contract import Fields
from omni_actors.models.cache import prepare
from omni_actors.protocols.stage import ResponseOptions

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("weights")
    prepare("tiny-cascade", cache_dir=where, seed=0)
    return where


@pytest.fixture(scope="module")
def hf(cache: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = prepare("tiny-cascade", cache_dir=cache, seed=0) / "llm"
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


async def _inputs(fields: Sequence[Fields]) -> AsyncIterator[Fields]:
    for item in fields:
        yield item


def _prompt(hf: tuple[Any, Any], messages: list[dict[str, str]]) -> list[int]:
    """The ids of ``messages`` as the release's chat template renders them."""
    tokenizer = hf[1]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def _reference(hf: tuple[Any, Any], prompt: list[int], new: int) -> list[int]:
    out = hf[0].generate(
        torch.tensor([prompt]), max_new_tokens=new, do_sample=False, min_new_tokens=new
    )
    return [int(t) for t in out[0, len(prompt) :]]


async def _reply(engine: LlmEngine, session: str, fields: Sequence[Fields]) -> list[int]:
    outputs = [o async for o in engine.generate(session, _inputs(fields))]
    return [int(o["token_ids"]) for o in outputs if "token_ids" in o]


async def test_replies_are_hf_generate_turn_after_turn(cache: Path, hf: tuple[Any, Any]) -> None:
    new = 8
    engine = LlmEngine(LlmArgs(cache_dir=cache, max_new_tokens=new, min_new_tokens=new))
    await engine.start()
    try:
        first = await _reply(
            engine,
            "s#1",
            [{"instructions": "Be brief."}, {"text": "Hello "}, {"text": "there"}],
        )
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello there"},
        ]
        prompt = _prompt(hf, messages)
        assert first == _reference(hf, prompt, new)
        # The next turn sees the first reply in the cache, as HF sees it in the prompt
        # (its ids as decoded: random bytes need not survive a decode and encode).
        second = await _reply(engine, "s#1", [{"text": "And now?"}, {"turn": "commit"}])
        after = hf[1].encode(
            "<|im_end|>\n<|im_start|>user\nAnd now?<|im_end|>\n<|im_start|>assistant\n",
            add_special_tokens=False,
        )
        assert second == _reference(hf, [*prompt, *first, *after], new)
    finally:
        await engine.stop()


async def test_truncate_clear_and_replay_leave_the_cache_as_hf_sees_the_history(
    cache: Path, hf: tuple[Any, Any]
) -> None:
    new = 6
    engine = LlmEngine(LlmArgs(cache_dir=cache, max_new_tokens=new, min_new_tokens=new))
    await engine.start()
    try:
        first = await _reply(engine, "s#1", [{"text": "Hi"}])
        prompt = _prompt(hf, [{"role": "user", "content": "Hi"}])
        # The user heard two tokens of the reply; a turn spoken and cleared leaves nothing.
        second = await _reply(
            engine,
            "s#1",
            [
                {"turn": "truncate", "kept": torch.tensor(2)},
                {"text": "never mind"},
                {"turn": "clear"},
                {"text": "Go on"},
            ],
        )
        after = hf[1].encode(
            "<|im_end|>\n<|im_start|>user\nGo on<|im_end|>\n<|im_start|>assistant\n",
            add_special_tokens=False,
        )
        history = [*prompt, *first[:2], *after]
        assert second == _reference(hf, history, new)
        # A session replaying that conversation (its replies as reply marks) is in the
        # same place: its next reply is the same.
        replayed = await _reply(
            engine,
            "s#2",
            [
                {"text": "Hi"},
                {"turn": "reply", "reply": torch.tensor(first[:2])},
                {"text": "Go on"},
                {"turn": "reply", "reply": torch.tensor(second)},
                {"text": "More"},
            ],
        )
        more = hf[1].encode(
            "<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n",
            add_special_tokens=False,
        )
        assert replayed == _reference(hf, [*history, *second, *more], new)
    finally:
        await engine.stop()


class _WithOptions:
    """A response's input as a stage hands it over: its items, then its options."""

    def __init__(self, items: Sequence[Fields], options: ResponseOptions) -> None:
        self.options = options
        self._items = _inputs(items)

    def __aiter__(self) -> _WithOptions:
        return self

    async def __anext__(self) -> Fields:
        return await anext(self._items)


async def test_a_replys_own_instructions_hold_for_it_alone(
    cache: Path, hf: tuple[Any, Any]
) -> None:
    new = 6
    engine = LlmEngine(LlmArgs(cache_dir=cache, max_new_tokens=new, min_new_tokens=new))
    await engine.start()
    try:
        options = ResponseOptions(instructions="Shout.")
        outputs = [o async for o in engine.generate("s#1", _WithOptions([{"text": "Hi"}], options))]
        first = [int(o["token_ids"]) for o in outputs]
        user = hf[1].encode("<|im_start|>user\nHi<|im_end|>\n", add_special_tokens=False)
        system = hf[1].encode("<|im_start|>system\nShout.<|im_end|>\n", add_special_tokens=False)
        opening = hf[1].encode("<|im_start|>assistant\n", add_special_tokens=False)
        assert first == _reference(hf, [*user, *system, *opening], new)
        # The conversation keeps the reply, not the instructions.
        second = await _reply(engine, "s#1", [{"text": "Again"}])
        again = hf[1].encode(
            "<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n",
            add_special_tokens=False,
        )
        assert second == _reference(hf, [*user, *opening, *first, *again], new)
    finally:
        await engine.stop()
