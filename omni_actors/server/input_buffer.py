"""``InputBuffer``: a realtime session's input — appended audio, turns, items, truncation.

It keeps what the Realtime API calls the input audio buffer (what was appended since the
last commit or clear), runs server VAD over appended audio (``turns.py``), and queues
what the pipeline must hear on the connection's :class:`InputStream`, in order, answering
the client with ``speech_started``/``speech_stopped``, ``committed``, ``cleared``,
``conversation.item.added``/``done`` and ``conversation.item.truncated``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from omni_actors.protocols.realtime_client import (
    ConversationItemCreate,
    ConversationItemTruncate,
    InputAudioBufferAppend,
)
from omni_actors.protocols.realtime_server import (
    ConversationItem,
    ConversationItemAdded,
    ConversationItemDone,
    ConversationItemTruncated,
    InputAudioBufferCommitted,
    InputAudioBufferSpeechStarted,
    InputAudioBufferSpeechStopped,
    ItemContent,
)
from omni_actors.server.audio_format import decode_audio
from omni_actors.server.ids import new_id
from omni_actors.server.input_stream import Op
from omni_actors.server.request_error import RequestError
from omni_actors.server.turns import Forward, Started, Stopped, TurnDetector

if TYPE_CHECKING:
    from omni_actors.server.realtime import RealtimeConnection

__all__ = ["InputBuffer"]


class InputBuffer:
    """The input side of one realtime session (see the module docstring).

    Attributes:
        buffered: samples appended since the last commit or clear.
        pending_item: the id of the user item being spoken or appended.
        turns: server VAD, None with ``turn_detection: null``.
    """

    def __init__(self, conn: RealtimeConnection) -> None:
        self.conn = conn
        self.buffered = 0
        self.pending_item: str | None = None
        self.turns: TurnDetector | None = None

    def apply_vad(self) -> None:
        """Start turn detection anew with the session's settings (or turn it off)."""
        vad = self.conn.settings.vad
        self.turns = None if vad is None else TurnDetector(vad, self.conn.input_rate)

    async def append(self, event: InputAudioBufferAppend) -> None:
        """``input_audio_buffer.append``: decode, check the cap, run VAD, queue speech.

        Raises:
            AudioPayloadError: the audio is not valid base64 of the input format.
            RequestError: the input buffer would pass ``max_input_buffer_s``.
        """
        limits = self.conn.state.settings
        samples = decode_audio(
            event.audio, self.conn.settings.input_format, max_bytes=limits.max_append_bytes
        )
        assert self.conn.input is not None
        held = self.buffered + self.conn.input.queued_samples + samples.numel()
        if held > limits.max_input_buffer_s * self.conn.input_rate:
            raise RequestError(
                f"the input buffer would hold more than {limits.max_input_buffer_s:g}s of "
                "audio (max_input_buffer_s); commit or clear it",
                realtime_code="input_audio_buffer_full",
            )
        if self.turns is None:
            self._forward(samples)
            return
        for action in self.turns.feed(samples):
            match action:
                case Forward(samples=piece):
                    self._forward(piece)
                case Started(audio_start_ms=start_ms):
                    self.pending_item = new_id("item")
                    await self.conn.send(
                        InputAudioBufferSpeechStarted(
                            event_id=new_id("event"),
                            audio_start_ms=start_ms,
                            item_id=self.pending_item,
                        )
                    )
                    vad = self.conn.settings.vad
                    if (
                        self.conn.replies.active is not None
                        and vad is not None
                        and vad.interrupt_response
                    ):
                        await self.conn.replies.cancel(self.conn.replies.active, "turn_detected")
                case Stopped(audio_end_ms=end_ms):
                    item = self.pending_item or new_id("item")
                    self.pending_item = item
                    await self.conn.send(
                        InputAudioBufferSpeechStopped(
                            event_id=new_id("event"), audio_end_ms=end_ms, item_id=item
                        )
                    )
                    if self.buffered:
                        await self.commit(None)
                        vad = self.conn.settings.vad
                        if (
                            vad is not None
                            and vad.create_response
                            and self.conn.replies.active is None
                        ):
                            await self.conn.replies.start(None, None)

    def _forward(self, samples: torch.Tensor) -> None:
        assert self.conn.input is not None
        if samples.numel():
            self.buffered += samples.numel()
            self.conn.input.put(Op("audio", samples=samples))

    async def commit(self, event_id: str | None) -> None:
        """Make the buffer a user item (``committed``, ``item.added``/``done``).

        Raises:
            RequestError: the buffer is empty (``input_audio_buffer_commit_empty``).
        """
        if not self.buffered:
            raise RequestError(
                "the input audio buffer is empty: append audio before committing",
                realtime_code="input_audio_buffer_commit_empty",
            )
        assert self.conn.input is not None
        item_id = self.pending_item or new_id("item")
        self.pending_item = None
        self.buffered = 0
        self.conn.input.put(Op("commit", event_id=event_id))
        previous, self.conn.last_item = self.conn.last_item, item_id
        item = ConversationItem(
            id=item_id,
            role="user",
            status="completed",
            content=[ItemContent(type="input_audio", transcript=None)],
        )
        await self.conn.send_all(
            [
                InputAudioBufferCommitted(
                    event_id=new_id("event"), item_id=item_id, previous_item_id=previous
                ),
                ConversationItemAdded(
                    event_id=new_id("event"), item=item, previous_item_id=previous
                ),
                ConversationItemDone(
                    event_id=new_id("event"), item=item, previous_item_id=previous
                ),
            ]
        )

    def clear(self) -> None:
        """``input_audio_buffer.clear``: drop the buffer here, in VAD and on every stage."""
        assert self.conn.input is not None
        self.buffered = 0
        self.pending_item = None
        if self.turns is not None:
            self.turns.clear()
        self.conn.input.put(Op("clear"))

    async def create_item(self, event: ConversationItemCreate) -> None:
        """``conversation.item.create``: a user item becomes a committed turn; a system
        item sets the instructions.

        Raises:
            RequestError: another item type or role, an empty item, or audio still in
                the buffer.
        """
        item = event.item
        if item.type != "message":
            raise RequestError(f"items of type {item.type!r} are not supported; send message items")
        texts = [p.text for p in item.content if p.type in ("input_text", "text") and p.text]
        audios = [p.audio for p in item.content if p.type == "input_audio" and p.audio]
        if item.role == "system":
            if audios or not texts:
                raise RequestError("a system item holds input_text content only")
            self.conn.settings = replace(self.conn.settings, instructions="\n".join(texts))
            self.conn.queue_instructions(self.conn.settings.instructions)
        elif item.role == "user":
            if self.buffered:
                raise RequestError(
                    "the input audio buffer holds uncommitted audio; commit or clear it "
                    "before adding an item"
                )
            if not texts and not audios:
                raise RequestError("a user item needs input_text or input_audio content")
            limit = self.conn.state.settings.max_append_bytes
            decoded = [
                decode_audio(a, self.conn.settings.input_format, max_bytes=limit) for a in audios
            ]
            assert self.conn.input is not None
            for text in texts:
                self.conn.input.put(Op("text", event_id=event.event_id, text=text))
            for samples in decoded:
                self.conn.input.put(Op("audio", event_id=event.event_id, samples=samples))
            self.conn.input.put(Op("commit", event_id=event.event_id))
        else:
            raise RequestError(
                f"items with role {item.role!r} cannot be added: the pipeline generates "
                "assistant turns itself; add user or system items"
            )
        item_id = item.id or new_id("item")
        previous, self.conn.last_item = self.conn.last_item, item_id
        content = [
            ItemContent(type=p.type, text=p.text, transcript=p.transcript) for p in item.content
        ]
        added = ConversationItem(
            id=item_id,
            role="system" if item.role == "system" else "user",
            status="completed",
            content=content,
        )
        await self.conn.send_all(
            [
                ConversationItemAdded(
                    event_id=new_id("event"), item=added, previous_item_id=previous
                ),
                ConversationItemDone(
                    event_id=new_id("event"), item=added, previous_item_id=previous
                ),
            ]
        )

    async def truncate(self, event: ConversationItemTruncate) -> None:
        """``conversation.item.truncate``: cut the last reply to ``audio_end_ms``.

        Raises:
            RequestError: not the last assistant item, or ``audio_end_ms`` outside its
                audio.
        """
        reply = self.conn.replies.last
        if reply is None or reply.item_id != event.item_id:
            raise RequestError(
                f"item {event.item_id!r} is not the last assistant item; only it can be truncated",
                realtime_code="item_truncate_invalid_item_id",
            )
        if event.audio_end_ms < 0 or event.audio_end_ms > reply.audio_ms + 1:
            raise RequestError(
                f"audio_end_ms must be in [0, {reply.audio_ms:.0f}] (the item's audio), "
                f"got {event.audio_end_ms}",
                realtime_code="invalid_value",
            )
        if reply is self.conn.replies.active:
            # The user stopped listening while it was still being generated (a client
            # truncates as soon as it hears the user speak): it ends here, and the cut
            # applies once every stage has let it go.
            await self.conn.replies.cancel(reply, "client_cancelled")
        assert self.conn.input is not None
        self.conn.input.put(
            Op("truncate", event_id=event.event_id, audio_ms=event.audio_end_ms, stream=reply)
        )
        await self.conn.send(
            ConversationItemTruncated(
                event_id=new_id("event"),
                item_id=event.item_id,
                content_index=event.content_index,
                audio_end_ms=event.audio_end_ms,
            )
        )
