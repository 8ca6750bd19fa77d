"""The realtime server: ``omni-actors serve``, an ASGI app over :class:`OmniPipeline`.

One pipeline per server, one conversation :class:`~omni_actors.pipeline.session.Session`
per websocket connection. The OpenAI Realtime protocol's events are msgspec structs in
``omni_actors.protocols.realtime_client`` / ``realtime_server``; this package maps them
onto the session (append -> ``send``, commit -> ``commit``, ``response.create`` ->
``respond``, ``response.cancel`` -> ``Response.cancel``, truncate -> ``truncate``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from omni_actors.server.settings import ServerSettings

if TYPE_CHECKING:
    from omni_actors.server.runner import RunningServer, run_server

__all__ = ["RunningServer", "ServerSettings", "run_server"]

# The runner loads torch and the app: ``omni-actors serve`` reads its settings (and
# checks its arguments) first.
_LAZY = ("RunningServer", "run_server")


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'omni_actors.server' has no attribute {name!r}")
    return getattr(importlib.import_module("omni_actors.server.runner"), name)
