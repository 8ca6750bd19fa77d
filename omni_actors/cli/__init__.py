"""The ``omni-actors`` command line.

Each subcommand registers itself in :data:`COMMANDS`; each bench target in
:data:`BENCH_TARGETS`. The CLI is the only place that prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from omni_actors._system import run

__all__ = ["main"]


def _bench_actors(ns: argparse.Namespace) -> dict[str, Any]:
    from omni_actors.bench.actors import run_actor_bench

    return run(run_actor_bench(ns.messages, ns.asks, ns.repeat))


def _add_actor_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=200_000, help="tells per run")
    parser.add_argument("--asks", type=int, default=20_000, help="sequential asks")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the median is reported")


def _bench_transport(ns: argparse.Namespace) -> dict[str, Any]:
    from omni_actors.bench.transport import run_transport_bench

    return run(run_transport_bench(ns.sizes, ns.scale, ns.iterations))


def _add_transport_options(parser: argparse.ArgumentParser) -> None:
    from omni_actors.bench.transport import SIZES

    parser.add_argument(
        "--sizes", nargs="+", choices=list(SIZES), default=list(SIZES), help="payload sizes"
    )
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply the iteration counts by this"
    )
    parser.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="measured round trips per size (default: 400 up to 64KiB, 100 at 1MiB, 30 above)",
    )


BENCH_TARGETS: dict[
    str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[..., dict[str, Any]]]
] = {
    "actors": ("tell/ask cost of the actor kernel", _add_actor_options, _bench_actors),
    "transport": (
        "payload ping-pong between processes vs a pickle+shm baseline, raw ZeroMQ, memcpy",
        _add_transport_options,
        _bench_transport,
    ),
}


def _print_table(result: dict[str, Any], indent: str = "") -> None:
    for key, value in result.items():
        if isinstance(value, dict):
            print(f"{indent}{key}:")
            _print_table(value, indent + "  ")
        else:
            print(f"{indent}{key:<28} {value}")


def _bench(ns: argparse.Namespace) -> int:
    _, _, runner = BENCH_TARGETS[ns.target]
    result = runner(ns)
    if ns.json:
        print(json.dumps(result))
    else:
        _print_table(result)
    return 0


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omni-actors", description="Serve multi-stage omni speech models as actors."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser("bench", help="run a benchmark and print its numbers")
    targets = bench.add_subparsers(dest="target", required=True)
    for name, (help_text, add_options, _) in BENCH_TARGETS.items():
        target = targets.add_parser(name, help=help_text)
        target.add_argument("--json", action="store_true", help="print one JSON object")
        add_options(target)
    bench.set_defaults(handler=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``omni-actors``; returns the process exit code."""
    ns = _build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = ns.handler
    try:
        return handler(ns)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
