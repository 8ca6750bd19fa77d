"""A tool call the entry engine writes reaches the caller as text and is never spoken."""

from __future__ import annotations

from pipeline_helpers import collect, done, make_spec, samples_of, text_of

from omni_actors.actors.engines.scripted import reply_pieces
from omni_actors.pipeline.omni_pipeline import OmniPipeline

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SAMPLES_PER_OUTPUT = 2 * 240  # talker: 2 frames per input row; code2wav: 240 samples a frame


def _spec(reply: str, *, tools: bool = True) -> object:
    inputs = ["text", "audio", "tools"] if tools else ["text", "audio"]
    thinker = {"reply_text": reply, "outputs": len(reply_pieces(reply)), "inputs": inputs}
    return make_spec(thinker=thinker)


async def test_the_talker_gets_nothing_of_a_tool_call() -> None:
    reply = "Let me look. " + CALL
    async with OmniPipeline(_spec(reply)) as omni:  # type: ignore[arg-type]
        events = await collect(omni.generate(text="weather?"))
    done(events)
    assert text_of(events) == reply  # the caller reads the call out of the text
    assert samples_of(events) == 3 * SAMPLES_PER_OUTPUT  # "Let", " me", " look."


async def test_a_reply_that_is_only_a_call_is_silent() -> None:
    async with OmniPipeline(_spec(CALL)) as omni:  # type: ignore[arg-type]
        events = await collect(omni.generate(text="weather?"))
    done(events)
    assert samples_of(events) == 0


async def test_an_entry_engine_without_tools_is_voiced_as_it_writes() -> None:
    async with OmniPipeline(_spec(CALL, tools=False)) as omni:  # type: ignore[arg-type]
        events = await collect(omni.generate(text="weather?"))
    assert samples_of(events) == len(reply_pieces(CALL)) * SAMPLES_PER_OUTPUT
