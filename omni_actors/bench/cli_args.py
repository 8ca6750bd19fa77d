"""Option types the ``bench`` targets' command lines share."""

from __future__ import annotations

import argparse

__all__ = ["positive_float", "positive_int"]


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
