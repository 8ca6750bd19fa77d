"""The ``omni-actors`` command line.

Each subcommand is one entry in :data:`COMMANDS` (how to parse its arguments, what to
run); each ``bench`` target one entry in :data:`BENCH_TARGETS` (``cli/bench.py``).
Adding a subcommand or a target means adding an entry, nothing else. The CLI is the
only place that prints.

An engine named by its import path (``my_engines:MyEngine`` in a pipeline YAML) is found
in the current directory, as ``python -m`` finds modules there: the command adds it to
the import path, which its worker processes inherit.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from omni_actors.cli.bench import BENCH_TARGETS, BenchTarget, add_bench_arguments, bench_command

__all__ = [
    "BENCH_TARGETS",
    "COMMANDS",
    "BenchTarget",
    "Command",
    "add_log_level",
    "configure_logging",
    "device_problem",
    "main",
    "report",
]


@dataclass(frozen=True, slots=True)
class Command:
    """A subcommand: its help line, its arguments, and the handler returning the exit code."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], int]


def _add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    from omni_actors.cli.prepare import add_prepare_arguments

    add_prepare_arguments(parser)


def _prepare(ns: argparse.Namespace) -> int:
    from omni_actors.cli.prepare import prepare_command

    return prepare_command(ns)


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    from omni_actors.cli.offline import add_run_arguments

    add_run_arguments(parser)


def _run(ns: argparse.Namespace) -> int:
    from omni_actors.cli.offline import run_command

    return run_command(ns)


def _add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    from omni_actors.cli.serve import add_serve_arguments

    add_serve_arguments(parser)


def _serve(ns: argparse.Namespace) -> int:
    from omni_actors.cli.serve import serve_command

    return serve_command(ns)


COMMANDS: dict[str, Command] = {
    "bench": Command("run a benchmark and print its numbers", add_bench_arguments, bench_command),
    "prepare": Command(
        "build a model family's weights (seeded, no download) into the cache",
        _add_prepare_arguments,
        _prepare,
    ),
    "serve": Command(
        "the realtime server (OpenAI Realtime websocket, chat completions, demo page)",
        _add_serve_arguments,
        _serve,
    ),
    "run": Command(
        "run one request offline: stream the text, write the audio to a WAV",
        _add_run_arguments,
        _run,
    ),
}


def _build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser; only the named subcommand's arguments are added (some need torch
    to describe themselves, and a usage error should not wait for it)."""
    chosen = argv[0] if argv else None
    parser = argparse.ArgumentParser(
        prog="omni-actors", description="Serve multi-stage omni speech models as actors."
    )
    parser.add_argument(
        "--version", action="version", version=f"omni-actors {_version()}", help="print the version"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        sub = commands.add_parser(name, help=command.help, description=command.help)
        if name == chosen:
            command.add_arguments(sub)
        sub.set_defaults(handler=command.handler)
    return parser


def _version() -> str:
    """The installed distribution's version (what ``pip`` shows)."""
    try:
        return importlib.metadata.version("omni-actors")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``omni-actors``; returns the process exit code.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).
    """
    args = sys.argv[1:] if argv is None else argv
    ns = _build_parser(args).parse_args(args)
    _import_from_here()
    handler: Callable[[argparse.Namespace], int] = ns.handler
    try:
        return handler(ns)
    except KeyboardInterrupt:
        return 130


def add_log_level(parser: argparse.ArgumentParser, default: str) -> None:
    """``--log-level``: what the command logs, and whether a mistake shows its traceback."""
    parser.add_argument(
        "--log-level",
        default=default,
        choices=["debug", "info", "warning", "error"],
        help=f"what to log ({default}); debug also prints the traceback of an error",
    )


def configure_logging(level: str) -> None:
    """Log at ``level`` to stderr, as every command does."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def report(command: str, error: BaseException, log_level: str) -> None:
    """An expected mistake (a usage error, an ``OmniError``): one line on stderr, which
    says what to do; its traceback before it only at ``--log-level debug``."""
    if log_level == "debug":
        traceback.print_exception(error, file=sys.stderr)
    print(f"omni-actors {command}: {error}", file=sys.stderr)


def device_problem(device: str | None) -> str | None:
    """Why ``--device`` cannot be used on this machine (a CUDA device without CUDA),
    found before any stage starts; None when it can."""
    if device is None or not device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return (
            f"--device {device}: this machine has no CUDA device that torch can use "
            "(torch.cuda.is_available() is False); use --device cpu"
        )
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        return f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)"
    return None


def _import_from_here() -> None:
    """Put the current directory on the import path (see the module docstring).

    After what is there already: a file in it never shadows an installed module. Worker
    processes get the parent's import path (``transport.worker_hosts``), so a stage with
    ``process: true`` imports the engine from here too.
    """
    here = os.getcwd()
    if here not in sys.path:
        sys.path.append(here)
