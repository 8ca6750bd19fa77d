"""Who may open a realtime session: the API key and the browser ``Origin`` checks.

Both run at the websocket handshake, before the connection is accepted, so a refused
client costs no session. Browsers cannot set an ``Authorization`` header on a
websocket, so they pass the key as a subprotocol, ``openai-insecure-api-key.KEY`` (the
name says what it is: the key travels in clear unless TLS is in front). A page should
carry an ephemeral key there, not the server's (``client_secrets.py``).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from omni_actors.server.settings import ServerSettings

__all__ = [
    "KEY_SUBPROTOCOL",
    "authorized",
    "key_matches",
    "offered_keys",
    "origin_allowed",
    "pick_subprotocol",
]

KEY_SUBPROTOCOL = "openai-insecure-api-key."


def authorized(
    settings: ServerSettings, headers: Mapping[str, str], subprotocols: Sequence[str]
) -> bool:
    """True if no key is configured, or the client presented it."""
    return key_matches(settings, offered_keys(headers, subprotocols))


def offered_keys(headers: Mapping[str, str], subprotocols: Sequence[str]) -> list[str]:
    """The keys a client presented: as key subprotocols, then as its bearer token."""
    offered = [p[len(KEY_SUBPROTOCOL) :] for p in subprotocols if p.startswith(KEY_SUBPROTOCOL)]
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        offered.append(auth[7:].strip())
    return offered


def key_matches(settings: ServerSettings, offered: Sequence[str]) -> bool:
    """True if no key is configured, or ``offered`` holds it."""
    if settings.api_key is None:
        return True
    expected = settings.api_key.encode()
    # Constant-time comparison: the key must not leak through response timing.
    return any(hmac.compare_digest(key.encode(), expected) for key in offered)


def origin_allowed(settings: ServerSettings, headers: Mapping[str, str]) -> bool:
    """True for non-browser clients (no ``Origin``), the server's own pages, and the
    configured ``allowed_origins``."""
    origin = headers.get("origin")
    if origin is None:
        return True
    if "*" in settings.allowed_origins or origin in settings.allowed_origins:
        return True
    return urlsplit(origin).netloc == headers.get("host", "")


def pick_subprotocol(subprotocols: Sequence[str]) -> str | None:
    """The subprotocol to accept: ``realtime`` when offered (a browser fails the
    connection if none of those it offered is chosen), else the first offered."""
    if "realtime" in subprotocols:
        return "realtime"
    return subprotocols[0] if subprotocols else None
