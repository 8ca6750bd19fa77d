"""pipecat's ``OpenAIRealtimeLLMService`` against the server, in a pipeline of its own.

The service is pipecat's own, unchanged: ``base_url`` points it at the server and the
``settings`` name the served model. Audio frames go in as a transport would push them,
and what comes out is what a pipecat app gets (``TTSAudioRawFrame`` per audio delta,
``TTSStartedFrame`` at the start of each reply). The user speaks, the server's VAD ends
the turn and answers; the user speaks over the second reply, and the server cancels it
(pipecat truncates what was heard) and answers the new turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

pytest.importorskip(
    "pipecat.services.openai.realtime.llm",
    reason="needs the integrations extra: pip install omni-actors[integrations]",
)

from integration_clients import KEY, MODEL, REPLY_AUDIO_BYTES, SLOW
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    ProposedUserStartedSpeakingFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner
from realtime_client import RATE, silence, speech

from omni_actors.server.runner import run_server
from omni_actors.server.settings import ServerSettings
from omni_actors.testing import eventually

FRAME_BYTES = RATE // 50 * 2  # 20 ms of PCM16, as a transport's input frames
WAIT_S = 30.0


class RecordingService(OpenAIRealtimeLLMService):
    """pipecat's service, noting each ``response.done``'s status and its reason as it
    handles it (the frames it pushes do not say whether a reply was completed or
    cancelled, nor why)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.statuses: list[tuple[str, str | None]] = []

    async def _handle_evt_response_done(self, evt: Any) -> None:
        reason = (evt.response.status_details or {}).get("reason")
        self.statuses.append((evt.response.status, reason))
        await super()._handle_evt_response_done(evt)


class Replies(FrameProcessor):
    """The end of the pipeline: the bytes of audio of each reply, the times the server
    heard the user start speaking, and any error."""

    def __init__(self) -> None:
        super().__init__()
        self.audio: list[int] = []
        self.speech_started = 0
        self.errors: list[ErrorFrame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSStartedFrame):
            self.audio.append(0)
        elif isinstance(frame, TTSAudioRawFrame):
            self.audio[-1] += len(frame.audio)
        elif isinstance(frame, ProposedUserStartedSpeakingFrame):
            self.speech_started += 1
        elif isinstance(frame, ErrorFrame):
            self.errors.append(frame)
        await self.push_frame(frame, direction)


class Errors(FrameProcessor):
    """The start of the pipeline: the errors the service pushes upstream."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[ErrorFrame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, ErrorFrame):
            self.errors.append(frame)
        await self.push_frame(frame, direction)


async def say(worker: PipelineWorker, replies: Replies, seconds: float, seed: int) -> None:
    """Speak for ``seconds``, then fall silent, as a microphone would: the silence
    follows once the server has heard the speech start (a microphone's comes later
    still), so what pipecat sends on hearing it (a ``conversation.item.truncate`` of the
    reply playing) reaches the server before the turn ends."""
    heard = replies.speech_started
    await worker.queue_frames(frames(speech(seconds, seed=seed)))
    await eventually(lambda: replies.speech_started > heard, WAIT_S, "the server to hear speech")
    await worker.queue_frames(frames(silence(1.0)))


async def whole(replies: Replies, index: int) -> None:
    """Wait until reply ``index`` has as many bytes as a whole reply. The service notes
    ``response.done`` as it reads it, while the audio frames it pushed before still queue
    on their way down the pipeline: the status comes first, the last frames after."""
    await eventually(
        lambda: replies.audio[index] >= REPLY_AUDIO_BYTES, WAIT_S, f"reply {index}'s audio"
    )


def frames(audio: bytes) -> list[Frame]:
    return [
        InputAudioRawFrame(audio=audio[i : i + FRAME_BYTES], sample_rate=RATE, num_channels=1)
        for i in range(0, len(audio), FRAME_BYTES)
    ]


@asynccontextmanager
async def _running(worker: PipelineWorker) -> AsyncIterator[None]:
    """Run ``worker`` until the block ends, then end it with an ``EndFrame``."""
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker: PipelineWorker, frame: Frame) -> None:
        started.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    try:
        async with asyncio.timeout(WAIT_S):
            await started.wait()
        yield
    finally:
        await worker.queue_frame(EndFrame())
        async with asyncio.timeout(WAIT_S):
            await running


async def test_a_pipecat_pipeline_talks_with_the_server_and_is_barged_in_on() -> None:
    async with run_server(ServerSettings(port=0, api_key=KEY), pipeline=SLOW) as server:
        service = RecordingService(
            api_key=KEY,
            base_url=server.ws_url,
            settings=OpenAIRealtimeLLMService.Settings(model=MODEL),
        )
        errors, replies = Errors(), Replies()
        worker = PipelineWorker(
            Pipeline([errors, service, replies]),
            params=PipelineParams(audio_in_sample_rate=RATE),
            enable_rtvi=False,
            cancel_on_idle_timeout=False,
        )
        async with _running(worker):
            # The user speaks; the server's VAD ends the turn and the reply comes back.
            await say(worker, replies, 0.6, seed=0)
            await eventually(lambda: service.statuses == [("completed", None)], WAIT_S, "a reply")
            await whole(replies, 0)
            assert replies.audio == [REPLY_AUDIO_BYTES]

            # A second turn; the user speaks again over its first audio.
            await say(worker, replies, 0.6, seed=1)
            await eventually(lambda: len(replies.audio) == 2, WAIT_S, "the second reply")
            await say(worker, replies, 0.6, seed=2)
            # The server cancels the reply as it hears the user (``turn_detected``); pipecat
            # then truncates it to what was played.
            await eventually(
                lambda: (
                    service.statuses
                    == [("completed", None), ("cancelled", "turn_detected"), ("completed", None)]
                ),
                WAIT_S,
                "the barged-in reply cancelled, then the new turn answered",
            )
            assert len(replies.audio) == 3
            assert 0 < replies.audio[1] < REPLY_AUDIO_BYTES
            await whole(replies, 2)
            assert replies.audio[2] == REPLY_AUDIO_BYTES
        assert errors.errors == replies.errors == []
