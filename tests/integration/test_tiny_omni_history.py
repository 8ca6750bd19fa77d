"""tiny-omni's thinker given history: an assistant turn by its words, and a response's
own instructions, driven directly.

The yardstick is the conversation written out token by token as the release's chat
template renders it, decoded by plain forwards: an assistant turn given as text must
sit in the thinker's context as the template's assistant turn (the ids a reply that
said it leaves there), and a response's own instructions must be in the context of its
reply and in none after it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from test_tiny_omni_thinker_turns import (
    Inputs,
    assistant,
    ids,
    reference,
    respond,
    thinker,
    user,
)
from thinker_steps import AND, COMMIT, HI, reply, user_rows
from tiny_omni_ids import encode, system_turn, tokenizer

from omni_actors.actors.engines.contract import TURN_FIELD, Fields, ResponseOptions

pytestmark = pytest.mark.integration

SAID = "Sure, here it is."
TERSE = "Answer in one word."


def said(text: str) -> Fields:
    """An assistant turn given by its words, as a stage hands the engine the mark."""
    return {TURN_FIELD: "reply", "text": text}


def test_the_written_turns_are_the_chat_templates() -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": SAID},
        {"role": "user", "content": str(AND["text"])},
    ]
    rendered = tokenizer().apply_chat_template(messages, tokenize=False)
    template = tokenizer().encode(rendered, add_special_tokens=False)
    assert template == [*user("Hi"), *assistant(encode(SAID)), *user(str(AND["text"]))]


async def test_an_assistant_turn_given_by_its_words_is_the_templates_turn(
    cache_dir: Path, model: Any
) -> None:
    async with thinker(cache_dir) as engine:
        given = await respond(engine, "text", HI, said(SAID), AND)
        as_ids = await respond(engine, "ids", HI, COMMIT, reply(encode(SAID)), AND)
        assert engine.cached_tokens("text") == engine.cached_tokens("ids")
        assert engine.last_reply("text") == tuple(ids(given))  # the turn given is not one
        # The conversation goes on alike.
        after = [ids(await respond(engine, s, {"text": "Ok"})) for s in ("text", "ids")]
    conversation = [*user("Hi"), *assistant(encode(SAID)), *user(str(AND["text"]))]
    assert ids(given) == ids(as_ids) == reference(model, conversation, 6)
    assert after[0] == after[1]
    # The talker gets the user turns' rows, and nothing for the assistant turn.
    assert torch.equal(user_rows(given), user_rows(as_ids))


async def test_a_generated_reply_given_back_by_its_words_is_held_as_generated(
    cache_dir: Path,
) -> None:
    async with thinker(cache_dir) as engine:
        first = await respond(engine, "a", HI)
        words = engine.vocabulary.decode(ids(first))
        assert encode(words) == ids(first)  # printable bytes: the words encode back
        second = await respond(engine, "a", AND)
        given = await respond(engine, "b", HI, said(words), AND)
        assert engine.cached_tokens("b") == engine.cached_tokens("a")
    assert ids(given) == ids(second)
    assert torch.equal(user_rows(given), user_rows(first + second))


async def test_a_responses_own_instructions_hold_for_its_reply_alone(
    cache_dir: Path, model: Any
) -> None:
    async with thinker(cache_dir) as engine:
        first = await respond(engine, "own", HI, instructions=TERSE)
        r1 = ids(first)
        second = await respond(engine, "own", AND)
        # The same conversation, the first reply given back: no instructions in it.
        plain = await respond(engine, "plain", HI, COMMIT, reply(r1), AND)
        assert engine.cached_tokens("own") == engine.cached_tokens("plain")
        assert engine.last_reply("own") == tuple(ids(second))
        after = [ids(await respond(engine, s, {"text": "Ok"})) for s in ("own", "plain")]
    assert r1 == reference(model, [*user("Hi"), *system_turn(TERSE)], 6)
    assert (
        ids(second)
        == ids(plain)
        == reference(model, [*user("Hi"), *assistant(r1), *user(str(AND["text"]))], 6)
    )
    assert after[0] == after[1]
    # No row of the system turn reaches the talker.
    assert torch.equal(user_rows(first + second), user_rows(plain))


async def test_a_cancelled_reply_under_its_own_instructions_keeps_what_was_said(
    cache_dir: Path, model: Any
) -> None:
    async with thinker(cache_dir) as engine:
        outputs = engine.generate("own", Inputs([HI], ResponseOptions(instructions=TERSE)))
        kept: list[int] = []
        async for out in outputs:
            if "token_ids" in out:
                token = out["token_ids"]
                assert isinstance(token, torch.Tensor)
                kept.append(int(token))
                if len(kept) == 2:
                    break
        await outputs.aclose()
        assert engine.last_reply("own") == tuple(kept)
        after = ids(await respond(engine, "own", AND))
    conversation = [*user("Hi"), *assistant(kept), *user(str(AND["text"]))]
    assert after == reference(model, conversation, 6)


WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def tools_turn() -> list[int]:
    """The system turn the chat template writes to offer ``WEATHER_TOOLS`` (no system
    message): what it writes before a user turn with them, less what it writes without."""
    hi = [{"role": "user", "content": "Hi"}]
    offered = tokenizer().apply_chat_template(hi, tools=WEATHER_TOOLS, tokenize=False)
    plain = tokenizer().apply_chat_template(hi, tokenize=False)
    assert offered.endswith(plain)
    turn: list[int] = tokenizer().encode(offered[: len(offered) - len(plain)])
    return turn


async def test_a_responses_own_tools_hold_for_its_reply_alone(cache_dir: Path, model: Any) -> None:
    async with thinker(cache_dir) as engine:
        first = await respond(engine, "own", HI, tools=json.dumps(WEATHER_TOOLS))
        r1 = ids(first)
        second = await respond(engine, "own", AND)
        plain = await respond(engine, "plain", HI, COMMIT, reply(r1), AND)
        assert engine.cached_tokens("own") == engine.cached_tokens("plain")
    assert r1 == reference(model, [*user("Hi"), *tools_turn()], 6)
    assert ids(second) == ids(plain)
    assert torch.equal(user_rows(first + second), user_rows(plain))
