"""``freeze_heap``: keep the cyclic garbage collector off what a server loaded at start.

A serving process holds a large heap that never becomes garbage: torch, pydantic,
the pipeline, the weights' Python objects (about 200,000 objects in a front end). The
collector's full collections walk all of it: on the 2-core CI machine each took ~70 ms,
several times a second at 64 concurrent sessions — ~9% of the process's CPU, and each a
pause that every session in flight waits through. :func:`gc.freeze` moves what is alive
now to a generation the collector never walks, so a full collection walks only what was
made since (the sessions' own objects).

The package's own processes call it once they are ready: each stage worker after its
actor started, the server after its pipeline started. A program that embeds
:class:`~omni_actors.OmniPipeline` decides for itself (it freezes the caller's heap as
well): call it after start-up, outside a hot path.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_heap"]


def freeze_heap() -> int:
    """Collect what is garbage now, then exempt every object still alive from later
    collections (:func:`gc.freeze`). Objects frozen are never collected, so it belongs
    at the end of start-up, when what is alive is what the process keeps.

    Returns:
        How many objects are now frozen (:func:`gc.get_freeze_count`).
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
