"""An entry engine that calls a tool, for the tool tests.

``Weather`` replies one character per output. With ``get_weather`` among its tools and
no tool result in the response's input, it says "Checking." and calls
``get_weather(city="Paris")`` in Qwen's format (the response's own tools, when it has
some, stand in for the session's for that reply); given a tool result, it answers with
it ("It is <result>."). A user turn that says ``malformed`` or ``unknown`` makes it
write a call that is not JSON, or that names a function it was not offered. One
character per output splits the markers over many outputs, as a tokenizer without them
as one token does. With ``chat_engines.Voice`` after it, every character it says is
heard: the samples count what the talker was given.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import ClassVar

from omni_actors.actors.engines.contract import (
    INSTRUCTIONS_FIELD,
    TOOL_CALLS_FIELD,
    TOOL_RESULT_FIELD,
    TOOLS_FIELD,
    TURN_FIELD,
    Fields,
    response_options,
)
from omni_actors.pipeline.spec.pipeline import PipelineSpec

STEP_S = 0.001
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SAID = "Checking."
REPLIES = {
    "malformed": '<tool_call>\n{"name": "get_weather", "arguments": {\n</tool_call>',
    "unknown": '<tool_call>\n{"name": "launch_rockets", "arguments": {}}\n</tool_call>',
}


class Weather:
    inputs: ClassVar[dict[str, str]] = {
        "text": "concat",
        "audio": "concat",
        INSTRUCTIONS_FIELD: "concat",
        TOOLS_FIELD: "concat",
        TOOL_RESULT_FIELD: "concat",
        TOOL_CALLS_FIELD: "concat",
        TURN_FIELD: "concat",
    }
    outputs: ClassVar[dict[str, str]] = {"text": "concat"}

    def __init__(self, args: object) -> None:
        self.tools: dict[str, list[str]] = {}
        self.results: dict[str, list[str]] = {}
        self.calls: dict[str, list[str]] = {}  # assistant turns given back, as sent

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    async def abort(self, session: str) -> None:
        await self.release(session)

    async def release(self, session: str) -> None:
        self.tools.pop(session, None)
        self.results.pop(session, None)
        self.calls.pop(session, None)

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        said = ""
        results: list[str] = []
        async for fields in inputs:
            tools = fields.get(TOOLS_FIELD)
            if isinstance(tools, str):
                self.tools[session] = [t["function"]["name"] for t in json.loads(tools)]
            if isinstance(fields.get(TOOL_CALLS_FIELD), str):
                self.calls.setdefault(session, []).append(str(fields[TOOL_CALLS_FIELD]))
            result = fields.get(TOOL_RESULT_FIELD)
            if isinstance(result, str):
                results.append(result)
            text = fields.get("text")
            if isinstance(text, str):
                said += text
        self.results.setdefault(session, []).extend(results)
        own = response_options(inputs).tools
        offered = (
            [t["function"]["name"] for t in json.loads(own)]
            if own is not None
            else self.tools.get(session, [])
        )
        if results:
            called = len(self.calls.get(session, []))
            reply = f"It is {' and '.join(results)}." + (
                f" ({called} call given back)" if called else ""
            )
        elif said in REPLIES:
            reply = REPLIES[said]
        elif "get_weather" in offered:
            reply = f"{SAID} {CALL}"
        else:
            reply = "No tools."
        for char in reply:
            await asyncio.sleep(STEP_S)  # stands for a decode step
            yield {"text": char}


WEATHER = PipelineSpec.model_validate(
    {
        "name": "weather",
        "stages": [
            {"name": "weather", "engine": {"kind": "tool_engines:Weather"}},
            {"name": "voice", "engine": {"kind": "chat_engines:Voice"}},
        ],
        "edges": [{"from": "weather", "to": "voice"}],
        "outputs": {"text": "weather", "audio": "voice", "sample_rate": 24_000},
        "deadlines": {"idle_s": 30.0, "inter_chunk_s": 10.0},
    }
)
"""``Weather``, voiced by ``chat_engines.Voice`` (every character said is heard)."""
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
"""The tool, as a realtime session takes it."""
