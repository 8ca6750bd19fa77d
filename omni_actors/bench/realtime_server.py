"""The realtime server as ``bench realtime`` runs it: a process of its own.

``python -m omni_actors.bench.realtime_server --preset P --port 0 --ready-file F``
prepares the preset's weights if missing, serves it with :func:`run_server`, writes
``{"url", "ws_url", "pid"}`` to ``F`` once clients may connect, and drains and exits on
SIGTERM or SIGINT. The bench runs it in a process apart from its clients so that the
server's CPU time, read from ``/proc``, is the server's alone.

The server runs as ``omni-actors serve`` does (one torch thread, uvloop, the same
``run_server``). Every reply is fixed at ``--reply-tokens`` text tokens (as ``bench
pipeline`` does), so a reply's length, and with it its audio, does not follow the random
weights' stop token from one turn to the next.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
from pathlib import Path

from omni_actors import run
from omni_actors.bench.models import fixed_replies
from omni_actors.cli.prepare import prepared_spec
from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.server.runner import run_server
from omni_actors.server.settings import ServerSettings

__all__ = ["bench_pipeline", "main"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def bench_pipeline(
    preset: str | Path, *, cache_dir: Path | None, seed: int, reply_tokens: int
) -> PipelineSpec:
    """``preset`` as ``omni-actors serve`` serves it (its weights prepared in
    ``cache_dir`` with ``seed``, built if missing), every reply ``reply_tokens`` long."""
    return fixed_replies(prepared_spec(preset, cache_dir=cache_dir, seed=seed), reply_tokens)


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when the bench that started it dies, so a bench
    killed with SIGKILL does not leave a server running (elsewhere: a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _write_ready(path: Path, url: str, ws_url: str) -> None:
    """Write the ready file whole or not at all (the bench polls for it)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps({"url": url, "ws_url": ws_url, "pid": os.getpid()}))
    os.replace(partial, path)


async def _serve(ns: argparse.Namespace) -> None:
    spec = bench_pipeline(
        ns.preset, cache_dir=ns.cache_dir, seed=ns.seed, reply_tokens=ns.reply_tokens
    )
    settings = ServerSettings(
        preset=spec.name,
        host=ns.host,
        port=ns.port,
        max_sessions=ns.max_sessions,
        grace_s=ns.grace_s,
        api_key=ns.api_key,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with run_server(settings, pipeline=spec) as server:
        _write_ready(ns.ready_file, server.url, server.ws_url)
        log.info("bench server ready at %s", server.ws_url)
        await stop.wait()
        log.info("bench server draining")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m omni_actors.bench.realtime_server",
        description="Serve a preset for `omni-actors bench realtime` (not for production: "
        "use `omni-actors serve`).",
    )
    parser.add_argument("--preset", default="tiny-omni", help="preset name or YAML path")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument(
        "--ready-file", type=Path, required=True, help="where the URL is written once ready"
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="weights cache")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prepared weights")
    parser.add_argument("--reply-tokens", type=int, default=48, help="text tokens per reply")
    parser.add_argument("--max-sessions", type=int, default=64, help="sessions at once")
    parser.add_argument("--api-key", default=None, help="require this key, as serve does")
    parser.add_argument(
        "--grace-s", type=float, default=2.0, help="drain time for responses on SIGTERM"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the bench's server until SIGTERM/SIGINT; the exit code."""
    ns = _parser().parse_args(argv)
    _die_with_parent()
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    import torch

    torch.set_num_threads(1)  # as ``omni-actors serve`` runs (see cli/serve.py for why)
    run(_serve(ns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
