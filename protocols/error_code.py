"""``ErrorCode``: what kind of failure ended a session, for programs to act on.

Each ``OmniError`` class carries one (``code``); a stage sends it in its
``StageReport``, and the caller reads it in ``SessionError.code``. The vocabulary is
closed so that a program can match on it; the message says the rest.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["ErrorCode"]

ErrorCode = Literal[
    "timeout",
    "backpressure",
    "stage_failed",
    "engine_error",
    "chunk_gap",
    "admission",
    "prewarm",
    "invalid_request",
    "internal",
]
"""``timeout``: a deadline expired. ``backpressure``: a sender waited too long for its
receiver to take what it sent (most often a caller that stopped reading its events).
``stage_failed``: a stage crashed with the session on it. ``engine_error``: the engine
failed the session. ``chunk_gap``: chunks were lost between two stages. ``admission``:
not admitted (no slot in time, id in use). ``prewarm``: a stage refused or failed to
allocate the session. ``invalid_request``: the caller asked for something the session
cannot do (a response while one is in flight, a truncate with no reply to cut).
``internal``: anything else (a bug, or the pipeline stopping)."""
