"""Rows of a benchmark report that fail one at a time.

A report measures several things in turn (paths, sizes, models), some in worker
processes that can die under them. One that fails must not take the others with it: its
row becomes ``{"error": "<type>: <message>"}``, the run goes on to the next row, and the
report lists what failed (:func:`failed_rows`) beside everything that did not.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping
from typing import Any

__all__ = ["failed_rows", "row", "row_error"]

log = logging.getLogger(__name__)


def row_error(name: str, exc: BaseException) -> dict[str, str]:
    """The row ``name`` failed with ``exc``: logged with its traceback, reported by type
    and message."""
    log.warning("%s failed: %s: %s", name, type(exc).__name__, exc, exc_info=exc)
    return {"error": f"{type(exc).__name__}: {exc}"}


async def row(name: str, work: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """``work``'s row, or its error (see :func:`row_error`) if it raises.

    Cancellation is not a failure of the row: it propagates.
    """
    try:
        return await work
    except Exception as exc:
        return row_error(name, exc)


def failed_rows(report: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted path of every row of ``report`` that holds an ``error``."""
    failed: list[str] = []
    for key, value in report.items():
        if not isinstance(value, Mapping):
            continue
        path = f"{prefix}{key}"
        if "error" in value:
            failed.append(path)
        else:
            failed += failed_rows(value, f"{path}.")
    return failed
