"""``Outlet``: one session's stream from a stage to one receiver.

An outlet applies its edge's mode before anything is sent: ``stream`` sends each output
as produced (through a ``ChunkPolicy`` window when the edge carries codec frames),
``full`` merges the segment's outputs by the receiver's accumulate rules and sends one
payload when the segment ends. It numbers its chunks and counts what it sent, and
passes a response's options on with the first chunk it sends after they reached its
stage. It spends a credit of its stream's window on each chunk
(``omni_actors.actors.stage.flow``): once the receiver has a window of them in flight, the
outlet waits — and with it the stage's engine for this session — until the receiver
grants more. An outlet to a stage hands its chunks to the stage's route to that receiver
(``omni_actors.actors.stage.steps``), which sends what every session handed it in one turn
of the event loop as one message.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Mapping

import torch

from omni_actors import remoting
from omni_actors._ref import ActorRef
from omni_actors.actors.engines.contract import Fields
from omni_actors.actors.stage.accumulate import Accumulator
from omni_actors.actors.stage.chunk_policy import Cat, ChunkPolicy, FrameChunk, FrameWindow
from omni_actors.actors.stage.device_links import Outgoing
from omni_actors.actors.stage.flow import BackpressureError, CreditWindow
from omni_actors.actors.stage.steps import Route
from omni_actors.clock import Clock
from omni_actors.cuda import StageTransfers, on_device
from omni_actors.protocols.address import ActorAddress
from omni_actors.protocols.control import AccumulateRule, EdgeMode
from omni_actors.protocols.device import DeviceChunk
from omni_actors.protocols.stage import (
    Chunk,
    End,
    HopMetrics,
    ResponseOptions,
    SessionKey,
    split_fields,
)

__all__ = ["Outlet"]


class Outlet:
    """Sends a session's outputs from stage ``source`` to ``ref`` (named ``name``).

    Args:
        key: the session's key on the stages.
        fields: output fields this receiver gets (others are not sent).
        mode: ``stream`` or ``full``.
        window: ``(initial_frames, frames, left_context, ramp)`` to window the edge's one
            tensor field into codec chunks.
        accumulate: merge rules for ``full`` mode.
        ends: whether segment ends are sent as end markers (a session's owner learns
            them from the stage's report instead).
        credits: the stream's credit window (None: no flow control), granted by the
            receiver through :meth:`grant`.
        clock: the stage's clock, for the wait for a credit.
        credit_wait_s: the longest wait for a credit (``deadlines.inter_chunk_s``).
        host: the receiver needs host memory even in this process (the caller does).

    Attributes:
        takes_device: whether outputs may reach the receiver with device tensors as they
            are (it runs in this process and is a stage); else they are copied to the host.
        closed: the session was aborted: chunks it handed to a route and not yet sent
            are dropped.
        failed: a chunk it handed to a route could not be delivered; its next send, or
            its segment's end, raises this.
    """

    def __init__(
        self,
        key: SessionKey,
        source: str,
        name: str,
        ref: ActorAddress[Chunk],
        fields: tuple[str, ...],
        *,
        mode: EdgeMode = "stream",
        window: tuple[int, int, int, tuple[int, ...]] | None = None,
        accumulate: Mapping[str, AccumulateRule] | None = None,
        ends: bool = True,
        credits: CreditWindow | None = None,
        clock: Clock | None = None,
        credit_wait_s: float = 0.0,
        host: bool = False,
    ) -> None:
        self.key = key
        self.source = source
        self.name = name
        self.ref = ref
        # A stage in this process gets the objects themselves, device tensors too.
        self.takes_device = not host and isinstance(ref, ActorRef) and remoting.in_process(ref)
        self.fields = frozenset(fields)
        self.ends = ends
        self.credits = credits
        self._clock = clock
        self._credit_wait_s = credit_wait_s
        self._policy = ChunkPolicy(*window) if window is not None else None
        self._cat: Cat = torch.cat  # a GPU stage's own once it links or routes (_join_with)
        self._window: FrameWindow | None = self._policy.window() if self._policy else None
        self._acc = Accumulator(accumulate) if mode == "full" else None
        self._seq = 0
        self._link: Outgoing | None = None
        self._transfers: StageTransfers | None = None
        self._route: Route | None = None
        self.closed = False
        self.failed: BaseException | None = None
        self.segment = 0  # the segment being sent; each flush ends one
        self._options: ResponseOptions | None = None  # to pass on with the next chunk
        self.chunks = 0
        self.bytes = 0
        self.copy_wait = 0.0  # seconds chunks waited for their device-to-host copies

    def metrics(self) -> HopMetrics:
        """Chunks, bytes and copy waits since the last :meth:`reset_metrics`."""
        return HopMetrics(chunks=self.chunks, bytes=self.bytes, copy_wait_ms=self.copy_wait * 1e3)

    def reset_metrics(self) -> None:
        """Start counting a new segment."""
        self.chunks = 0
        self.bytes = 0
        self.copy_wait = 0.0

    def grant(self, n: int) -> None:
        """The receiver has taken ``n`` more chunks (a ``StreamCredit``)."""
        if self.credits is not None:
            self.credits.grant(n)

    def use_route(self, route: Route) -> None:
        """Send through ``route`` (shared with the stage's other sessions' outlets to the
        same receiver); it places device tensors itself, once per step: in its device
        link's slots, or copied to the host."""
        self._route = route
        self.takes_device = True
        transfers = route.transfers
        if transfers is not None:  # from a GPU: frames joined on its copy stream, marked
            self._join_with(transfers.concat)

    def fail(self, error: BaseException) -> None:
        """A chunk handed to the route was not delivered: the stream is broken."""
        if self.failed is None:
            self.failed = error
        if self.credits is not None:
            self.credits.close()  # a send waiting for a credit fails now, not at its deadline

    def stamp(self, options: ResponseOptions) -> None:
        """The segment's response started with ``options``: the next chunk carries them."""
        self._options = options

    def push(self, output: Fields) -> Awaitable[None] | None:
        """Route one engine output to this receiver; what is left to await, if anything.

        Most outputs go out at once: a credit in hand and room in the receiver's mailbox
        (or the receiver taking the chunk there and then) need no wait, so the caller
        awaits only what returns here: the rest of the send when one must wait.
        """
        if self.failed is not None:
            raise self.failed
        fields = self.fields
        if output.keys() <= fields:
            picked = output  # never changed: a chunk is made of copies of its dicts
        else:
            picked = {k: v for k, v in output.items() if k in fields}
        if not picked:
            return None
        if self._acc is not None:
            self._acc.add(picked)
            return None
        if self._window is not None:
            name, frames = _one_tensor(picked)
            chunks = self._window.push(frames)
            # Most codec frames only fill the window: no send, and no coroutine to await.
            return self._send_window(name, chunks) if chunks else None
        credits = self.credits
        if self._link is not None or (credits is not None and credits.credits <= 0):
            return self._send(picked)
        if credits is not None:
            credits.credits -= 1  # CreditWindow.try_take, inlined: once per chunk
        chunk = self._chunk(picked, 0, "", None)
        route = self._route
        if route is not None:
            route.add(self, chunk)
            return None
        return None if self.ref.try_tell(chunk) else self.ref.tell(chunk)

    async def _send_window(self, name: str, chunks: list[FrameChunk]) -> None:
        for chunk in chunks:
            await self._send({name: chunk.frames}, context=chunk.context)

    async def flush(self, end: End) -> None:
        """The segment ended: send what is pending, marked with ``end``.

        Every segment ends with one flush, on every outlet, so the outlet's segment
        number follows its stage's (chunks carry it; see ``Chunk.segment``).
        """
        await self._flush(end)
        self._options = None
        self.segment += 1
        route = self._route
        if route is not None:  # the segment's chunks are with its receiver before it ends
            delivered = route.settled()
            if delivered is not None:
                await delivered
            if self.failed is not None:
                raise self.failed

    async def _flush(self, end: End) -> None:
        if self._acc is not None:
            payload = self._acc.snapshot()
            self._acc.clear()
            await self._send(payload, end=end)
            return
        if self._window is not None:
            chunks = self._window.finish()
            assert self._policy is not None
            self._window = self._policy.window(self._cat)  # the next segment: a new stream
            if chunks:
                name = next(iter(self.fields))
                for chunk in chunks[:-1]:
                    await self._send({name: chunk.frames}, context=chunk.context)
                last = chunks[-1]
                await self._send({name: last.frames}, context=last.context, end=end)
                return
        if self.ends:
            await self._send({}, end=end)

    async def _send(self, fields: Fields, *, context: int = 0, end: End = "") -> None:
        credits = self.credits
        if credits is not None:
            if credits.credits > 0:  # CreditWindow.try_take, inlined: once per chunk
                credits.credits -= 1
            else:  # before the chunk is made: the wait is the sender's, not queue wait
                await self._wait_for_credit(credits)
        if self.failed is not None:
            raise self.failed
        device = None
        if self._link is not None:
            fields, device = await self._place(fields)
        chunk = self._chunk(fields, context, end, device)
        route = self._route
        if route is not None:
            route.add(self, chunk)
            return
        await self.ref.tell(chunk)

    def _chunk(self, fields: Fields, context: int, end: End, device: DeviceChunk | None) -> Chunk:
        """The next chunk of the stream (numbered and counted: it is sent next)."""
        tensors, texts, nbytes = split_fields(fields)
        chunk = Chunk(
            key=self.key,
            source=self.source,
            seq=self._seq,
            tensors=tensors,
            texts=texts,
            context=context,
            end=end if self.ends else "",
            segment=self.segment,
            sent_at=time.monotonic(),
            options=self._options,
            device=device,
        )
        self._options = None
        self._seq += 1
        self.chunks += 1
        self.bytes += nbytes
        return chunk

    def use_link(self, link: Outgoing, transfers: StageTransfers) -> None:
        """Send device tensors through ``link`` once the receiver has accepted it; until
        then, and whenever its slots are all taken, through host memory."""
        self._link = link
        self._transfers = transfers
        self._join_with(transfers.concat)
        self.takes_device = True  # device tensors reach :meth:`_send`, which places them

    def _join_with(self, cat: Cat) -> None:
        """Join a window's frames with ``cat`` (a GPU stage's ``StageTransfers.concat``):
        ``torch.cat`` on the event loop leaves the frames unmarked, and their copy into a
        device link or to the host then waits for the step queued after them."""
        self._cat = cat
        if self._window is not None:
            self._window.cat = cat

    async def _place(self, fields: Fields) -> tuple[Fields, DeviceChunk | None]:
        """``fields`` with their device tensors in the link's slots (returned apart) or,
        failing that, copied to the host."""
        if not on_device(fields):
            return fields, None
        assert self._transfers is not None
        assert self._link is not None
        device, fields = self._link.put(fields)
        if on_device(fields):
            started = time.monotonic()
            fields = await self._transfers.to_host(fields)
            self.copy_wait += time.monotonic() - started
        return fields, device

    async def _wait_for_credit(self, credits: CreditWindow) -> None:
        assert self._clock is not None
        try:
            await credits.take(self._clock, self._credit_wait_s)
        except TimeoutError:
            raise BackpressureError(
                f"stage {self.source}", self.name, self.key, credits.size, self._credit_wait_s
            ) from None


def _one_tensor(fields: Mapping[str, torch.Tensor | str]) -> tuple[str, torch.Tensor]:
    """The single tensor field of a windowed edge (the pipeline checks there is one)."""
    for name, value in fields.items():
        if isinstance(value, torch.Tensor):
            return name, value
    raise TypeError(f"a windowed edge carries codec frames as a tensor, got {sorted(fields)}")
