"""Input transcription over ``/v1/realtime`` with the official ``openai`` client: the
pipeline's transcriber (a real tiny Whisper, seeded random weights) beside scripted
reply stages."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from openai.resources.realtime.realtime import AsyncRealtimeConnection
from realtime_client import speech

from omni_actors.pipeline.spec.pipeline import PipelineSpec, load_pipeline
from omni_actors.server.runner import RunningServer, run_server
from omni_actors.server.settings import ServerSettings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> PipelineSpec:
    """scripted-omni with a tiny-whisper transcriber."""
    cache = tmp_path_factory.mktemp("weights")
    data = load_pipeline("scripted-omni").model_dump(by_alias=True)
    data["stages"] = [
        *data["stages"],
        {
            "name": "transcriber",
            "engine": {
                "kind": "transformers.asr",
                "args": {"cache_dir": str(cache), "max_transcript_tokens": 6},
            },
        },
    ]
    data["outputs"]["transcript"] = "transcriber"
    return PipelineSpec.model_validate(data)


@pytest_asyncio.fixture
async def transcribing(pipeline: PipelineSpec) -> AsyncIterator[RunningServer]:
    async with run_server(ServerSettings(port=0), pipeline=pipeline) as running:
        yield running


def client(server: RunningServer) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="unused", websocket_base_url=server.ws_url.removesuffix("/realtime"))


async def update(conn: AsyncRealtimeConnection, transcription: dict[str, Any] | None) -> Any:
    await conn.session.update(
        session={
            "type": "realtime",
            "audio": {"input": {"turn_detection": None, "transcription": transcription}},
        }
    )
    return await conn.recv()


async def commit(conn: AsyncRealtimeConnection, seconds: float, seed: int = 0) -> str:
    """Append and commit ``seconds`` of speech; the user item's id."""
    audio = base64.b64encode(speech(seconds, seed=seed)).decode()
    await conn.input_audio_buffer.append(audio=audio)
    await conn.input_audio_buffer.commit()
    committed = await conn.recv()
    assert committed.type == "input_audio_buffer.committed"
    return committed.item_id


async def transcription_of(conn: AsyncRealtimeConnection, item_id: str) -> list[Any]:
    """The item's transcription events, through ``.completed`` or ``.failed``."""
    found = []
    async for event in conn:
        if event.type.startswith("conversation.item.input_audio_transcription."):
            assert event.item_id == item_id
            assert event.content_index == 0
            found.append(event)
            if not event.type.endswith(".delta"):
                return found
    raise AssertionError("the connection ended")


async def test_committed_audio_gets_its_transcript(transcribing: RunningServer) -> None:
    async with client(transcribing).realtime.connect(model="scripted-omni") as conn:
        assert (await conn.recv()).type == "session.created"
        updated = await update(conn, {"model": "whisper-1", "language": "en"})
        assert updated.type == "session.updated"
        transcription = updated.session.audio.input.transcription
        assert (transcription.model, transcription.language) == ("whisper-1", "en")

        first = await commit(conn, 0.5)
        *deltas, completed = await transcription_of(conn, first)
        assert completed.type == "conversation.item.input_audio_transcription.completed"
        assert completed.transcript  # random weights: random, printable text
        # The text streams as it is decoded: a delta per token that adds to it.
        assert {d.type for d in deltas} == {"conversation.item.input_audio_transcription.delta"}
        assert len(deltas) > 1
        assert "".join(d.delta for d in deltas) == completed.transcript
        assert completed.usage.seconds == pytest.approx(0.5)

        # The same audio again: the same transcript (seeded weights, greedy decoding).
        second = await commit(conn, 0.5)
        assert second != first
        *_, again = await transcription_of(conn, second)
        assert again.transcript == completed.transcript

        # A reply goes on as before, with the transcriber on the session's path.
        await conn.response.create()
        async for event in conn:
            if event.type == "response.done":
                assert event.response.status == "completed"
                break


async def test_a_failed_transcription_fails_only_its_item(transcribing: RunningServer) -> None:
    async with client(transcribing).realtime.connect(model="scripted-omni") as conn:
        assert (await conn.recv()).type == "session.created"
        # tiny-whisper knows English only: each turn's transcription fails.
        assert (await update(conn, {"language": "xx"})).type == "session.updated"
        item = await commit(conn, 0.3)
        (failed,) = await transcription_of(conn, item)
        assert failed.type == "conversation.item.input_audio_transcription.failed"
        assert "xx" in failed.error.message
        await conn.response.create()
        async for event in conn:
            if event.type == "response.done":
                assert event.response.status == "completed"
                break
        assert (await conn.recv()).type == "rate_limits.updated"  # after every response.done
        # Back to a language it knows: the next item is transcribed.
        assert (await update(conn, {"language": "en"})).type == "session.updated"
        item = await commit(conn, 0.3)
        *_, completed = await transcription_of(conn, item)
        assert completed.type == "conversation.item.input_audio_transcription.completed"


@pytest.mark.parametrize(
    ("session", "param"),
    [
        (
            {"type": "realtime", "audio": {"input": {"transcription": {"model": "nova-2"}}}},
            "session.audio.input.transcription.model",
        ),
        (
            {"type": "realtime", "input_audio_transcription": {"model": "nova-2"}},
            "session.input_audio_transcription.model",
        ),
    ],
)
async def test_a_model_not_served_is_refused(
    transcribing: RunningServer, session: dict[str, Any], param: str
) -> None:
    async with client(transcribing).realtime.connect(model="scripted-omni") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(session=session)  # type: ignore[arg-type]
        error = await conn.recv()
        assert error.type == "error"
        assert error.error.param == param
        assert "'nova-2' is not served" in error.error.message
        assert "tiny-whisper" in error.error.message  # what is served


async def test_a_server_without_a_transcriber_refuses_transcription(
    server: RunningServer,
) -> None:
    async with client(server).realtime.connect(model="scripted-omni") as conn:
        assert (await conn.recv()).type == "session.created"
        error = await update(conn, {"model": "whisper-1"})
        assert error.type == "error"
        assert error.error.param == "session.audio.input.transcription"
        assert "no transcriber" in error.error.message
        # null (off) is what it has already: accepted.
        assert (await update(conn, None)).type == "session.updated"
