"""``ClientSecrets``: the ephemeral keys a server handed out and that are alive.

Each key (``ek_…``) is bound to a session config and expires; the store drops expired
ones whenever one is issued or looked up, so they never pile up beyond those alive.
``client_secrets.py`` issues them; the realtime handshake takes them.
"""

from __future__ import annotations

import heapq
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from omni_actors.protocols.realtime_client import SessionConfig

__all__ = ["DEFAULT_SECONDS", "MAX_SECONDS", "MIN_SECONDS", "ClientSecret", "ClientSecrets"]

MIN_SECONDS = 10
MAX_SECONDS = 7200
DEFAULT_SECONDS = 600
"""OpenAI's bounds and default for ``expires_after.seconds``."""


@dataclass(frozen=True, slots=True)
class ClientSecret:
    """One ephemeral key: its value, when it expires (Unix seconds) and the session
    config a session it opens starts from."""

    value: str
    expires_at: float
    session: SessionConfig


@dataclass(eq=False)
class ClientSecrets:
    """The live ephemeral keys of one server.

    Attributes:
        clock: the time now, in Unix seconds (a test moves its own).
    """

    clock: Callable[[], float] = time.time
    _live: dict[str, ClientSecret] = field(default_factory=dict)
    # (expires_at, value), soonest first: what a sweep drops without scanning them all.
    _expiry: list[tuple[float, str]] = field(default_factory=list)

    def issue(self, session: SessionConfig, seconds: int = DEFAULT_SECONDS) -> ClientSecret:
        """A new key for ``session``, valid for ``seconds``."""
        self._sweep()
        secret = ClientSecret(
            value="ek_" + secrets.token_urlsafe(24),
            expires_at=self.clock() + seconds,
            session=session,
        )
        self._live[secret.value] = secret
        heapq.heappush(self._expiry, (secret.expires_at, secret.value))
        return secret

    def find(self, value: str) -> ClientSecret | None:
        """The live key ``value`` is, or None (unknown or expired)."""
        self._sweep()
        # A dict lookup by the offered value: its hash says nothing of a near miss.
        return self._live.get(value)

    def __len__(self) -> int:
        self._sweep()
        return len(self._live)

    def _sweep(self) -> None:
        now = self.clock()
        while self._expiry and self._expiry[0][0] <= now:
            _, value = heapq.heappop(self._expiry)
            self._live.pop(value, None)
