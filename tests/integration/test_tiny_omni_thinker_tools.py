"""tiny-omni's thinker with tools, driven directly: tools, an assistant turn that called
them and tools' results reach the model as the release's chat template writes the whole
conversation (the yardstick: the template's rendering, decoded by plain forwards)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from test_tiny_omni_thinker_turns import assistant, ids, reference, respond, thinker, user

from omni_actors.actors.engines.contract import (
    INSTRUCTIONS_FIELD,
    TOOL_CALLS_FIELD,
    TOOL_RESULT_FIELD,
    TOOLS_FIELD,
    TURN_FIELD,
)
from omni_actors.actors.engines.qwen3_omni.vocabulary import Vocabulary
from omni_actors.pipeline.spec.pipeline import load_pipeline

pytestmark = pytest.mark.integration

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALLS = [
    {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
]
BRIEF = "Be brief."


def _rendered(cache_dir: Path, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    tokenizer = Vocabulary.load(cache_dir / "tiny-omni" / "seed-0").tokenizer
    text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    rendered: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return rendered


def test_the_tiny_omni_thinker_takes_tools() -> None:
    inputs = load_pipeline("tiny-omni").entry_inputs()
    assert {TOOLS_FIELD, TOOL_RESULT_FIELD, TOOL_CALLS_FIELD} <= set(inputs)


async def test_tools_and_a_result_are_the_templates_conversation(
    cache_dir: Path, model: Any
) -> None:
    system = {"role": "system", "content": BRIEF}
    ask = {"role": "user", "content": "weather?"}
    async with thinker(cache_dir) as engine:
        first = await respond(
            engine,
            "s",
            {INSTRUCTIONS_FIELD: BRIEF, TOOLS_FIELD: json.dumps(TOOLS)},
            {"text": "weather?"},
        )
        second = await respond(engine, "s", {TOOL_RESULT_FIELD: "sunny"})
    asked = _rendered(cache_dir, [system, ask], tools=TOOLS)
    assert ids(first) == reference(model, asked, 6)
    result = _rendered(cache_dir, [{"role": "tool", "content": "sunny"}])
    assert ids(second) == reference(model, [*asked, *assistant(ids(first)), *result], 6)


async def test_an_assistant_turn_with_calls_is_taken_back_as_written(
    cache_dir: Path, model: Any
) -> None:
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": CALLS},
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "warm"},
    ]
    call = json.dumps({"content": None, "tool_calls": CALLS})
    async with thinker(cache_dir) as engine:
        answer = await respond(
            engine,
            "s",
            {TOOLS_FIELD: json.dumps(TOOLS), "text": "weather?"},
            {TURN_FIELD: "reply", TOOL_CALLS_FIELD: call},
            {TOOL_RESULT_FIELD: "sunny"},
            {TOOL_RESULT_FIELD: "warm"},
        )
    assert ids(answer) == reference(model, _rendered(cache_dir, messages, tools=TOOLS), 6)


async def test_the_same_tools_again_feed_nothing(cache_dir: Path, model: Any) -> None:
    tools = json.dumps(TOOLS)
    async with thinker(cache_dir) as engine:
        first = await respond(engine, "s", {TOOLS_FIELD: tools}, {"text": "weather?"})
        second = await respond(engine, "s", {TOOLS_FIELD: tools}, {"text": "And?"})
    asked = _rendered(cache_dir, [{"role": "user", "content": "weather?"}], tools=TOOLS)
    expected = reference(model, [*asked, *assistant(ids(first)), *user("And?")], 6)
    assert ids(second) == expected
