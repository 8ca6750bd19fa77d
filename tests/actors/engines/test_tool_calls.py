"""Tool calls in reply text: split out of streamed deltas, markers split anyhow, and
checked against the tools offered."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from omni_actors.actors.engines.tool_calls import (
    CallBody,
    MalformedToolCallError,
    Segment,
    ToolCallSplitter,
    parse_tool_call,
)

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
BODY = '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'


def _split(deltas: list[str]) -> list[Segment]:
    splitter = ToolCallSplitter()
    out = [s for d in deltas for s in splitter.feed(d)]
    return out + splitter.flush()


def _merged(segments: list[Segment]) -> list[tuple[str, str]]:
    merged: list[tuple[str, str]] = []
    for s in segments:
        if merged and merged[-1][0] == s.kind:
            merged[-1] = (s.kind, merged[-1][1] + s.text)
        else:
            merged.append((s.kind, s.text))
    return merged


EXPECTED = [
    ("said", "Sure. "),
    ("open", "<tool_call>"),
    ("body", BODY),
    ("close", "</tool_call>"),
    ("said", " Done."),
]


def test_a_call_in_one_delta_is_split_from_the_text_around_it() -> None:
    assert _merged(_split(["Sure. " + CALL + " Done."])) == EXPECTED


@given(st.lists(st.integers(min_value=1, max_value=len(CALL) + 11), max_size=20))
def test_any_split_of_the_deltas_gives_the_same_segments(cuts: list[int]) -> None:
    text = "Sure. " + CALL + " Done."
    points = sorted({c for c in cuts if c < len(text)})
    deltas = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    assert _merged(_split(deltas)) == EXPECTED


def test_text_that_only_looks_like_a_marker_is_said_once_it_is_not_one() -> None:
    splitter = ToolCallSplitter()
    assert splitter.feed("a <tool") == [Segment("said", "a ")]
    assert splitter.holding
    assert splitter.feed("box>") == [Segment("said", "<toolbox>")]
    assert splitter.feed("<") == []
    assert splitter.flush() == [Segment("said", "<")]


def test_an_unclosed_call_ends_in_the_call() -> None:
    splitter = ToolCallSplitter()
    splitter.feed('<tool_call>{"name": "x"}</tool')
    assert splitter.in_call
    assert splitter.flush() == [Segment("body", "</tool")]


def test_a_well_formed_call_parses() -> None:
    call = parse_tool_call(BODY, {"get_weather"})
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert parse_tool_call('{"name": "f", "arguments": "{\\"a\\": 1}"}', {"f"}).arguments == (
        '{"a": 1}'
    )
    assert parse_tool_call('{"name": "f"}', {"f"}).arguments == "{}"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('{"name": "get_weather", "arguments": {', "not valid JSON"),
        ('["get_weather"]', "not a JSON object"),
        ('{"arguments": {}}', "without a function name"),
        ('{"name": "delete_all", "arguments": {}}', r"'delete_all', which is not one of"),
        ('{"name": "get_weather", "arguments": "{oops"}', "arguments that are not JSON"),
        ('{"name": "get_weather", "arguments": [1]}', "not a JSON object"),
    ],
)
def test_a_malformed_call_is_refused_with_what_is_wrong(body: str, problem: str) -> None:
    with pytest.raises(MalformedToolCallError, match=problem):
        parse_tool_call(body, {"get_weather"})


def _stream(body: str, cuts: list[int]) -> tuple[list[str], list[str], CallBody]:
    reader = CallBody()
    points = sorted({c for c in cuts if 0 < c < len(body)})
    names: list[str] = []
    told: list[str] = []
    for a, b in zip([0, *points], [*points, len(body)], strict=True):
        name, arguments = reader.feed(body[a:b])
        names += [name] if name is not None else []
        told += [arguments] if arguments else []
    return names, told, reader


NESTED = '\n{"name": "f", "arguments": {"s": "a}\\"{[", "n": [1, {"b": 2}]}}\n'


@given(st.lists(st.integers(min_value=1, max_value=len(NESTED)), max_size=30))
def test_a_body_tells_its_name_then_streams_exactly_its_arguments(cuts: list[int]) -> None:
    names, told, reader = _stream(NESTED, cuts)
    assert names == ["f"]
    call = reader.close({"f"})
    # Brackets and quotes inside strings do not end the object; the body's own } is not told.
    assert "".join(told) == call.arguments == '{"s": "a}\\"{[", "n": [1, {"b": 2}]}'
    assert json.loads(call.arguments)["s"] == 'a}"{['


def test_the_name_is_told_once_written_before_the_arguments() -> None:
    reader = CallBody()
    assert reader.feed('{"name": "get_wea') == (None, "")
    assert reader.feed('ther", "argu') == ("get_weather", "")
    assert reader.feed('ments": {"ci') == (None, '{"ci')
    assert reader.feed('ty": "Paris"}}') == (None, 'ty": "Paris"}')


@pytest.mark.parametrize(
    "body",
    [
        '{"arguments": {"a": 1}, "name": "f"}',  # the name last: told at close
        '{"name": "f", "arguments": "{\\"a\\": 1}"}',  # arguments as JSON text
    ],
)
def test_a_body_of_another_shape_tells_its_arguments_at_close(body: str) -> None:
    _, told, reader = _stream(body, list(range(len(body))))
    assert told == []
    assert json.loads(reader.close({"f"}).arguments) == {"a": 1}


def test_a_body_that_names_its_function_twice_is_refused() -> None:
    names, _, reader = _stream('{"name": "f", "arguments": {}, "name": "g"}', [5, 17])
    assert names == ["f"]
    with pytest.raises(MalformedToolCallError, match="more than once"):
        reader.close({"f", "g"})
