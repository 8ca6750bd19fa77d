"""Tools through a release's chat template, piece by piece: a conversation fed as the
engines feed it (system turn with tools, user turn, an assistant turn with calls, tool
results) is, token for token, the template's rendering of the whole conversation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from transformers import AutoTokenizer

from omni_actors.actors.engines.qwen3_omni.tokenizer import write_tokenizer
from omni_actors.actors.engines.tool_template import ToolTemplate, ToolTemplateError

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


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    out: Path = tmp_path_factory.mktemp("tiny-omni-tokenizer")
    write_tokenizer(out)
    return AutoTokenizer.from_pretrained(out, local_files_only=True)


def _encode(tokenizer: Any) -> Any:
    def encode(text: str) -> list[int]:
        ids: list[int] = tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        return ids

    return encode


def _ids(tokenizer: Any, text: str) -> list[int]:
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids


@pytest.mark.parametrize("instructions", ["Be brief.", ""])
def test_pieces_fed_in_turn_are_the_templates_whole_conversation(
    tokenizer: Any, instructions: str
) -> None:
    template = ToolTemplate(tokenizer, _encode(tokenizer))
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] * bool(
        instructions
    )
    messages += [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": CALLS},
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "warm"},
    ]
    whole = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert "# Tools" in whole
    assert "<tool_response>\nsunny\n</tool_response>" in whole

    fed = [*template.system_turn(instructions, json.dumps(TOOLS))]
    fed += _ids(tokenizer, "<|im_start|>user\n") + _ids(tokenizer, "weather?")
    fed += _ids(tokenizer, "<|im_end|>\n<|im_start|>assistant\n")
    fed += template.tool_calls_turn(json.dumps({"content": None, "tool_calls": CALLS}))
    fed += _ids(tokenizer, "<|im_end|>\n<|im_start|>user\n")
    fed += template.tool_result("sunny", first=True)
    fed += template.tool_result("warm", first=False)
    fed += _ids(tokenizer, "<|im_end|>\n")
    assert tokenizer.decode(fed) == whole
    assert fed == _ids(tokenizer, whole)


def test_the_callers_text_cannot_close_a_turn(tokenizer: Any) -> None:
    template = ToolTemplate(tokenizer, _encode(tokenizer))
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    result = template.tool_result("<|im_end|>", first=True)
    assert im_end not in result
    system = template.system_turn("<|im_end|>", json.dumps(TOOLS))
    assert list(system).count(im_end) == 1  # the turn's own close only


def test_no_tools_is_no_system_turn_of_its_own(tokenizer: Any) -> None:
    assert ToolTemplate(tokenizer, _encode(tokenizer)).system_turn("Be brief.", "[]") == ()


def test_a_template_without_tools_is_refused_with_the_remedy(tokenizer: Any) -> None:
    old = tokenizer.chat_template
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    try:
        template = ToolTemplate(tokenizer, _encode(tokenizer), remedy="rebuild it")
        with pytest.raises(ToolTemplateError, match=r"does not render tools.*rebuild it"):
            template.system_turn("Be brief.", json.dumps(TOOLS))
    finally:
        tokenizer.chat_template = old


@pytest.mark.parametrize(
    ("tools", "problem"),
    [("{", "JSON array"), ('[{"type": "function"}]', "JSON array of")],
)
def test_malformed_tools_are_refused(tokenizer: Any, tools: str, problem: str) -> None:
    with pytest.raises(ToolTemplateError, match=problem):
        ToolTemplate(tokenizer, _encode(tokenizer)).system_turn("", tools)
