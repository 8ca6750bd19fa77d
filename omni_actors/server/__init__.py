"""The realtime server: ``omni-actors serve``, an ASGI app over :class:`OmniPipeline`.

One pipeline per server, one conversation :class:`~omni_actors.pipeline.session.Session`
per websocket connection. The OpenAI Realtime protocol's events are msgspec structs in
``omni_actors.protocols.realtime_client`` / ``realtime_server``; this package maps them
onto the session (append -> ``send``, commit -> ``commit``, ``response.create`` ->
``respond``, ``response.cancel`` -> ``Response.cancel``, truncate -> ``truncate``).
"""

from omni_actors.server.runner import RunningServer, run_server
from omni_actors.server.settings import ServerSettings

__all__ = ["RunningServer", "ServerSettings", "run_server"]
