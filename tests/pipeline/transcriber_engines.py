"""Transcriber engines for the pipeline tests: each turn's transcript says how many
samples it heard and the settings it was given.

``CountingTranscriber`` serves a transcriber beside the entry stage. A turn named
``bad`` yields a transcript error (that turn fails); one named ``crash`` makes
``generate`` raise (the engine fails the segment). While ``GATE`` is set and not open,
each transcript waits for it (a slow transcriber).

``CountingRecognizer`` is an entry stage that transcribes, as a cascade's recognizer: a
committed turn with audio goes on to the next stage as the text of its transcript and,
for a turn named by its item, to the caller; the rest of the input passes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import ClassVar

import torch

from omni_actors.actors.engines.contract import KEPT_FIELD, REPLY_FIELD, TURN_FIELD, Fields
from omni_actors.actors.engines.transcriber_ports import TRANSCRIBER_INPUTS, TRANSCRIBER_OUTPUTS

GATE: dict[str, asyncio.Event] = {}
"""``GATE["open"]``, when set, holds every transcript until it is set."""


class TranscriberError(RuntimeError):
    """The transcriber failed on purpose."""


class CountingTranscriber:
    inputs: ClassVar[dict[str, str]] = dict(TRANSCRIBER_INPUTS)
    outputs: ClassVar[dict[str, str]] = dict(TRANSCRIBER_OUTPUTS)

    def __init__(self, args: object) -> None:
        self.heard: dict[str, int] = {}  # samples of audio taken, per session
        self.settings: dict[str, dict[str, str]] = {}

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    async def abort(self, session: str) -> None:
        self.settings.pop(session, None)

    async def release(self, session: str) -> None:
        self.settings.pop(session, None)

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        settings = self.settings.setdefault(session, {"language": "", "prompt": ""})
        samples, item = 0, ""
        turns: list[tuple[str, int, str]] = []
        async for fields in inputs:
            mark = fields.get(TURN_FIELD)
            if mark == "commit" and samples:
                turns.append((item, samples, settings["language"]))
                samples, item = 0, ""
            elif mark == "clear":
                samples, item = 0, ""
            for name in ("language", "prompt"):
                value = fields.get(name)
                if isinstance(value, str):
                    settings[name] = value
            named = fields.get("item")
            if isinstance(named, str):
                item = named
            audio = fields.get("audio")
            if isinstance(audio, torch.Tensor):
                samples += audio.numel()
                self.heard[session] = self.heard.get(session, 0) + audio.numel()
            while turns:
                yield await self._transcript(*turns.pop(0))
        if samples:
            yield await self._transcript(item, samples, settings["language"])

    async def _transcript(self, item: str, samples: int, language: str) -> Fields:
        gate = GATE.get("open")
        if gate is not None:
            await gate.wait()
        if item == "crash":
            raise TranscriberError("the transcriber failed on purpose")
        if item == "bad":
            return {"item": item, "transcript_error": "this turn cannot be transcribed"}
        return {"item": item, "transcript": f"{samples} samples {language}".strip()}


class CountingRecognizer:
    inputs: ClassVar[dict[str, str]] = {
        **TRANSCRIBER_INPUTS,
        "text": "concat",
        REPLY_FIELD: "concat",
        KEPT_FIELD: "concat",
    }
    outputs: ClassVar[dict[str, str]] = {
        **TRANSCRIBER_OUTPUTS,
        "text": "concat",
        TURN_FIELD: "concat",
        REPLY_FIELD: "concat",
        KEPT_FIELD: "concat",
    }
    streams_input = True

    def __init__(self, args: object) -> None:
        self.settings: dict[str, dict[str, str]] = {}

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    async def abort(self, session: str) -> None:
        self.settings.pop(session, None)

    async def release(self, session: str) -> None:
        self.settings.pop(session, None)

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        settings = self.settings.setdefault(session, {"language": "", "prompt": ""})
        samples, item = 0, None
        async for fields in inputs:
            for name in ("language", "prompt"):
                value = fields.get(name)
                if isinstance(value, str):
                    settings[name] = value
            named = fields.get("item")
            if isinstance(named, str):
                item = named
            audio = fields.get("audio")
            if isinstance(audio, torch.Tensor):
                samples += audio.numel()
            mark = fields.get(TURN_FIELD)
            if mark == "commit" and samples:
                text = f"{samples} samples {settings['language']}".strip()
                if item is not None:
                    yield {"item": item, "transcript": text}
                yield {"text": text}
            if mark in ("commit", "clear"):
                samples, item = 0, None
            passed = {k: v for k, v in fields.items() if k not in TRANSCRIBER_INPUTS}
            if isinstance(mark, str):
                passed[TURN_FIELD] = mark
            if passed:
                yield passed
