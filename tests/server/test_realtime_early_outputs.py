"""A realtime conversation served by an entry engine that answers a turn as it arrives.

``Echo`` is the engine ``docs/engines.md`` shows (it yields as its input streams in),
the pipeline's only stage. What it says of a user item before ``response.create`` is
the response's: it comes as the response's deltas, the response ends with its
``response.done``, and ``response.cancel`` is answered whenever it comes: before the
pipeline has started the response, and when a stage does not end it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest
import pytest_asyncio
from realtime_client import RealtimeClient, connect

from omni_actors.actors.engines.contract import Fields
from omni_actors.actors.stage.actor import StageActor
from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.server.runner import RunningServer, run_server
from omni_actors.server.settings import ServerSettings
from omni_actors.testing import eventually
from omni_actors.testing.inspection import actor_instance


class Echo:
    """Upper-cases each text chunk as it arrives; counts the outputs the stage routed.

    Two texts are cues: ``hang`` makes it wait forever without an output once its
    input has ended (a stuck stage); ``wait`` makes it stop reading until ``gate``
    opens, then reply with dots once its input has ended, until the reply is stopped.
    """

    inputs: ClassVar[dict[str, str]] = {"text": "concat"}
    outputs: ClassVar[dict[str, str]] = {"text": "concat"}
    streams_input = True

    def __init__(self, args: object) -> None:
        self.routed = 0
        self.stuck = False
        self.gate = asyncio.Event()

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def abort(self, session: str) -> None: ...
    async def release(self, session: str) -> None: ...

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        cue = ""
        async for chunk in inputs:
            text = str(chunk["text"])
            if text == "wait":
                self.stuck = True
                await self.gate.wait()
            if text in ("hang", "wait"):
                cue = text
                continue
            yield {"text": text.upper()}
            self.routed += 1
        if cue == "hang":
            self.stuck = True
            await asyncio.Event().wait()
        while cue == "wait":
            yield {"text": "."}
            await asyncio.sleep(STEP_S)


STEP_S = 0.005  # between two dots: stands for a decode step

# One chunk in flight per stream: a ``response.create`` waits for the entry stage to
# take the turn's input before the pipeline starts the response.
ECHO = PipelineSpec.model_validate(
    {
        "name": "echo",
        "stages": [{"name": "entry", "engine": {"kind": "test_realtime_early_outputs:Echo"}}],
        "outputs": {"text": "entry"},
        "deadlines": {"idle_s": 30.0, "inter_chunk_s": 10.0},
        "flow": {"window": 1},
    }
)


@pytest_asyncio.fixture
async def echo() -> AsyncIterator[tuple[RunningServer, Echo]]:
    async with run_server(ServerSettings(port=0), pipeline=ECHO) as running:
        stage = actor_instance((await running.state.pipeline.stages())["entry"])
        assert isinstance(stage, StageActor)
        assert isinstance(stage.engine, Echo)
        yield running, stage.engine


async def _item(client: RealtimeClient, text: str) -> None:
    """A user text item, read back as added and done."""
    await client.send(
        "conversation.item.create",
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
    )
    await client.expect("conversation.item.added")
    await client.expect("conversation.item.done")


async def _said(client: RealtimeClient, engine: Echo, text: str) -> None:
    """A user text item, once the engine's answer to it has left its stage."""
    before = engine.routed
    await _item(client, text)
    await eventually(lambda: engine.routed > before, what="the echo routed")


async def _answered(client: RealtimeClient) -> list[dict[str, Any]]:
    """Every client event sent so far has been acted on (the connection reads them in
    order): a ``session.update`` is answered; the events up to its answer."""
    await client.send(
        "session.update",
        session={"type": "realtime", "audio": {"input": {"turn_detection": None}}},
    )
    return await client.until("session.updated")


def _text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


async def test_what_the_engine_said_early_is_the_responses(
    echo: tuple[RunningServer, Echo],
) -> None:
    server, engine = echo
    async with connect(server.ws_url) as client:
        await client.no_vad()
        for turn in ("hi", "again"):
            await _said(client, engine, turn)
            await client.send("response.create", response={"output_modalities": ["text"]})
            events = await client.until("response.done")
            done = events[-1]["response"]
            assert done["status"] == "completed", done
            assert _text(events) == turn.upper()
            assert done["output"][0]["content"][0]["text"] == turn.upper()


async def test_a_cancel_is_always_answered(echo: tuple[RunningServer, Echo]) -> None:
    server, engine = echo
    async with connect(server.ws_url) as client:
        await client.no_vad()
        await _said(client, engine, "hi")
        await client.send("response.create", response={"output_modalities": ["text"]})
        created = await client.expect("response.created")
        await client.send("response.cancel", event_id="cancel1")
        done = (await client.until("response.done"))[-1]["response"]
        assert done["id"] == created["response"]["id"]
        if done["status"] == "completed":  # it ended before the cancel came: refused
            error = await client.error()
            assert (error["code"], error["event_id"]) == ("response_cancel_not_active", "cancel1")
        else:
            assert done["status"] == "cancelled", done
        # The conversation takes the next response.
        await _said(client, engine, "next")
        await client.send("response.create", response={"output_modalities": ["text"]})
        events = await client.until("response.done")
        assert events[-1]["response"]["status"] == "completed"
        assert _text(events) == "NEXT"


async def test_a_cancel_before_the_pipeline_started_the_response_stops_it(
    echo: tuple[RunningServer, Echo],
) -> None:
    server, engine = echo
    async with connect(server.ws_url) as client:
        await client.no_vad()
        await _item(client, "wait")
        await eventually(lambda: engine.stuck, what="the engine stopped reading")
        # The turn's commit is not taken: the response waits for a credit to start.
        await client.send("response.create", response={"output_modalities": ["text"]})
        await client.expect("response.created")
        await client.send("response.cancel")
        events = await _answered(client)
        engine.gate.set()  # the response starts, and replies with dots until stopped
        events += await client.until("response.done")
        assert [e["type"] for e in events][-1] == "response.done"
        assert _text(events) == ""
        assert events[-1]["response"]["status"] == "cancelled"
        await _said(client, engine, "next")
        await client.send("response.create", response={"output_modalities": ["text"]})
        events = await client.until("response.done")
        assert (events[-1]["response"]["status"], _text(events)) == ("completed", "NEXT")


async def test_a_cancel_a_stuck_stage_never_ends_is_answered(
    echo: tuple[RunningServer, Echo], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("omni_actors.pipeline.session._ABORT_TIMEOUT_S", 0.2)
    server, engine = echo
    async with connect(server.ws_url) as client:
        await client.no_vad()
        await _item(client, "hang")
        await client.send("response.create", response={"output_modalities": ["text"]})
        await client.expect("response.created")
        await eventually(lambda: engine.stuck, what="the engine hung")
        await client.send("response.cancel")
        done = (await client.until("response.done"))[-1]["response"]
        assert done["status"] == "cancelled", done
        await _answered(client)  # the connection goes on


async def test_output_audio_buffer_clear_on_a_websocket_is_refused_and_loses_nothing(
    echo: tuple[RunningServer, Echo],
) -> None:
    """The output buffer is the server's only in a WebRTC call; on a websocket the event
    is refused by name, and the session goes on."""
    server, engine = echo
    async with connect(server.ws_url) as client:
        await client.no_vad()
        await client.send("output_audio_buffer.clear", event_id="clear1")
        error = await client.error()
        assert (error["code"], error["event_id"]) == ("invalid_value", "clear1")
        assert "WebRTC" in error["message"]
        await _said(client, engine, "hi")
        await client.send("response.create", response={"output_modalities": ["text"]})
        done = (await client.until("response.done"))[-1]["response"]
        assert done["status"] == "completed", done
