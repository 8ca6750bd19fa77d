"""``omni-actors serve``: the realtime server on a pipeline, until SIGINT or SIGTERM.

Missing weights are prepared first (with a progress bar). The first SIGINT/SIGTERM
drains: new sessions are refused, responses in flight get ``--grace-s`` to finish, then
open sessions get a final event and a close frame and the workers stop; a second
signal stops at once.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from omni_actors.cli import add_log_level, configure_logging, device_problem, report
from omni_actors.errors import OmniError
from omni_actors.server.settings import ServerSettings

if TYPE_CHECKING:
    from omni_actors.pipeline.spec.pipeline import PipelineSpec
    from omni_actors.server.runner import RunningServer

__all__ = ["add_serve_arguments", "serve_command"]

_DEFAULTS = ServerSettings()


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``serve``."""
    add = parser.add_argument
    add(
        "model_arg",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="the release to serve: a Hugging Face repo id or a release directory; its "
        "preset is picked by the GPUs seen (two or more: qwen3-omni, one: qwen3-omni-1gpu, "
        "none: tiny-omni for a release small enough for a CPU), unless --preset names one",
    )
    add(
        "--preset",
        default=None,
        help="a preset name or a pipeline YAML (default: picked for MODEL, else tiny-omni)",
    )
    add("--host", default=_DEFAULTS.host, help="interface to listen on (127.0.0.1)")
    add("--port", type=int, default=_DEFAULTS.port, help="TCP port (8000; 0 picks a free one)")
    add("--api-key", default=None, help="require this key (Bearer header or subprotocol)")
    add(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin allowed besides the server's own (repeatable; * for any)",
    )
    add(
        "--voice-map",
        action="append",
        default=[],
        metavar="NAME=SPEAKER|FILE",
        help="a voice name clients may send and the model speaker it means (alloy=ethan), "
        "or a YAML/JSON file of such names (repeatable; every OpenAI voice name is mapped "
        "by default)",
    )
    add(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model name the API serves (default: the pipeline's name); a request "
        "naming another model is refused with a 404",
    )
    add("--max-sessions", type=int, default=_DEFAULTS.max_sessions, help="sessions at once")
    add(
        "--idle-timeout-s",
        type=float,
        default=_DEFAULTS.idle_timeout_s,
        help="close a session with no client event for this long",
    )
    add(
        "--max-input-buffer-s",
        type=float,
        default=_DEFAULTS.max_input_buffer_s,
        help="seconds of audio a session may hold uncommitted",
    )
    add(
        "--grace-s",
        type=float,
        default=_DEFAULTS.grace_s,
        help="on SIGINT/SIGTERM, how long responses in flight may take to finish",
    )
    add(
        "--cluster",
        default=None,
        metavar="ADDRESS",
        help="run the pipeline's placed stages on this Ray cluster (auto, ray://host:port)",
    )
    add(
        "--model",
        default=None,
        help="the release every model stage loads: a directory, a Hugging Face repo id or a "
        "prepared family (default: the preset's)",
    )
    add(
        "--device",
        default=None,
        help="where the model stages compute: cpu, cuda, cuda:N or auto (default: the preset's)",
    )
    add("--cache-dir", type=Path, default=None, help="weights cache")
    add("--seed", type=int, default=0, help="seed of the prepared weights")
    add(
        "--ssl-certfile",
        default=None,
        metavar="PEM",
        help="serve https and wss with this certificate (with --ssl-keyfile): a browser "
        "on another machine gives the demo page its microphone only over https",
    )
    add("--ssl-keyfile", default=None, metavar="PEM", help="the certificate's private key")
    add("--ready-file", default=None, help="write the server's URL here once it listens")
    add_log_level(parser, "info")


def serve_command(ns: argparse.Namespace) -> int:
    """Serve until a signal; 0 after a clean shutdown, 2 for bad arguments."""
    configure_logging(ns.log_level)
    try:
        preset, model = _preset_and_model(ns)
        settings = ServerSettings(
            preset=preset,
            host=ns.host,
            port=ns.port,
            api_key=ns.api_key,
            allowed_origins=tuple(ns.allowed_origin),
            max_sessions=ns.max_sessions,
            idle_timeout_s=ns.idle_timeout_s,
            max_input_buffer_s=ns.max_input_buffer_s,
            grace_s=ns.grace_s,
            ssl_certfile=ns.ssl_certfile,
            ssl_keyfile=ns.ssl_keyfile,
            model=ns.served_model_name or "",
        )
        problem = device_problem(ns.device)
        if problem is not None:
            raise ValueError(problem)
        from omni_actors.cli.prepare import prepared_spec  # torch, from here on
        from omni_actors.pipeline.spec.pipeline import load_pipeline
        from omni_actors.server.voices import parse_voice_map

        settings = dataclasses.replace(settings, voice_map=parse_voice_map(ns.voice_map))
        spec = load_pipeline(preset)
        if model is not None:
            spec = spec.with_model(model)
        if ns.device is not None:
            spec = spec.on_device(ns.device)
        spec = prepared_spec(spec, cache_dir=ns.cache_dir, seed=ns.seed)
        if ns.cluster is not None:
            spec = spec.on_cluster(ns.cluster)
    except (OmniError, ValueError) as exc:
        report("serve", exc, ns.log_level)
        return 2
    import torch

    # The server's own tensor work (decoding, resampling, encoding audio) is many small
    # ops per frame per session: torch's intra-op pool only adds contention to them,
    # and the engines in this process want one thread each too (torch_engine.py).
    torch.set_num_threads(1)
    from omni_actors import run

    try:
        return run(_serve(settings, spec, ns.ready_file))
    except OmniError as exc:  # the pipeline did not start: a model it cannot load, say
        report("serve", exc, ns.log_level)
        return 2


def _preset_and_model(ns: argparse.Namespace) -> tuple[str, str | None]:
    """The preset to serve and the release its stages load. With ``MODEL`` and no
    ``--preset``, the preset is picked by the GPUs seen and one line says which and why.

    Raises:
        ValueError: ``MODEL`` and ``--model`` both; or no preset fits (no GPU for a
            full-size release).
    """
    model: str | None = ns.model
    if ns.model_arg is not None:
        if model is not None:
            raise ValueError(f"MODEL {ns.model_arg!r} and --model {model!r}: give the release once")
        model = ns.model_arg
    if ns.preset is not None:
        return ns.preset, model
    if model is None:
        return "tiny-omni", None
    from omni_actors.cli.serve_model import choose_preset, count_gpus

    choice = choose_preset(model, count_gpus())
    print(f"omni-actors serve: {model} on preset {choice.preset}: {choice.reason}", flush=True)
    return choice.preset, model


async def _serve(settings: ServerSettings, spec: PipelineSpec, ready_file: str | None) -> int:
    from omni_actors.models.heap import freeze_heap
    from omni_actors.server.runner import run_server

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = 0
    main = asyncio.current_task()
    assert main is not None

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            print("omni-actors serve: draining (signal again to stop now)", file=sys.stderr)
            stop.set()
        else:
            main.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        async with run_server(settings, pipeline=spec) as server:
            freeze_heap()  # started: full collections need not walk what it loaded
            _announce(spec.name, server)
            if ready_file is not None:
                _write(ready_file, server.url)
            await stop.wait()
    except OSError as exc:
        print(f"omni-actors serve: cannot listen on {settings.host}:{settings.port}: {exc}")
        return 2
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    print("omni-actors serve: stopped", file=sys.stderr)
    return 0


def _announce(name: str, server: RunningServer) -> None:
    """Where to point a browser and a client; on every interface (``--host 0.0.0.0``),
    this machine's own address and its name on the network besides."""
    print(f"omni-actors serving {name}: open {server.url}/ (demo page)", flush=True)
    if server.network_url is not None:
        print(f"  from other machines: {server.network_url}/", flush=True)
        if not server.url.startswith("https:"):
            print(
                "  (a browser there gives the demo page its microphone only over https: "
                "serve with --ssl-certfile/--ssl-keyfile, or use an SSH tunnel)",
                flush=True,
            )
    print(f"  realtime websocket: {server.ws_url}", flush=True)
    print(f"  chat completions:   {server.url}/v1/chat/completions", flush=True)


def _write(path: str, text: str) -> None:
    """Write in one step (a temporary file, then a rename): a reader never sees half."""
    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    partial.write_text(text)
    partial.replace(target)
