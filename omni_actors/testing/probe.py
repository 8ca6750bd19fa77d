"""``TestProbe``: an actor a test can send to and then assert on what it received."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, TypeVar, overload

from omni_actors._actor import Actor
from omni_actors._ref import ActorRef
from omni_actors.signals import Terminated

if TYPE_CHECKING:
    from omni_actors._system import ActorSystem

__all__ = ["TestProbe"]

T = TypeVar("T")


class _ProbeActor(Actor[object]):
    def __init__(self, inbox: asyncio.Queue[object]) -> None:
        self._inbox = inbox

    async def receive(self, message: object) -> None:
        self._inbox.put_nowait(message)


class TestProbe:
    """Records every message sent to :attr:`ref`, in order, for ``expect_*`` assertions.

    Create one with ``await ActorTestKit.create_probe()``.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, ref: ActorRef[object], inbox: asyncio.Queue[object]) -> None:
        self.ref = ref
        self._inbox = inbox
        self._watched: set[ActorRef[Any]] = set()

    @classmethod
    async def start(cls, system: ActorSystem, name: str | None = None) -> TestProbe:
        """Spawn the probe's actor in ``system``."""
        inbox: asyncio.Queue[object] = asyncio.Queue()
        ref = await system.spawn(_ProbeActor, inbox, name=name)
        return cls(ref, inbox)

    async def _next(self, timeout: float, expecting: str) -> object:
        try:
            async with asyncio.timeout(timeout):
                return await self._inbox.get()
        except TimeoutError:
            raise AssertionError(
                f"probe {self.ref.path}: timed out after {timeout:g}s waiting for {expecting}"
            ) from None

    @overload
    async def expect_message(self, expected: type[T], timeout: float = ...) -> T: ...

    @overload
    async def expect_message(self, expected: T, timeout: float = ...) -> T: ...

    async def expect_message(self, expected: Any, timeout: float = 1.0) -> Any:
        """Assert the next message is an instance of (or equal to) ``expected``; return it."""
        message = await self._next(timeout, repr(expected))
        matches = (
            isinstance(message, expected) if isinstance(expected, type) else message == expected
        )
        if not matches:
            raise AssertionError(f"probe {self.ref.path}: expected {expected!r}, got {message!r}")
        return message

    async def expect_no_message(self, duration: float = 0.1) -> None:
        """Assert nothing arrives within ``duration`` seconds."""
        try:
            async with asyncio.timeout(duration):
                message = await self._inbox.get()
        except TimeoutError:
            return
        raise AssertionError(f"probe {self.ref.path}: expected no message, got {message!r}")

    async def receive_messages(self, count: int, timeout: float = 1.0) -> list[object]:
        """The next ``count`` messages, whatever they are."""
        return [await self._next(timeout, f"message {i + 1} of {count}") for i in range(count)]

    def watch(self, ref: ActorRef[Any]) -> None:
        """Deliver ``Terminated`` for ``ref`` to this probe."""
        self._watched.add(ref)
        self.ref._cell.context.watch(ref)

    async def expect_terminated(self, ref: ActorRef[Any], timeout: float = 1.0) -> Terminated:
        """Watch ``ref`` (if not yet) and assert the next message is its ``Terminated``."""
        if ref not in self._watched:  # watched before: its Terminated is (or will be) queued
            self.watch(ref)
        message = await self._next(timeout, f"Terminated({ref.path})")
        if not (isinstance(message, Terminated) and message.ref == ref):
            raise AssertionError(
                f"probe {self.ref.path}: expected Terminated({ref.path}), got {message!r}"
            )
        return message
