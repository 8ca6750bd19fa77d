"""One engine step of many sessions, routed to each receiving stage as one message.

An engine on a step loop (``StepLoop``) answers the work of ``B`` sessions in one step; each
session's task then wakes in the same turn of the event loop and hands its output to its
outlets. Sent one by one, that is ``B`` messages per receiving stage: ``B`` encodes,
mailbox entries and dispatches, and on a GPU ``B`` device-to-host copies. The
:class:`StepRouter` gathers instead what the outlets of a stage's sessions hand it
within one turn, per receiver, and sends it when the turn ends as one
:class:`~omni_actors.protocols.stage.StepChunks` (a lone chunk goes as itself). Nothing
else changes for a chunk: its outlet numbered it and spent its stream's credit before
handing it over, so sequence numbers (duplicates dropped, gaps refused) and back-pressure
per (session, edge) are what they were; only the transport of a turn's chunks is shared.

Packing. To a receiver in another process, the tensor fields the members have in common
(one dtype, one device, one shape but for dim 0) are concatenated along dim 0
(:func:`pack`): one buffer per field per step on the wire and, from a GPU stage, one
device-to-host copy per field per step. The receiver slices each member's rows back out
as views (:func:`unpack`): no copy. A view keeps the step's whole buffer alive, so a
session that holds its input rows holds the step's (at most ``B`` times its own). To a
stage in this process the chunks go as they are: nothing crosses a boundary.

From a GPU stage the packing runs on its copy stream once the steps that made the rows
are done (their marks), and the packed tensor carries a mark of its own
(``HostStaging.concat``): its copy waits for that, not for the next step the engine
queued meanwhile. Over a device link (an edge on the ``device`` path, the link accepted)
a step's device fields are packed (a field even one member carries) and put into the
link's slots with one ``put`` (``StepChunks.device``); the receiver copies them out
once for the step and slices each member's rows as views, and gives the slots back once,
whichever of its sessions are gone by then. A step whose fields do not fit the free
slots goes member by member: each chunk that fits as a ``Chunk`` in slots of its own,
the others together through the host, that step only (a wave of prompts sends their
talker rows, 10 MB each at full size, in one turn); a lone chunk goes as a ``Chunk``.

Order and waits. A receiver's messages leave in the order their chunks were handed
over, so every stream's chunks arrive in sequence. A message goes at once if the
receiver has room (``try_tell``); otherwise it and every later one for that receiver
wait in order, sent by a task of the stage's scope. That backlog is bounded by the
credits: each stream has at most its window of chunks in flight. An outlet never waits
here for mailbox room, only for its own stream's credit, so a slow session holds up its
own stream and nothing else.

Failures. A message that cannot be delivered (its receiver stopped, or its process
died) fails the outlets of its members: each raises the error at its next send, or at
its segment's end (:meth:`Route.settled`), as a failed ``tell`` did. The chunks of a
session aborted before its turn ended are not sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import msgspec
import torch

from omni_actors import remoting
from omni_actors._ref import ActorRef
from omni_actors._task_scope import TaskScope
from omni_actors.cuda import on_device
from omni_actors.errors import ProtocolError
from omni_actors.protocols.address import ActorAddress
from omni_actors.protocols.stage import Chunk, StepChunks

if TYPE_CHECKING:
    from omni_actors.actors.stage.device_links import Outgoing
    from omni_actors.cuda import StageTransfers

__all__ = ["Route", "Sender", "StepRouter", "pack", "unpack"]

log = logging.getLogger(__name__)

Routed = Chunk | StepChunks
"""What a route sends its receiver."""


class Sender(Protocol):
    """What a route needs of the outlet that handed it a chunk."""

    closed: bool
    """The outlet's session was aborted: its chunks not sent yet are moot."""

    copy_wait: float
    """Seconds its chunks waited for their device-to-host copies (the route adds its own)."""

    def fail(self, error: BaseException) -> None:
        """A message with one of its chunks could not be delivered."""


Member = tuple[Sender, Chunk]
"""A chunk a route was handed, and the outlet that handed it."""


def pack(
    chunks: Sequence[Chunk],
    *,
    least: int = 2,
    cat: Callable[[Sequence[torch.Tensor]], torch.Tensor] | None = None,
) -> StepChunks:
    """``chunks`` as one message, the tensor fields they share packed (module docstring).

    A field is packed when at least ``least`` members carry it, each with at least one
    dimension, all of one dtype and device and one shape but for dim 0; any other
    field stays in its member's ``tensors``. ``cat`` concatenates a field's rows
    (default ``torch.cat``; a GPU stage's ``StageTransfers.concat``); a field only one
    member carries is that member's tensor itself.
    """
    present: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for index, chunk in enumerate(chunks):
        for name, tensor in chunk.tensors.items():
            present.setdefault(name, []).append((index, tensor))
    packed: dict[str, torch.Tensor] = {}
    rows: dict[str, tuple[int, ...]] = {}
    for name, members in present.items():
        if len(members) < least or not _packable([tensor for _, tensor in members]):
            continue
        parts = [tensor for _, tensor in members]
        if len(parts) == 1:
            packed[name] = parts[0]
        else:
            packed[name] = cat(parts) if cat is not None else torch.cat(parts)
        counts = [-1] * len(chunks)
        for index, tensor in members:
            counts[index] = tensor.shape[0]
        rows[name] = tuple(counts)
    if not packed:
        return StepChunks(chunks=tuple(chunks))
    return StepChunks(chunks=tuple(_without(c, packed) for c in chunks), packed=packed, rows=rows)


def _packable(tensors: list[torch.Tensor]) -> bool:
    first = tensors[0]
    if first.dim() == 0:
        return False
    tail, dtype, device = first.shape[1:], first.dtype, first.device
    return all(
        t.dim() > 0 and t.shape[1:] == tail and t.dtype == dtype and t.device == device
        for t in tensors[1:]
    )


def _without(chunk: Chunk, packed: Mapping[str, torch.Tensor]) -> Chunk:
    tensors = chunk.tensors
    if tensors.keys().isdisjoint(packed):
        return chunk
    kept = {name: tensor for name, tensor in tensors.items() if name not in packed}
    return msgspec.structs.replace(chunk, tensors=kept)


def unpack(step: StepChunks) -> list[Chunk]:
    """The members of ``step``, each with its rows of every packed field (views of the
    packed tensors: no copy).

    Raises:
        ProtocolError: the packed fields and their row counts do not agree (a sender's
            bug, or a forged message), or the step still has a device part (the
            receiving stage copies it into ``packed`` first): nothing of the step can
            be trusted.
    """
    if step.device is not None:
        raise ProtocolError("step chunks with a device part must be taken off the device first")
    chunks = step.chunks
    if not step.packed and not step.rows:
        return list(chunks)
    if step.packed.keys() != step.rows.keys():
        raise ProtocolError(
            f"step chunks pack {sorted(step.packed)} but count rows of {sorted(step.rows)}"
        )
    extra: list[dict[str, torch.Tensor]] = [{} for _ in chunks]
    for name, counts in step.rows.items():
        tensor = step.packed[name]
        if len(counts) != len(chunks) or tensor.dim() == 0:
            raise ProtocolError(
                f"step chunks: field {name!r} counts {len(counts)} members' rows for "
                f"{len(chunks)} members, over a tensor of shape {tuple(tensor.shape)}"
            )
        if any(n < -1 for n in counts) or sum(n for n in counts if n > 0) != tensor.shape[0]:
            raise ProtocolError(
                f"step chunks: field {name!r} has {tensor.shape[0]} rows, its members "
                f"claim {list(counts)}"
            )
        offset = 0
        for index, n in enumerate(counts):
            if n >= 0:
                extra[index][name] = tensor[offset : offset + n]
                offset += n
    return [
        msgspec.structs.replace(chunk, tensors={**chunk.tensors, **more}) if more else chunk
        for chunk, more in zip(chunks, extra, strict=True)
    ]


class Route:
    """A stage's chunks to one receiver: this turn's, then those waiting for room.

    Made by :meth:`StepRouter.route`; outlets :meth:`add` their chunks to it.
    """

    __slots__ = (
        "_backlog",
        "_router",
        "_task",
        "_turn",
        "_waiters",
        "host",
        "link",
        "messages",
        "ref",
    )

    def __init__(
        self, router: StepRouter, ref: ActorAddress[Routed], link: Outgoing | None = None
    ) -> None:
        self._router = router
        self.ref = ref
        self.link = link
        """The device link to the receiver (an edge on the ``device`` path), if any."""
        # A receiver in another process gets packed steps, with host tensors only.
        self.host = not (isinstance(ref, ActorRef) and remoting.in_process(ref))
        self._turn: list[Member] = []
        # Messages waiting for room, in order; None: not built yet (host copies due).
        self._backlog: deque[tuple[list[Member], Routed | None]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self.messages = 0
        """Messages sent to the receiver so far (a step's chunks count once)."""

    def add(self, sender: Sender, chunk: Chunk) -> None:
        """Send ``chunk`` (numbered, its credit spent) with the rest of this turn's."""
        turn = self._turn
        if not turn:
            self._router._due(self)
        turn.append((sender, chunk))

    @property
    def transfers(self) -> StageTransfers | None:
        """The sending stage's transfers (None for a CPU stage)."""
        return self._router.transfers

    def settled(self) -> Awaitable[None] | None:
        """What to await until every chunk handed over so far was delivered to the
        receiver's mailbox (or failed its sender); None if that is so already."""
        if not self._turn and not self._backlog and self._task is None:
            return None
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def _flush(self) -> None:
        """The turn ended: its chunks go, as one message, unless earlier ones wait."""
        members = [(s, c) for s, c in self._turn if not s.closed]
        self._turn = []
        if members:
            if self._backlog or self._task is not None:
                self._backlog.append((members, None))
            elif self.host and self._router.transfers is not None and _on_device(members):
                self._backlog.append((members, None))  # to the host first, in the task
                self._start()
            else:
                self._try_send(members)
        self._maybe_settle()

    def _try_send(self, members: list[Member]) -> None:
        try:
            message = self._message(members)
            sent = self.ref.try_tell(message)
        except Exception as exc:  # the receiver is gone: its senders hear of it
            _fail(members, exc)
            return
        if sent:
            self.messages += 1
        else:
            self._backlog.append((members, message))
            self._start()

    def _message(self, members: list[Member]) -> Routed:
        if len(members) == 1:
            return members[0][1]
        chunks = [chunk for _, chunk in members]
        if not self.host:
            return StepChunks(chunks=tuple(chunks))
        transfers = self._router.transfers
        return pack(chunks, cat=transfers.concat if transfers is not None else None)

    def _placed(self, members: list[Member]) -> list[tuple[list[Member], Routed]]:
        """The messages of ``members``, each with the members it carries: one, with its
        device fields in the device link, if the route has one that is up and they fit
        a run of its free slots; else, if the link is up, each member that fits it in a
        message of its own and the rest together; else one as :meth:`_message` (then
        :meth:`_on_host` copies the device fields to the host)."""
        link = self.link
        transfers = self._router.transfers
        if link is None or link.link is None or link.closed or transfers is None:
            return [(members, self._message(members))]
        if len(members) == 1:
            return [(members, _put(link, members[0][1]))]
        # Every device field packed, even one only one member carries: what is left out
        # of the slots would cross through the host.
        step = pack([chunk for _, chunk in members], least=1, cat=transfers.concat)
        device, rest = link.put(step.packed)
        if device is not None:
            return [(members, msgspec.structs.replace(step, packed=rest, device=device))]
        # Too big for the free slots as one: a wave of prompts' talker rows (hundreds of
        # MB) would otherwise cross through the host at once, page-locked memory for it
        # allocated on the event loop. Each member that fits goes on its own.
        parts: list[tuple[list[Member], Routed]] = []
        left: list[Member] = []
        for member in members:
            message = _put(link, member[1])
            if message is member[1]:
                left.append(member)
            else:
                parts.append(([member], message))
        if left:
            parts.append((left, self._message(left)))
        return parts

    def _start(self) -> None:
        if self._task is None:
            self._task = self._router.tasks.create_task(
                self._send_backlog(), name=f"chunks to {self.ref.path}"
            )

    async def _send_backlog(self) -> None:
        try:
            while self._backlog:
                members, message = self._backlog.popleft()
                if message is not None:
                    await self._tell(members, message)
                    continue
                members = [(s, c) for s, c in members if not s.closed]
                if not members:
                    continue
                try:
                    parts = self._placed(members)
                except Exception as exc:  # the link failed: this step's senders hear of it
                    _fail(members, exc)
                    continue
                for part, placed in parts:
                    started = time.monotonic()
                    try:
                        message = await self._on_host(placed)
                    except Exception as exc:
                        _fail(part, exc)
                        continue
                    if message is not placed:  # copied: each member's chunk waited
                        waited = time.monotonic() - started
                        for outlet, _ in part:
                            outlet.copy_wait += waited
                    await self._tell(part, message)
        finally:
            self._task = None
            self._maybe_settle()

    async def _tell(self, members: list[Member], message: Routed) -> None:
        try:
            await self.ref.tell(message)
        except Exception as exc:  # the receiver is gone: its senders hear of it
            _fail(members, exc)
            return
        self.messages += 1

    async def _on_host(self, message: Routed) -> Routed:
        """``message`` with its device tensors copied to the host: the packed ones with
        one copy per field for the whole step."""
        transfers = self._router.transfers
        if transfers is None or not self.host:
            return message
        if isinstance(message, Chunk):
            if not on_device(message.tensors):
                return message
            host = await transfers.to_host(message.tensors)
            return msgspec.structs.replace(message, tensors=host)
        packed = message.packed
        if not on_device(packed) and not any(on_device(c.tensors) for c in message.chunks):
            return message
        if on_device(packed):
            packed = await transfers.to_host(packed)
        chunks = [
            msgspec.structs.replace(c, tensors=await transfers.to_host(c.tensors))
            if on_device(c.tensors)
            else c
            for c in message.chunks
        ]
        return msgspec.structs.replace(message, chunks=tuple(chunks), packed=packed)

    def _maybe_settle(self) -> None:
        if self._waiters and not self._turn and not self._backlog and self._task is None:
            self._settle()

    def _settle(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def close(self) -> None:
        """The stage stops: nothing more is sent, and nobody waits for it."""
        self._turn = []
        self._backlog.clear()
        self._settle()


def _on_device(members: list[Member]) -> bool:
    return any(on_device(chunk.tensors) for _, chunk in members)


def _put(link: Outgoing, chunk: Chunk) -> Chunk:
    """``chunk`` with its device fields in the link's slots, or itself if they do not fit."""
    device, rest = link.put(chunk.tensors)
    if device is None:
        return chunk
    return msgspec.structs.replace(chunk, tensors=rest, device=device)


def _fail(members: list[Member], error: BaseException) -> None:
    for sender, _ in members:
        sender.fail(error)


class StepRouter:
    """A stage's routes, one per receiver: see the module docstring.

    Args:
        tasks: the stage's task scope (a receiver's backlog is sent by a task of it).
        transfers: a GPU stage's transfers (device tensors to another process are
            copied to the host per message); None on a CPU.
    """

    def __init__(self, tasks: TaskScope, transfers: StageTransfers | None = None) -> None:
        self.tasks = tasks
        self.transfers = transfers
        self._routes: dict[ActorAddress[Routed], Route] = {}
        self._due_routes: list[Route] = []
        self._handle: asyncio.Handle | None = None

    def route(self, ref: ActorAddress[Routed], link: Outgoing | None = None) -> Route:
        """The route to ``ref``, shared by every session sending there; ``link``: the
        stage's device link to ``ref`` (the newest, when a lost one was replaced)."""
        route = self._routes.get(ref)
        if route is None:
            route = self._routes[ref] = Route(self, ref, link)
        elif link is not None:
            route.link = link
        return route

    def _due(self, route: Route) -> None:
        """``route`` got its first chunk of this turn: flush it when the turn ends."""
        self._due_routes.append(route)
        if self._handle is None:
            # After the callbacks ready in this turn: the sessions a step woke all ran.
            self._handle = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._handle = None
        routes, self._due_routes = self._due_routes, []
        for route in routes:
            try:
                route._flush()
            except Exception:  # a bug here must not strand the other routes' chunks
                log.exception("chunks to %s could not be routed", route.ref.path)

    def close(self) -> None:
        """The stage stops: drop what was not sent (its sessions are gone)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._due_routes = []
        for route in self._routes.values():
            route.close()
        self._routes.clear()
