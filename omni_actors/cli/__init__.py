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
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from omni_actors.cli.bench import BENCH_TARGETS, BenchTarget, add_bench_arguments, bench_command

__all__ = ["BENCH_TARGETS", "COMMANDS", "BenchTarget", "Command", "main"]


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


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omni-actors", description="Serve multi-stage omni speech models as actors."
    )
    parser.add_argument(
        "--version", action="version", version=f"omni-actors {_version()}", help="print the version"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        sub = commands.add_parser(name, help=command.help, description=command.help)
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
    ns = _build_parser().parse_args(argv)
    _import_from_here()
    handler: Callable[[argparse.Namespace], int] = ns.handler
    try:
        return handler(ns)
    except KeyboardInterrupt:
        return 130


def _import_from_here() -> None:
    """Put the current directory on the import path (see the module docstring).

    After what is there already: a file in it never shadows an installed module. Worker
    processes get the parent's import path (``transport.worker_hosts``), so a stage with
    ``process: true`` imports the engine from here too.
    """
    here = os.getcwd()
    if here not in sys.path:
        sys.path.append(here)
