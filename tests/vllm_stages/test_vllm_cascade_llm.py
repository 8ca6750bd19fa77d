"""The cascade's LLM on vLLM (``cascade.llm-vllm``) driven directly, against
transformers' ``generate`` and the torch ``cascade.llm`` on tiny-cascade's weights.

Greedy and float32, one session at a time: a reply's tokens must be exactly
``generate``'s for the prompt the chat template renders, and the torch engine's through
turns, instructions, a clear, a truncation, a replay and a cancelled reply (each
rollback reopens the vLLM request).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch

from omni_actors.actors.engines.cascade.llm_engine import LlmArgs, LlmEngine
from omni_actors.actors.engines.contract import (
    INSTRUCTIONS_FIELD,
    KEPT_FIELD,
    NO_OPTIONS,
    TURN_FIELD,
    Fields,
    ResponseOptions,
)
from omni_actors.models.cache import prepare
from omni_actors.testing import eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")  # one vLLM for the module

COMMIT: Fields = {TURN_FIELD: "commit"}
CLEAR: Fields = {TURN_FIELD: "clear"}
LIMITS = {"max_new_tokens": 8, "min_new_tokens": 4}
ALLOWED = [(97, 123), (32, 33), (44, 45), (46, 47)]  # tiny-cascade's: a-z, " ", ",", "."
END = "<|im_end|>"


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


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("weights")
    prepare("tiny-cascade", cache_dir=where)
    return where


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engines(cache: Path) -> AsyncIterator[tuple[Any, LlmEngine]]:
    from omni_actors.actors.engines.vllm.llm import VllmLlmArgs, VllmLlmEngine

    vllm = VllmLlmEngine(
        VllmLlmArgs(
            cache_dir=cache,
            dtype="float32",
            max_model_len=1024,
            max_num_seqs=4,
            allowed_token_ranges=ALLOWED,
            engine_args={
                "enforce_eager": True,
                "kv_cache_memory_bytes": 64 << 20,
                "gpu_memory_utilization": 0.05,
            },
            **LIMITS,
        )
    )
    torch_llm = LlmEngine(LlmArgs(cache_dir=cache, allowed_token_ranges=ALLOWED, **LIMITS))
    await vllm.start()
    await torch_llm.start()
    try:
        yield vllm, torch_llm
    finally:
        await torch_llm.stop()
        await vllm.stop()


async def respond(engine: Any, session: str, items: Iterable[Fields], **options: Any) -> list[int]:
    inputs = Inputs(items, ResponseOptions(**options))
    outputs = [out async for out in engine.generate(session, inputs)]
    assert all(out.keys() == {"token_ids", "text"} for out in outputs), outputs
    return [int(out["token_ids"][0]) for out in outputs]


async def both(
    engines: tuple[Any, LlmEngine], session: str, items: list[Fields], **options: Any
) -> list[int]:
    """Run ``items`` on both engines: equal tokens, from equal prompts."""
    vllm, torch_llm = engines
    got = await respond(vllm, session, list(items), **options)
    want = await respond(torch_llm, session, list(items), **options)
    assert got == want
    assert vllm.prompt_tokens(session) == torch_llm.prompt_tokens(session)
    assert vllm.last_reply(session) == torch_llm.last_reply(session) == tuple(got)
    return got


def generate(cache: Path, messages: list[dict[str, str]], max_new_tokens: int) -> list[int]:
    """transformers' greedy ``generate`` on tiny-cascade's LLM for ``messages`` (the
    chat template's prompt), under the engines' limits and allowed ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = prepare("tiny-cascade", cache_dir=cache) / "llm"
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    end = tokenizer.convert_tokens_to_ids(END)
    allowed = [i for start, stop in ALLOWED for i in range(start, stop)] + [end]
    out = model.generate(
        torch.tensor([prompt]),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=LIMITS["min_new_tokens"],
        eos_token_id=end,
        prefix_allowed_tokens_fn=lambda _batch, _ids: allowed,
    )
    tokens = [int(t) for t in out[0, len(prompt) :]]
    return tokens[: tokens.index(end)] if end in tokens else tokens


async def test_a_turn_is_transformers_generate_and_the_torch_llms(
    engines: tuple[Any, LlmEngine], cache: Path
) -> None:
    items: list[Fields] = [{INSTRUCTIONS_FIELD: "Be brief."}, {"text": "Hello "}, {"text": "there"}]
    got = await both(engines, "one", items)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello there"},
    ]
    assert got == generate(cache, messages, LIMITS["max_new_tokens"])
    assert len(got) >= LIMITS["min_new_tokens"]
    for engine in engines:
        await engine.release("one")


async def test_turns_clear_truncate_and_replay_equal_the_torch_llm(
    engines: tuple[Any, LlmEngine],
) -> None:
    vllm = engines[0]
    first = await both(engines, "talk", [{"text": "Hi"}])
    request = vllm.running_requests()
    second = await both(engines, "talk", [{"text": "How are you?"}, COMMIT, {"text": "And?"}])
    assert vllm.running_requests() == request  # no rollback: the same request went on
    await both(engines, "talk", [{"text": "Bye"}], max_tokens=3, instructions="Shout.")
    assert not vllm.running_requests()  # the reply's own instructions were cut out
    await both(engines, "talk", [{"text": "Really?"}])
    request = vllm.running_requests()
    cut = {TURN_FIELD: "truncate", KEPT_FIELD: torch.tensor(2)}
    await both(engines, "talk", [cut, {"text": "never mind"}, CLEAR, {"text": "Go on"}])
    assert vllm.running_requests() != request
    # A session replaying a conversation (its replies as reply marks) is where the
    # first one was.
    replay: list[Fields] = [
        {"text": "Hi"},
        {TURN_FIELD: "reply", "reply": torch.tensor(first)},
        {"text": "How are you?"},
        COMMIT,
        {"text": "And?"},
        {TURN_FIELD: "reply", "reply": torch.tensor(second)},
        {"text": "More"},
    ]
    await both(engines, "replay", replay)
    for engine in engines:
        await engine.release("talk")
        await engine.release("replay")


async def test_a_cancelled_reply_keeps_what_was_yielded(engines: tuple[Any, LlmEngine]) -> None:
    vllm = engines[0]
    await both(engines, "barge", [{"text": "Hi"}])
    request = vllm.running_requests()
    for engine in engines:
        replies = engine.generate("barge", Inputs([{"text": "Say a lot"}]))
        for _ in range(2):
            await anext(replies)
        await replies.aclose()  # a barge-in
        assert len(engine.last_reply("barge")) == 2
    # vLLM was still decoding: its request ended, and the next turn opens another over
    # the conversation with the two tokens yielded.
    assert vllm.running_requests() != request

    async def let_go() -> None:
        assert vllm.unfinished_requests() == 0

    await eventually(let_go, timeout=30)
    await both(engines, "barge", [{"text": "Go on"}])
    for engine in engines:
        await engine.release("barge")
