"""A pipecat pipeline whose speech-to-speech model is omni-actors.

pipecat's own ``OpenAIRealtimeLLMService``, unchanged, with ``base_url`` pointing at
``omni-actors serve``. Where a bot would have a transport (Daily, a local microphone),
this pipeline has a frame source that speaks one turn (a WAV file, or a synthesized
utterance) and a sink that keeps the reply: the server's voice activity detection ends
the turn, and the reply's audio comes back as pipecat's ``TTSAudioRawFrame``s.

Run: pip install 'omni-actors[integrations]'
     omni-actors serve --preset tiny-omni --api-key KEY
     python examples/pipecat_agent.py ws://127.0.0.1:8000/v1/realtime --api-key KEY
"""

from __future__ import annotations

import asyncio
import sys

from caller import RATE, arguments, served_model, silence, utterance, write_wav
from loguru import logger
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    LLMFullResponseEndFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

FRAME = RATE // 50 * 2  # 20 ms of PCM16, as a transport's input frames


class Reply(FrameProcessor):
    """Where a transport would play the reply: keeps its audio and its transcript."""

    def __init__(self) -> None:
        super().__init__()
        self.audio = bytearray()
        self.transcript = ""
        self.done = asyncio.Event()
        self.error: str | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.audio += frame.audio
        elif isinstance(frame, TTSTextFrame):
            self.transcript += frame.text
        elif isinstance(frame, LLMFullResponseEndFrame) and self.audio:
            self.done.set()
        elif isinstance(frame, ErrorFrame):
            self.error = frame.error
            self.done.set()
        await self.push_frame(frame, direction)


async def main() -> None:
    args = arguments(__doc__ or "")
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    llm = OpenAIRealtimeLLMService(
        api_key=args.api_key,
        base_url=args.url,
        # The server serves one model, and refuses a session that names another:
        # pipecat names gpt-realtime unless told.
        settings=OpenAIRealtimeLLMService.Settings(model=served_model(args.url, args.api_key)),
    )
    reply = Reply()
    worker = PipelineWorker(
        Pipeline([llm, reply]),
        params=PipelineParams(audio_in_sample_rate=RATE),
        enable_rtvi=False,
        cancel_on_idle_timeout=False,
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker: PipelineWorker, frame: Frame) -> None:
        started.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    await started.wait()
    audio = utterance(args.wav) + silence(1.0)  # speech, then silence: the turn ends
    await worker.queue_frames(
        [
            InputAudioRawFrame(audio=audio[i : i + FRAME], sample_rate=RATE, num_channels=1)
            for i in range(0, len(audio), FRAME)
        ]
    )
    await asyncio.wait_for(reply.done.wait(), timeout=120)
    await worker.queue_frame(EndFrame())
    await running
    if reply.error:
        raise SystemExit(f"pipecat: {reply.error}")
    write_wav(args.out, bytes(reply.audio))
    print(f"reply: {len(reply.audio) / 2 / RATE:.2f} s of audio -> {args.out}")
    print(f"transcript: {reply.transcript}")


if __name__ == "__main__":
    asyncio.run(main())
