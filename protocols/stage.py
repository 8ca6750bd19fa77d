"""The data plane: chunks that flow stage to stage, and what a stage reports per segment.

A :class:`Chunk` carries named payload fields (``hidden``, ``token_ids``, ``codes``,
``audio`` as tensors; ``text`` as a string) of one session, numbered per stream (one
sender to one receiver) so the receiver drops duplicates and detects gaps. A chunk may
also end a *segment* (the session stays open: resumable input) or the whole session.

Every stage reports a :class:`StageReport` to the session's owner when a segment ends,
whether it finished, failed or timed out, with the stage's :class:`StageMetrics`.

A stage sends the chunks its sessions make within one turn of its event loop (one engine
step of many sessions, as a batched engine makes them) to each receiving stage as one
:class:`StepChunks`: one message, with each tensor field of the step in one buffer,
while every chunk keeps its own session, sequence number and credit.

On the stages a session is known by its :data:`SessionKey`, not by the id its caller
chose: see there why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, NewType

import msgspec
import torch

from omni_actors.protocols.device import DeviceChunk
from omni_actors.protocols.error_code import ErrorCode

__all__ = [
    "INPUT",
    "Chunk",
    "End",
    "FailureCause",
    "FinishReason",
    "HopMetrics",
    "Mark",
    "ReportEnd",
    "ResponseOptions",
    "SessionKey",
    "StageMetrics",
    "StageReport",
    "StepChunks",
    "split_fields",
]

SessionKey = NewType("SessionKey", str)
"""A session's key on the stages: its caller's id and its admission number, ``"id#n"``.

Unique for the pipeline's life, unlike the id (a caller may reuse an id once its
session has ended), so a stage never mistakes a new session for an earlier one with the
same id: a late chunk, or the memory of an abort, matches only its own admission. The
caller's id travels only in the caller's events (``session`` fields)."""

INPUT = "input"
"""The ``source`` of chunks the caller sends into the entry stage."""

End = Literal["", "segment", "finished"]
"""How a chunk ends its stream: not at all, at a segment boundary, or for good."""

ReportEnd = Literal["segment", "finished", "failed", "error"]
"""How a stage's work on a session's segment ended: the segment (a response) ended, the
session finished, or the session failed here (the stage dropped it). ``failed`` is a
notice sent as soon as the engine failed the response (the stage keeps the session and
still reports the segment's end once its input has drained)."""

FailureCause = Literal["engine", "peer_gone", "chunk_gap", "timeout", "internal"]
"""Where a stage's ``failed`` or ``error`` report came from, set by the stage, which
knows: ``engine``: the engine raised. ``peer_gone``: an actor the session's streams
connect the stage to (a stage, the session's owner) stopped, or its process died.
``chunk_gap``: chunks of an input stream were lost. ``timeout``: a wait bounded by the
session's deadlines expired (for input, for a receiver's credit, or the whole session).
``internal``: anything else (a chunk off the session's path or past its window, a bug).
The session's owner routes on it: a stream that broke (``peer_gone``, ``chunk_gap``)
costs the responses in flight, not a conversation that can be replayed."""

Mark = Literal["", "commit", "clear", "truncate", "reply"]
"""A turn mark in the caller's input (``Session.commit``, ``clear``, ``truncate``), ordered
with the input around it: ``commit`` ends a user turn (what was prefilled of it stays),
``clear`` drops the input since the last commit (what was prefilled of it is rolled back),
``truncate`` cuts the last assistant turn to its first ``Chunk.kept`` outputs. ``reply``
carries an assistant turn, which the entry engine takes into the conversation without
generating anything: as it was generated (tensor ``reply``, the token ids), when the
session replays a conversation onto a restarted stage, or by its words (text ``text``:
``Session.add_reply``)."""


class ResponseOptions(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Per-response overrides (``Session.respond``); None keeps the stage's own setting.

    They travel with the chunk that starts the response and, from stage to stage, on the
    first chunk of each segment an outlet sends; an engine reads them with
    ``omni_actors.actors.engines.contract.response_options``.

    Attributes:
        max_tokens: the reply's most text tokens (the thinker's bound on a session's
            output, and so on the memory every later stage holds for it).
        temperature: sampling temperature (0: greedy).
        voice: the speaker's name, for a stage that speaks.
        instructions: a system prompt for this reply alone, for an entry stage that
            takes instructions: it follows them in this reply, and the conversation
            keeps the reply but not them (the realtime API's ``response.instructions``).
        tools: tools for this reply alone (a JSON array as the entry stage's ``tools``
            field takes, not empty), for an entry stage that takes tools: offered with
            the reply's own instructions in the system turn fed before it, and kept out
            of the conversation as they are (the realtime API's ``response.tools``).
    """

    max_tokens: int | None = None
    temperature: float | None = None
    voice: str | None = None
    instructions: str | None = None
    tools: str | None = None


class Chunk(msgspec.Struct, tag="chunk", frozen=True, kw_only=True):
    """One piece of one session's stream from ``source`` to the receiving stage.

    Attributes:
        key: the session's key on the stages.
        source: the sending stage's name, or :data:`INPUT` for the caller.
        seq: position in this stream, from 0; an end marker takes a number too.
        tensors: tensor fields by name (time or tokens along dim 0).
        texts: text fields by name.
        context: leading rows of the windowed tensor that are left context only
            (already delivered in an earlier chunk; see ``ChunkPolicy``).
        end: ``segment`` or ``finished`` on the last chunk of a segment / session.
        segment: the session's segment this chunk belongs to, from 0 (set by its sender,
            so a receiver can attribute output of overlapping segments: the caller may
            end segment 1 while a later stage still works on segment 0).
        sent_at: ``time.monotonic()`` at the sender, for queue-wait metrics.
        mark: a turn mark from the caller (see :data:`Mark`); a marked chunk carries
            no payload but a ``reply`` mark's turn.
        kept: with ``mark="truncate"``, how many outputs of the last reply to keep.
        options: the response's overrides, on the chunk that starts a response and on
            the first chunk of each segment a stage sends on.
        device: tensor fields left on the GPU, in slots of a device link (see
            ``omni_actors.protocols.device``); the receiving stage copies them out.
    """

    key: SessionKey
    source: str
    seq: int
    tensors: dict[str, torch.Tensor] = {}
    texts: dict[str, str] = {}
    context: int = 0
    end: End = ""
    segment: int = 0
    sent_at: float = 0.0
    mark: Mark = ""
    kept: int = 0
    options: ResponseOptions | None = None
    device: DeviceChunk | None = None

    @property
    def has_payload(self) -> bool:
        """True if the chunk carries any field (an end marker may carry none)."""
        return bool(self.tensors) or bool(self.texts) or self.device is not None

    def fields(self) -> dict[str, torch.Tensor | str]:
        """Every payload field by name."""
        fields: dict[str, torch.Tensor | str] = dict(self.tensors)
        fields.update(self.texts)
        return fields

    @property
    def nbytes(self) -> int:
        """Payload bytes: tensor storage plus UTF-8 text."""
        size = 0
        for tensor in self.tensors.values():
            size += tensor.nbytes
        for text in self.texts.values():
            size += len(text.encode())
        return size


class StepChunks(msgspec.Struct, tag="step-chunks", frozen=True, kw_only=True):
    """Stage → stage: the chunks one stage sent one receiving stage within one turn of its
    event loop (an engine step of several sessions), as one message.

    Each member is a whole :class:`Chunk` of its own stream (its session, sequence number
    and credit, exactly as if sent alone), but for the tensor fields the step *packed*:
    the members' rows of such a field travel concatenated along dim 0, in the members'
    order, as one tensor, so the step's field crosses the process boundary (or the copy
    from the device) once, not once per session; the receiver slices each member's rows
    back out as views, without a copy (``omni_actors.actors.stage.steps``).

    Attributes:
        chunks: the members, in the order they were sent; a packed field is left out of
            their ``tensors``.
        packed: per packed field, the members' rows concatenated along dim 0.
        rows: per packed field, each member's row count, in member order; -1 where the
            member does not carry the field.
        device: packed fields left on the GPU, in slots of a device link (one slot for
            the whole step); their rows are in ``rows`` too, and the receiving stage
            copies them out once for the step before slicing each member's rows.
    """

    chunks: tuple[Chunk, ...]
    packed: dict[str, torch.Tensor] = {}
    rows: dict[str, tuple[int, ...]] = {}
    device: DeviceChunk | None = None


def split_fields(
    fields: Mapping[str, torch.Tensor | str],
) -> tuple[dict[str, torch.Tensor], dict[str, str], int]:
    """Tensor fields and text fields of a payload, as :class:`Chunk` stores them, and
    their payload bytes (:attr:`Chunk.nbytes`, counted in the same pass)."""
    tensors: dict[str, torch.Tensor] = {}
    texts: dict[str, str] = {}
    size = 0
    for name, value in fields.items():
        if isinstance(value, str):
            texts[name] = value
            size += len(value) if value.isascii() else len(value.encode())
        else:
            tensors[name] = value
            size += value.nbytes
    return tensors, texts, size


class HopMetrics(msgspec.Struct, frozen=True, kw_only=True):
    """What one stage sent to one receiver (a stage, or the caller) for a session.

    Attributes:
        chunks: chunks sent.
        bytes: their tensors' and texts' bytes.
        copy_wait_ms: how long chunks waited for their device tensors to be copied to
            host memory before they could be sent (0 on the host or over a device link).
    """

    chunks: int = 0
    bytes: int = 0
    copy_wait_ms: float = 0.0


FinishReason = Literal["stop", "length"]
"""How a reply ended: by itself (``stop``), or cut at its most tokens (``length``)."""


class StageMetrics(msgspec.Struct, frozen=True, kw_only=True):
    """One stage's share of one session's segment.

    Attributes:
        queue_wait_ms: summed time input chunks spent between their sender and the
            engine taking them (mailbox and session queue).
        queue_wait_max_ms: the longest that one input chunk spent there: the hop's
            worst latency per chunk.
        compute_ms: time the engine spent producing outputs, excluding time it waited
            for input.
        chunks_in: input chunks accepted (duplicates excluded).
        duplicates: duplicate input chunks dropped.
        outputs: outputs the engine produced.
        hops: per receiver (a stage name, or ``client``): chunks and bytes sent.
        queued_max: the most input chunks waiting for the engine at once (bounded by
            the pipeline's ``flow.window`` per source).
        first_output_at: when the engine yielded its first output of the segment
            (``time.time()``: comparable across the stages of one host), None if none.
        last_output_at: when it yielded its last one: with the other stages' times, the
            segment's timeline (did the talker start before the thinker finished?).
        prompt_tokens: from an engine that tells (a thinker): the tokens of the context
            its reply in the segment was generated from (the conversation so far: what
            OpenAI's usage counts as the prompt); None otherwise, or with no reply.
        completion_tokens: the token ids the engine yielded (rows of its ``token_ids``
            outputs); None from an engine that yields none.
        finish_reason: from an engine that tells its cap on a reply's tokens
            (``max_new_tokens``, or the response's ``max_tokens``): ``length`` when its
            reply was cut there, ``stop`` when it ended by itself; None otherwise.
    """

    queue_wait_ms: float = 0.0
    queue_wait_max_ms: float = 0.0
    compute_ms: float = 0.0
    chunks_in: int = 0
    duplicates: int = 0
    outputs: int = 0
    hops: dict[str, HopMetrics] = {}
    queued_max: int = 0
    first_output_at: float | None = None
    last_output_at: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: FinishReason | None = None


class StageReport(msgspec.Struct, tag="stage-report", frozen=True, kw_only=True):
    """Stage → session's owner: the session's segment has ended here (``end``).

    Sent after every output chunk of that segment, so the owner knows the stage's output
    is complete.

    Attributes:
        key: the session's key on the stages.
        stage: the reporting stage.
        segment: which segment of the session, from 0.
        end: see :data:`ReportEnd`.
        metrics: the stage's share of the segment.
        code: on ``failed`` or ``error``, what kind of failure (the error's ``code``).
        failure: on ``failed`` or ``error``, where it came from (see
            :data:`FailureCause`); None otherwise.
        error_type: on ``failed`` or ``error``, the exception's ``module:QualName``.
        error: on ``failed`` or ``error``, its message.
        reply: from an engine that can take a stored reply back (``REPLY_FIELD`` among
            its inputs), on a segment's end: the token ids of the reply it generated in
            that segment (a cancelled reply's as far as it went; None when it generated
            none, or failed). The session keeps them to replay the conversation.
    """

    key: SessionKey
    stage: str
    segment: int
    end: ReportEnd
    metrics: StageMetrics
    code: ErrorCode | None = None
    error_type: str = ""
    error: str = ""
    reply: tuple[int, ...] | None = None
    failure: FailureCause | None = None
