"""``omni-actors run``: one request through a pipeline, offline; its audio to a WAV file.

Prints the text as it streams, then TTFT, TTFA, RTF and end-to-end latency. Missing
weights are prepared first (with a progress bar) unless ``--no-prepare``. Expected
mistakes (no input, an unreadable WAV, an unknown preset, a device this machine lacks,
an engine that fails to start) are one line and a non-zero exit (the traceback too at
``--log-level debug``); the arguments are checked before torch is imported, so a usage
error comes at once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from omni_actors.cli import add_log_level, configure_logging, device_problem, report
from omni_actors.errors import OmniError

if TYPE_CHECKING:
    import torch

    from omni_actors.pipeline.spec.pipeline import PipelineSpec

__all__ = ["add_run_arguments", "run_command"]

INPUT_RATE = 16_000  # what the thinker's audio encoder takes


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``run``."""
    parser.add_argument(
        "--preset", default="tiny-omni", help="a preset name or a pipeline YAML (default tiny-omni)"
    )
    parser.add_argument(
        "--model",
        default=None,
        help="the release every model stage loads: a directory, a Hugging Face repo id or "
        "a prepared family (default: the preset's)",
    )
    parser.add_argument("--text", default=None, help="the request's text")
    parser.add_argument("--audio", type=Path, default=None, help="the request's audio (a WAV)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where to write the reply WAV (needed when the pipeline answers with audio)",
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="weights cache")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prepared weights")
    parser.add_argument(
        "--device",
        default=None,
        help="where the model stages compute: cpu, cuda, cuda:N or auto (default: the preset's)",
    )
    parser.add_argument(
        "--no-prepare",
        action="store_true",
        help="fail (with the command to run) instead of preparing missing weights",
    )
    add_log_level(parser, "warning")


def run_command(ns: argparse.Namespace) -> int:
    """Run one request; 0 on success, 1 if the session failed, 2 for bad input."""
    configure_logging(ns.log_level)
    try:
        if ns.text is None and ns.audio is None:
            raise _UsageError("give --text, --audio or both")
        if ns.audio is not None and not ns.audio.is_file():
            raise _UsageError(f"--audio {ns.audio}: no such file")
        from omni_actors.pipeline.spec.pipeline import load_pipeline  # torch, from here on

        spec = load_pipeline(ns.preset).without_transcriber()  # one reply: no transcript
        if spec.outputs.audio is not None and ns.out is None:
            raise _UsageError(
                f"pipeline {spec.name} answers with audio: give --out FILE.wav to write it"
            )
        problem = device_problem(ns.device)
        if problem is not None:
            raise _UsageError(problem)
        audio = _read_audio(ns.audio) if ns.audio is not None else None
        if ns.model is not None:
            spec = spec.with_model(ns.model)
        if ns.device is not None:
            spec = spec.on_device(ns.device)
        spec = _prepared(spec, ns)
    except (OmniError, _UsageError) as exc:
        report("run", exc, ns.log_level)
        return 2
    from omni_actors import run

    try:
        return run(_request(spec, ns.text, audio, ns.out))
    except OmniError as exc:  # the pipeline did not start: a model it cannot load, say
        report("run", exc, ns.log_level)
        return 2


class _UsageError(Exception):
    pass


def _read_audio(path: Path) -> torch.Tensor:
    from omni_actors.audio.wav import read_wav

    audio, _ = read_wav(path, rate=INPUT_RATE)
    return audio


def _prepared(spec: PipelineSpec, ns: argparse.Namespace) -> PipelineSpec:
    """Point model-family stages at the cache and seed; prepare their weights if missing."""
    from omni_actors.cli.prepare import NotPreparedError, prepared_spec

    try:
        return prepared_spec(spec, cache_dir=ns.cache_dir, seed=ns.seed, prepare=not ns.no_prepare)
    except NotPreparedError as exc:
        raise _UsageError(str(exc)) from None


async def _request(
    spec: PipelineSpec, text: str | None, audio: torch.Tensor | None, out: Path | None
) -> int:
    import torch

    from omni_actors.audio.wav import write_wav
    from omni_actors.pipeline.omni_pipeline import OmniPipeline
    from omni_actors.protocols.events import AudioDelta, Done, SessionError, TextDelta

    pieces: list[torch.Tensor] = []
    rate = spec.outputs.sample_rate
    workers = sum(stage.process for stage in spec.stages)
    placed = f", {workers} in worker processes" if workers else ""
    print(f"starting {spec.name} ({len(spec.stages)} stages{placed})...", file=sys.stderr)
    async with OmniPipeline(spec) as omni:
        async for event in omni.generate(text=text, audio=audio):
            match event:
                case TextDelta(text=delta):
                    print(delta, end="", flush=True)
                case AudioDelta(audio=samples, sample_rate=rate):
                    pieces.append(samples)
                case Done(metrics=m):
                    print()
                    if out is not None:
                        audio_out = torch.cat(pieces) if pieces else torch.zeros(0)
                        write_wav(out, audio_out, rate)
                        seconds = audio_out.numel() / rate
                        print(f"wrote {out} ({seconds:.2f}s of {rate} Hz audio)")
                    print(f"TTFT {_ms(m.ttft_ms)}  TTFA {_ms(m.ttfa_ms)}  ", end="")
                    rtf = "-" if m.rtf is None else f"{m.rtf:.3f}"
                    print(f"RTF {rtf}  end-to-end {m.e2e_ms:.0f} ms")
                    return 0
                case SessionError(code=code, message=message, stage=stage):
                    where = f" at {stage}" if stage else ""
                    print(
                        f"\nomni-actors run: the request failed{where} ({code}): {message}",
                        file=sys.stderr,
                    )
                    return 1
                case _:
                    print(f"\nomni-actors run: the request ended: {event}", file=sys.stderr)
                    return 1
    return 1


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"
