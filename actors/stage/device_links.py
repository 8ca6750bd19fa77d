"""``DeviceLinks``: a GPU stage's device links, both as a sender and as a receiver.

As a sender it keeps one :class:`~omni_actors.cuda.ipc.DeviceLink` per receiving stage
whose edge takes the ``device`` path, created when a session first sends there: the
offer goes out in a task, and until the receiver accepts it that edge's chunks take the
host path. A refused offer is logged with its reason, and the edge stays on the host. A
receiver that no longer knows the link (it restarted) says so (``DeviceLinkLost``): the
link is closed, and the next session offers a new one.

As a receiver it maps the links offered to it, copies a chunk's slices out as the chunk
arrives (a step's once for all its sessions: ``StepChunks.device``), and gives the slots
back once that copy has completed on the device.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import torch

from omni_actors._task_scope import TaskScope
from omni_actors.cuda import EventWaiter
from omni_actors.cuda.driver import IpcUnavailableError
from omni_actors.cuda.ipc import DeviceLink, DeviceLinkImport, covered_slots, map_offer
from omni_actors.errors import OmniError
from omni_actors.protocols.address import ActorAddress
from omni_actors.protocols.control import LinkCounts
from omni_actors.protocols.device import (
    DeviceChunk,
    DeviceLinkAnswer,
    DeviceLinkLost,
    DeviceLinkOffer,
    SlotsFree,
)
from omni_actors.protocols.stage import Chunk

__all__ = ["DeviceLinkLostError", "DeviceLinks", "Outgoing"]

log = logging.getLogger(__name__)

_OFFER_S = 30.0  # the receiver maps the pool: milliseconds, unless it is still starting


class DeviceLinkLostError(OmniError):
    """A chunk named a device link this stage has not mapped; the session fails."""

    code = "stage_failed"


@dataclass(eq=False)
class Outgoing:
    """The sender's link to one receiver; ``link`` is set once the receiver accepted."""

    receiver: str
    sender: ActorAddress[SlotsFree | DeviceLinkLost]
    link: DeviceLink | None = None
    closed: bool = False
    pending: DeviceLink | None = field(default=None, repr=False)
    unlinked: int = 0
    """Messages put while the link was not up: they took the host path."""

    def put(self, fields: Mapping[str, Any]) -> tuple[DeviceChunk | None, dict[str, Any]]:
        """The device tensors of ``fields`` in one slot of the link (``DeviceLink.put``),
        and the fields left; None placed while the link is not up (not accepted yet, or
        lost) or when they do not fit a free slot: then every field is left, for the
        host path."""
        link = self.link
        if link is None or self.closed:
            self.unlinked += 1
            return None, dict(fields)
        slices, rest = link.put(fields)
        if not slices:
            return None, rest
        return DeviceChunk(link.id, self.sender, slices), rest


class DeviceLinks:
    """See the module docstring.

    Args:
        stage: this stage's name (in logs and offers).
        device: its GPU.
        me: its own ref (where slots come back).
        tasks: its task scope (offers and slot returns run there).
        waiter: completes the copies' events.
        slots: slots per outgoing link.
        slot_bytes: their size.
    """

    def __init__(
        self,
        stage: str,
        device: torch.device,
        me: ActorAddress[SlotsFree | DeviceLinkLost],
        tasks: TaskScope,
        waiter: EventWaiter,
        *,
        slots: int,
        slot_bytes: int,
    ) -> None:
        self.stage = stage
        self.device = device
        self.me = me
        self.tasks = tasks
        self.waiter = waiter
        self.slots = slots
        self.slot_bytes = slot_bytes
        self._out: dict[str, Outgoing] = {}  # by the receiver's path
        self._by_id: dict[int, DeviceLink] = {}
        self._gone = _NONE_SENT  # what links and edges closed since sent
        self._in: dict[int, DeviceLinkImport] = {}

    # -- sending ----------------------------------------------------------------------

    def outgoing(self, receiver: str, ref: ActorAddress[Any]) -> Outgoing:
        """The link to ``ref`` (named ``receiver`` in logs), offered now if it is new."""
        out = self._out.get(ref.path)
        if out is None or out.closed:
            out = self._out[ref.path] = Outgoing(receiver, self.me)
            self.tasks.create_task(self._offer(out, ref), name=f"{self.stage} device link offer")
        return out

    async def _offer(self, out: Outgoing, ref: ActorAddress[Any]) -> None:
        try:
            link = DeviceLink(self.device, slots=self.slots, slot_bytes=self.slot_bytes)
        except (IpcUnavailableError, RuntimeError) as exc:
            log.warning(
                "%s -> %s: no device link (%s); the host path serves", self.stage, out.receiver, exc
            )
            return
        out.pending = link
        try:
            reply = await ref.ask(link.offer(self.stage, self.me), timeout=_OFFER_S)
            # A receiver known only by a decoded ref answers untyped (its fields).
            answer = msgspec.convert(reply, DeviceLinkAnswer)
        except Exception as exc:  # the receiver is gone or slow: host path until the next offer
            answer = DeviceLinkAnswer(accepted=False, reason=f"{type(exc).__name__}: {exc}")
        out.pending = None
        if out.closed or not answer.accepted:
            if not out.closed:
                log.warning(
                    "%s -> %s: device link refused (%s); the host path serves",
                    self.stage,
                    out.receiver,
                    answer.reason,
                )
            link.close()
            return
        self._by_id[link.id] = link
        out.link = link
        log.info(
            "%s -> %s: device link %d (%s, %d slots of %d bytes)",
            self.stage,
            out.receiver,
            link.id,
            "peer copy to another GPU" if answer.peer else "same GPU",
            link.slots,
            link.slot_bytes,
        )

    def counts(self) -> LinkCounts | None:
        """What the links have sent since the stage started (closed ones included);
        None if it never sent on an edge with a device link."""
        if not self._out and not self._by_id and self._gone == _NONE_SENT:
            return None
        return _sum(
            self._gone,
            *(_counts(link) for link in self._by_id.values()),
            *(_unlinked(out) for out in self._out.values()),
        )

    def slots_free(self, message: SlotsFree) -> None:
        """The receiver gave slots back."""
        link = self._by_id.get(message.link)
        if link is not None:
            link.release(message.slots)

    def lost(self, message: DeviceLinkLost) -> None:
        """The receiver does not know ``message.link``: close it; the next session offers
        a new one."""
        link = self._by_id.pop(message.link, None)
        if link is None:
            return
        self._gone = _sum(self._gone, _counts(link))
        for path, out in list(self._out.items()):
            if out.link is link:
                out.closed = True
                del self._out[path]
                self._gone = _sum(self._gone, _unlinked(out))
                log.warning(
                    "%s -> %s: device link lost (%s)", self.stage, out.receiver, message.reason
                )
        link.close()

    # -- receiving --------------------------------------------------------------------

    def accept(self, offer: DeviceLinkOffer) -> DeviceLinkAnswer:
        """Map the offered link (a newer one from the same sender replaces the older)."""
        imported, answer = map_offer(offer, self.device)
        if imported is None:
            return answer
        for link, old in list(self._in.items()):
            if old.offer.sender.path == offer.sender.path:
                del self._in[link]
                old.close()
        self._in[offer.link] = imported
        return answer

    def take(self, chunk: Chunk, device: DeviceChunk) -> Chunk:
        """``chunk`` with its device slices copied out into its tensors (see
        :meth:`take_fields`).

        Raises:
            DeviceLinkLostError: as :meth:`take_fields`.
        """
        tensors = self.take_fields(device)
        return msgspec.structs.replace(chunk, tensors={**chunk.tensors, **tensors}, device=None)

    def take_fields(self, device: DeviceChunk) -> dict[str, torch.Tensor]:
        """The tensors of ``device``'s slices, copied out into this stage's own (the
        current stream waits for the copies on the device); the slots go back once the
        copy is done. A step's packed fields are copied out once for all its sessions.

        Raises:
            DeviceLinkLostError: the link is not mapped here, or a slice is malformed
                (the sender hears of it and stops using the link).
        """
        imported = self._in.get(device.link)
        if imported is None:
            reason = f"stage {self.stage} has no device link {device.link} (restarted?)"
            lost = DeviceLinkLost(link=device.link, reason=reason)
            self.tasks.create_task(_tell(device.sender, lost), name=f"{self.stage} link lost")
            raise DeviceLinkLostError(reason)
        try:
            tensors, done = imported.take(device.slices)
        except ValueError as exc:
            self.drop(device)  # nothing was copied: the slots are free at once
            raise DeviceLinkLostError(f"stage {self.stage}: {exc}") from None
        slots = covered_slots(
            device.slices.values(), imported.offer.slot_bytes, imported.offer.slots
        )
        self.tasks.create_task(
            self._give_back(imported.offer.sender, device.link, slots, done),
            name=f"{self.stage} slots back",
        )
        return tensors

    def drop(self, device: DeviceChunk) -> None:
        """Give back the slots of a chunk, or a step, that will not be read (its sessions
        are gone)."""
        imported = self._in.get(device.link)
        pieces = device.slices.values()
        slots = (
            covered_slots(pieces, imported.offer.slot_bytes, imported.offer.slots)
            if imported is not None
            else tuple(sorted({piece.slot for piece in pieces}))
        )
        free = SlotsFree(link=device.link, slots=slots)
        self.tasks.create_task(_tell(device.sender, free), name=f"{self.stage} slots back")

    async def _give_back(
        self,
        sender: ActorAddress[SlotsFree | DeviceLinkLost],
        link: int,
        slots: tuple[int, ...],
        done: Any,
    ) -> None:
        await self.waiter.wait(done)
        await _tell(sender, SlotsFree(link=link, slots=slots))

    def close(self) -> None:
        """Unmap every link offered to this stage and free every link it offered."""
        for imported in self._in.values():
            imported.close()
        self._in.clear()
        for out in self._out.values():
            out.closed = True
            if out.pending is not None:
                out.pending.close()
        self._out.clear()
        for link in self._by_id.values():
            link.close()
        self._by_id.clear()


_NONE_SENT = LinkCounts(placed=0, host=0, unmarked=0)


def _counts(link: DeviceLink) -> LinkCounts:
    return LinkCounts(placed=link.sent, host=link.fallbacks, unmarked=link.unmarked)


def _unlinked(out: Outgoing) -> LinkCounts:
    return LinkCounts(placed=0, host=out.unlinked, unmarked=0)


def _sum(*counts: LinkCounts) -> LinkCounts:
    return LinkCounts(
        placed=sum(c.placed for c in counts),
        host=sum(c.host for c in counts),
        unmarked=sum(c.unmarked for c in counts),
    )


async def _tell(ref: ActorAddress[Any], message: object) -> None:
    try:
        await ref.tell(message, timeout=_OFFER_S)
    except Exception as exc:  # the peer is gone: nothing is owed to it any more
        log.debug("%s not delivered to %s: %s", type(message).__name__, ref.path, exc)
