"""Voice names: OpenAI's names and the model's speakers are taken, on the realtime and
chat paths, through the official ``openai`` client; any other name is refused where it
is set; a pipeline without voices takes any name as before."""

from __future__ import annotations

import argparse
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import openai
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from realtime_client import speech

from omni_actors.cli.serve import add_serve_arguments, serve_command
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineSpec, load_pipeline
from omni_actors.protocols.control import PipelineHealth, StageHealth
from omni_actors.protocols.events import ResponseDone
from omni_actors.server.runner import RunningServer, run_server
from omni_actors.server.settings import ServerSettings
from omni_actors.server.voices import (
    OPENAI_VOICES,
    UnknownVoiceError,
    VoiceMap,
    VoiceMapError,
    parse_voice_map,
    pipeline_voices,
)

SPEAKERS = ("chelsie", "ethan")
HELLO = [{"role": "user", "content": "hello"}]


def voiced(*speakers: str) -> PipelineSpec:
    """scripted-omni whose talker speaks with ``speakers`` (and refuses other voices)."""
    data: dict[str, Any] = load_pipeline("scripted-omni").model_dump(by_alias=True)
    data["stages"][1]["engine"]["args"]["voices"] = list(speakers)
    return PipelineSpec.model_validate(data)


@pytest_asyncio.fixture
async def voiced_server() -> AsyncIterator[RunningServer]:
    settings = ServerSettings(port=0, voice_map={"custom": "Ethan"})
    async with run_server(settings, pipeline=voiced(*SPEAKERS)) as running:
        yield running


def clients(server: RunningServer) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=server.url + "/v1",
        websocket_base_url=server.ws_url.removesuffix("/realtime"),
        api_key="unused",
        max_retries=0,
        timeout=20,
    )


# -- the map ---------------------------------------------------------------------------


def test_every_openai_voice_names_a_speaker() -> None:
    voices = VoiceMap.of(SPEAKERS)
    spoken = {voices.speaker(name) for name in OPENAI_VOICES}
    assert spoken == set(SPEAKERS)  # all of them used, none invented
    assert voices.speaker("alloy") == "chelsie"  # the first OpenAI voice, the first speaker
    assert voices.speaker("ash") == "ethan"
    assert voices.speaker("ETHAN") == "ethan"  # a speaker's own name, any case
    assert voices.speaker("Nova") == voices.speaker("nova")


def test_a_configured_name_wins_and_must_name_a_speaker() -> None:
    voices = VoiceMap.of(SPEAKERS, {"alloy": "Ethan", "narrator": "chelsie"})
    assert voices.speaker("alloy") == "ethan"
    assert voices.speaker("narrator") == "chelsie"
    with pytest.raises(VoiceMapError, match=r"'nobody'.*chelsie, ethan"):
        VoiceMap.of(SPEAKERS, {"alloy": "nobody"})
    with pytest.raises(VoiceMapError, match="no stage that speaks"):
        VoiceMap.of((), {"alloy": "ethan"})


def test_an_unknown_voice_is_refused_with_the_names_taken() -> None:
    with pytest.raises(UnknownVoiceError) as caught:
        VoiceMap.of(SPEAKERS).speaker("bogus")
    message = str(caught.value)
    assert "'bogus'" in message
    assert all(name in message for name in (*SPEAKERS, *OPENAI_VOICES))


def test_without_speakers_any_voice_goes_as_sent() -> None:
    assert VoiceMap.of(()).speaker("whatever") == "whatever"


def test_the_voice_map_option_takes_pairs_and_files(tmp_path: Path) -> None:
    (tmp_path / "voices.yaml").write_text("alloy: ethan\nnova: chelsie\n")
    (tmp_path / "voices.json").write_text(json.dumps({"echo": "ethan"}))
    found = parse_voice_map(
        [str(tmp_path / "voices.yaml"), str(tmp_path / "voices.json"), "alloy=chelsie"]
    )
    assert found == {"alloy": "chelsie", "nova": "chelsie", "echo": "ethan"}
    with pytest.raises(VoiceMapError, match="NAME=SPEAKER"):
        parse_voice_map(["alloy="])
    with pytest.raises(VoiceMapError, match="neither"):
        parse_voice_map([str(tmp_path / "missing.yaml")])
    (tmp_path / "list.yaml").write_text("- alloy\n")
    with pytest.raises(VoiceMapError, match="mapping"):
        parse_voice_map([str(tmp_path / "list.yaml")])


async def test_a_map_naming_no_speaker_fails_the_start() -> None:
    settings = ServerSettings(port=0, voice_map={"alloy": "nobody"})
    with pytest.raises(VoiceMapError, match="nobody"):
        async with run_server(settings, pipeline=voiced(*SPEAKERS)):
            pass


# -- realtime ----------------------------------------------------------------------------


async def test_an_openai_voice_speaks_on_the_realtime_path(voiced_server: RunningServer) -> None:
    async with clients(voiced_server).realtime.connect(model="scripted-omni") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(
            session={
                "type": "realtime",
                "audio": {"input": {"turn_detection": None}, "output": {"voice": "alloy"}},
            }
        )
        updated = await conn.recv()
        assert updated.type == "session.updated"
        assert updated.session.audio.output.voice == "alloy"  # as the client set it
        for voice in (None, "custom", "ETHAN"):  # the session's, then per response
            await conn.input_audio_buffer.append(audio=base64.b64encode(speech(0.2)).decode())
            if voice is None:
                await conn.response.create()
            else:
                await conn.response.create(response={"audio": {"output": {"voice": voice}}})
            audio = 0
            async for event in conn:
                if event.type == "response.output_audio.delta":
                    audio += len(base64.b64decode(event.delta))
                elif event.type == "response.done":
                    assert event.response.status == "completed", event.response.status_details
                    assert event.response.audio.output.voice == (voice or "alloy")
                    break
            assert audio > 0


async def test_an_unknown_voice_is_refused_by_session_update(
    voiced_server: RunningServer,
) -> None:
    async with clients(voiced_server).realtime.connect(model="scripted-omni") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(
            session={"type": "realtime", "audio": {"output": {"voice": "bogus"}}}
        )
        error = await conn.recv()
        assert error.type == "error"
        assert error.error.param == "session.audio.output.voice"
        assert "'bogus'" in error.error.message
        assert all(name in error.error.message for name in ("alloy", "custom", *SPEAKERS))
        await conn.response.create(response={"audio": {"output": {"voice": "bogus"}}})
        error = await conn.recv()
        assert error.type == "error"
        assert error.error.param == "response.audio.output.voice"


# -- chat completions ------------------------------------------------------------------


@pytest.mark.parametrize("voice", ["nova", "custom", "Chelsie"])
async def test_an_openai_voice_speaks_on_the_chat_path(
    voiced_server: RunningServer, voice: str
) -> None:
    completion = await clients(voiced_server).chat.completions.create(
        model="scripted-omni",
        messages=HELLO,  # type: ignore[arg-type]
        modalities=["text", "audio"],
        audio={"voice": voice, "format": "pcm16"},  # type: ignore[typeddict-item]
    )
    audio = completion.choices[0].message.audio
    assert audio is not None
    assert base64.b64decode(audio.data)


async def test_an_unknown_voice_is_a_400_before_any_streaming(
    voiced_server: RunningServer,
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await clients(voiced_server).chat.completions.create(
            model="scripted-omni",
            messages=HELLO,  # type: ignore[arg-type]
            modalities=["text", "audio"],
            audio={"voice": "bogus", "format": "pcm16"},  # type: ignore[typeddict-item]
            stream=True,
        )
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["param"] == "audio.voice"
    assert "'bogus'" in body["message"]
    assert "alloy" in body["message"]


async def test_a_pipeline_without_voices_takes_any_name(server: RunningServer) -> None:
    completion = await clients(server).chat.completions.create(
        model="scripted-omni",
        messages=HELLO,  # type: ignore[arg-type]
        modalities=["text", "audio"],
        audio={"voice": "anything", "format": "pcm16"},  # type: ignore[typeddict-item]
    )
    assert completion.choices[0].message.audio is not None


def test_serve_refuses_a_malformed_voice_map(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    ns = parser.parse_args(["--preset", "scripted-omni", "--voice-map", "alloy=", "--port", "0"])
    assert serve_command(ns) == 2
    assert "NAME=SPEAKER" in capsys.readouterr().err
    ns = parser.parse_args(["--voice-map", "alloy=ethan", "--voice-map", "nova=chelsie"])
    assert parse_voice_map(ns.voice_map) == {"alloy": "ethan", "nova": "chelsie"}


def test_the_voices_are_learnt_only_from_a_whole_answer() -> None:
    talker = StageHealth(stage="talker", state="running", restarts=0, sessions=0, queued=0)
    spoken = msgspec.structs.replace(talker, voices=["ethan", "chelsie"])
    thinker = StageHealth(stage="thinker", state="running", restarts=0, sessions=0, queued=0)
    assert pipeline_voices(PipelineHealth(stages={"thinker": thinker, "talker": spoken})) == (
        ["chelsie", "ethan"],
        None,
        True,
    )
    restarting = msgspec.structs.replace(talker, state="restarting", queued=None)
    assert pipeline_voices(PipelineHealth(stages={"thinker": thinker, "talker": restarting})) == (
        [],
        None,
        False,
    )
    told = msgspec.structs.replace(spoken, voice="ethan")
    assert pipeline_voices(PipelineHealth(stages={"thinker": thinker, "talker": told}))[1] == (
        "ethan"
    )


async def test_session_created_names_the_default_voice(voiced_server: RunningServer) -> None:
    async with clients(voiced_server).realtime.connect(model="scripted-omni") as conn:
        created = await conn.recv()
        assert created.type == "session.created"
        assert created.session.audio.output.voice == "chelsie"  # the talker's first


async def test_the_library_checks_voices_as_the_server_does() -> None:
    # One map: the library takes the names the server takes, and refuses the others
    # before anything is sent (not late, in the talker, after the reply's text).
    async with (
        OmniPipeline(voiced(*SPEAKERS), voice_map={"custom": "Ethan"}) as omni,
        omni.session(modalities=("text", "audio")) as session,
    ):
        for voice in ("nova", "custom", "ETHAN"):
            await session.send(text="hi")
            done = await (await session.respond(voice=voice)).wait()
            assert isinstance(done, ResponseDone)
            assert done.status == "completed", done.message
        await session.send(text="hi")
        with pytest.raises(UnknownVoiceError, match="unknown voice 'bogus'"):
            await session.respond(voice="bogus")
        done = await (await session.respond()).wait()  # nothing was sent: the turn waits
        assert isinstance(done, ResponseDone)
        assert done.status == "completed"
