"""Option types the ``bench`` targets' command lines share."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_profile_option", "positive_float", "positive_int"]


def positive_int(text: str) -> int:
    """An ``argparse`` type: an int of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """An ``argparse`` type: a float above 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def add_profile_option(parser: argparse.ArgumentParser) -> None:
    """``--profile FILE``: profile what the target measures (see
    :mod:`omni_actors.bench.profiling`)."""
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="FILE",
        help="profile the measured part of the run in this process (cProfile; its "
        "figures are then not the run's own): statistics to FILE (python -m pstats "
        "FILE), the top functions in the report",
    )
