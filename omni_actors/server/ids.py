"""Ids of the Realtime API's objects: ``sess_…``, ``item_…``, ``resp_…``, ``event_…``."""

from __future__ import annotations

import uuid

__all__ = ["new_id"]


def new_id(prefix: str) -> str:
    """A new, unique id with ``prefix`` (``event``, ``item``, ``resp``, ``sess``, ``conv``)."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"
