"""The engine protocol: what a stage needs from the model it hosts, and what it declares.

An engine serves many sessions at once. For each session the stage calls
:meth:`Engine.generate` with an async iterator of inputs (chunks arrive while earlier
ones are being processed — that is what lets stages stream into each other) and reads
outputs as they are produced. One call serves one *segment*: a resumable session calls
``generate`` again for its next segment, and the engine may keep conversation state
per session between calls until :meth:`Engine.release` (or ``abort``). The stage names
a session by its :data:`~omni_actors.protocols.stage.SessionKey`, unique for the
pipeline's life, so per-session state never outlives its admission.

An engine class declares itself with class attributes, so a pipeline can be checked
before anything starts and no table elsewhere has to know about it::

    class EchoArgs(BaseModel):
        delay_s: float = 0.0


    class EchoEngine:
        kind = "echo"  # its registry name (entry point ``omni_actors.engines``)
        Args = EchoArgs  # a pydantic model of ``engine.args``; the engine gets an instance
        inputs = {"text": "concat"}  # fields it takes, with their accumulate rule
        outputs = {"text": "concat"}  # fields it yields, with their accumulate rule
        streams_input = True  # it can start on a segment's first chunk
        audio_rate = 16000  # the rate of the audio it yields, if it yields audio

        def __init__(self, args: EchoArgs) -> None: ...

An engine whose fields depend on its arguments defines ``ports`` instead of ``inputs``,
``outputs``, ``streams_input`` and ``audio_rate``: a classmethod that takes the
validated ``Args`` and returns :class:`Ports`. ``Args`` may be left out (the engine then
takes no arguments), and so may ``streams_input`` (True) and ``audio_rate`` (None: the
pipeline's ``outputs.sample_rate``). A key of ``engine.args`` that ``Args`` does not
declare is refused, unless ``Args`` sets pydantic's ``extra`` itself. ``kind`` names a
registered engine; a class named by its import path (``package.module:Class`` in a
pipeline) needs none.

**Conversations.** A resumable session is a conversation: its segments are responses.
Each ``generate`` call serves one response: the input since the previous response (user
turns, ended by ``commit`` marks), then the reply. An engine that keeps conversation
state declares :data:`TURN_FIELD` among its inputs; it then gets the caller's turn marks
in its input, in order with the input around them, as ``{TURN_FIELD: "commit"}``,
``{TURN_FIELD: "clear"}`` (roll back what was prefilled since the last commit) and
``{TURN_FIELD: "truncate", KEPT_FIELD: tensor(k)}`` (cut the last assistant turn to its
first ``k`` outputs). Only the entry stage gets marks from the caller; an engine may pass
them on as an output field to a stage that also declares them. Stages without the field
never see marks. A response's overrides (:class:`ResponseOptions`: ``max_tokens``,
``temperature``, ``voice``) are read with :func:`response_options` once the input has
ended (they come with the chunk that starts the response).

An entry engine that can follow a system prompt declares :data:`INSTRUCTIONS_FIELD`
among its inputs (``concat``): the caller sends the conversation's instructions as that
text field (``Session.send(fields={INSTRUCTIONS_FIELD: text})``; the realtime server
sends a ``session.update``'s ``instructions`` so), and they hold from then on, across
clears, cancelled and failed replies and truncations; an empty string sets none. The
caller checks the declaration first (``PipelineSpec.entry_inputs``): an engine without
the field has no place for a system prompt.

A reply is cancelled (barge-in) by closing the ``generate`` iterator (``aclose``) at a
``yield``: the engine keeps its session state as if the reply had ended after the last
output it yielded (the thinker keeps the spoken part of its answer in its cache), and
the conversation goes on. A ``generate`` that raises fails that response only: the
engine rolls its session state back to where the response started, and the next
response starts from there. Abort (the session is over) stays :meth:`Engine.abort`.

The stage checks what ``generate`` yields: a mapping whose fields are all declared
outputs, each value a tensor or a ``str``, and ``audio`` as a 1-D float32 tensor of mono
samples. Anything else (a field not declared, a ``str`` output, a numpy array, a list,
stereo or float64 audio) fails the response with an ``EngineOutputError``
(``engine_error``), raised in ``generate`` at that ``yield`` as if the engine had raised
it there. The class itself is checked when its stage builds it: every method of
:class:`Engine` present, ``generate`` an async generator (or a function returning an
async iterator), the others ``async def`` (``registry.protocol_problems``).

In a conversation, what an entry engine yields while a user turn still arrives (it
yields as its input streams in) is the reply to that turn: the caller gets it once it
asks for that reply (``Session.respond``), under the response's id; until then it waits,
within the output stream's window. A response whose first output does not come within
``deadlines.first_chunk_s`` of the last input the engine took fails with code
``timeout``: its ``generate`` is cancelled (``CancelledError``) where it waits, and the
session goes on with the next response. The engine tells this cancel from its task's
(the session is over) by :func:`output_overdue`, and fails the response as if it had
raised: its session state comes back to where the response started.

An engine that speaks may expose ``voices``, the names a response's ``voice`` option
takes (the talker: its checkpoint's speakers), and ``voice``, the one it speaks with
when a response names none; the stage reports them in its state, and
``OmniPipeline.health()`` lists them per stage (:func:`engine_voices`,
:func:`engine_voice`).

An engine that generates replies from a conversation (a thinker) may expose
``prompt_tokens(session)``: the tokens of the context its last reply for the session
was generated from, or None; the stage reports it at the segment's end
(``StageMetrics.prompt_tokens``, :func:`engine_prompt_tokens`), beside the token ids
the engine yielded, so a server's usage counts what the engine counted. One that caps a
reply's tokens may expose ``max_new_tokens``, the cap when a response sets no
``max_tokens`` (:func:`engine_max_new_tokens`): a reply that yielded that many token ids
was cut there, and the stage reports it (``StageMetrics.finish_reason``: ``length``).

An engine that holds at most so many sessions at once (a KV slot each) exposes
``max_sessions`` (:func:`engine_max_sessions`): the pipeline admits no more sessions
than its stages hold, so one past it waits at admission, or is refused there, instead
of failing inside the stage.

An engine that knows how long it has computed may expose ``busy_s``, the seconds it has
spent in model calls since it started (torch engines: their model thread's time in
calls); the stage reports it in its state and ``OmniPipeline.health()`` per stage
(:func:`engine_busy_s`), so two readings give the fraction of a stretch of wall time
the engine, and on a GPU its device, was busy. One whose steps replay CUDA graphs may
expose ``eager_steps``, the steps it ran eager since it started although it has graphs
(more rows than its largest graph, a shape whose graph failed or differed): reported
beside ``busy_s`` (:func:`engine_eager_steps`), 0 while every step replays. One that
runs its sessions' forwards in steps may expose ``step_counts``
(:class:`~omni_actors.protocols.control.StepCounts`: its steps, their rows and time, and
how long work queued for them), reported beside them (:func:`engine_step_counts`).

An engine whose model runs in processes of its own (vLLM's EngineCore) may expose
``died``, an ``asyncio.Future`` it resolves with an error when they exit: the stage then
fails as a whole and its supervisor restarts it (a new engine), as when a stage's worker
process dies.

**Replay.** A session remembers its conversation (what the caller sent, and the replies
as the engine that writes them generated them) so that when a stage on its path dies
and restarts, the conversation is not lost: the session opens again on every stage and
sends the whole history through the entry stage before the caller's next input, the
caller's chunks and marks as they were sent, each reply as a ``reply`` mark
(:data:`REPLY_FIELD`) after the ``commit`` that closed its user turn. The engine that
holds the conversation takes a reply mark into it as the assistant's turn, exactly as if
it had generated it (the cache ends as it did: a later ``truncate`` can cut it), and
yields nothing for it; the stages after it rebuild their state from what it sends on, as
they built it the first time. It implements :class:`Replayable` so that the session
learns each reply. That engine is the entry's, or the text output stage's when the entry
passes the conversation on to it (a cascade's recognizer declares the marks and
:data:`REPLY_FIELD` among its inputs and outputs, and its LLM holds the conversation:
``PipelineSpec.reply_stage``).

The caller adds an assistant turn of its own the same way (``Session.add_reply``: a
history a chat client holds, an assistant item of the realtime API): a ``reply`` mark
with ``text``, the turn's words, which the entry engine encodes as its chat template
renders an assistant turn and then takes as it takes a stored reply. The stages after
it see what a generated reply leaves them for later turns: Qwen3-Omni's talker, like
the reference model, conditions on the user turns and the reply it voices, not on
earlier assistant turns.

An engine after the entry stage that keeps state derived from a reply implements
:class:`Truncatable`: after a reply was cut short where the user stopped listening, the
session asks it to keep only the reply's first ``kept`` outputs, and it answers how many
rows of its streamed input those outputs depend on, which is what its source stage then
keeps (code2wav: samples to codec frames; talker: frames to text tokens).

The accumulate rule of a field says how a sequence of outputs makes one payload:
``concat`` joins tensors along dim 0 (and strings end to end), ``replace`` keeps the
last. A ``full`` edge merges a segment's outputs by it, and an edge is valid only when
both ends name the same rule for each field it carries.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, get_args

import torch

from omni_actors.protocols.control import AccumulateRule, StepCounts
from omni_actors.protocols.stage import ResponseOptions, SessionKey

__all__ = [
    "CONTEXT_FIELD",
    "INSTRUCTIONS_FIELD",
    "KEPT_FIELD",
    "NO_OPTIONS",
    "REPLY_FIELD",
    "RULES",
    "TOOLS_FIELD",
    "TOOL_CALLS_FIELD",
    "TOOL_RESULT_FIELD",
    "TURN_FIELD",
    "Engine",
    "Fields",
    "Ports",
    "Replayable",
    "ResponseOptions",
    "Rule",
    "Truncatable",
    "engine_busy_s",
    "engine_eager_steps",
    "engine_step_counts",
    "engine_max_new_tokens",
    "engine_max_sessions",
    "engine_prompt_tokens",
    "engine_voice",
    "engine_voices",
    "input_at_hand",
    "output_overdue",
    "response_options",
]

Fields = Mapping[str, torch.Tensor | str]
"""Named payload fields of a chunk: ``hidden``, ``token_ids``, ``codes``, ``text``, …"""

Rule = AccumulateRule
"""How a field's successive values make one payload (see the module docstring)."""

RULES: tuple[Rule, ...] = get_args(AccumulateRule)

CONTEXT_FIELD = "left_context"
"""Added to an input from an edge that windows codec frames (``ChunkPolicy``): a 0-d
int64 tensor, how many leading rows of the windowed field are left context, decoded
only to continue the waveform seamlessly, not to be emitted again. It is not a declared
field: the edge adds it, whatever the engines declare."""

TURN_FIELD = "turn"
"""A text field carrying a turn mark (``commit``, ``clear``, ``truncate``; see the module
docstring). Delivered only to an engine that declares it among its inputs (``concat``)."""

KEPT_FIELD = "kept"
"""With ``{TURN_FIELD: "truncate"}``: a 0-d int64 tensor, the outputs of the last reply
to keep."""

REPLY_FIELD = "reply"
"""With ``{TURN_FIELD: "reply"}``: a 1-D int64 tensor, the token ids of an assistant
turn as the engine generated it earlier, to take back into the conversation as that turn
(nothing is generated). A reply mark may carry ``text`` instead (an assistant turn the
caller gives by its words). An entry engine that declares it among its inputs implements
:class:`Replayable`, or passes the mark on to the stage that does (a cascade's
recognizer): a session then replays its conversation onto its stages when one of them
restarts (module docstring)."""

INSTRUCTIONS_FIELD = "instructions"
"""A text field setting the conversation's instructions (its system prompt) from now on;
an entry engine that declares it among its inputs follows them (module docstring)."""

TOOLS_FIELD = "tools"
"""A text field setting the tools the model may call from now on: a JSON array of
function definitions, each ``{"type": "function", "function": {"name": ...,
"description": ..., "parameters": {...}}}`` as chat templates take them (``"[]"``: none).
An entry engine that declares it among its inputs gives them to the model through the
release's chat template (with the instructions, in the system turn), and the entry stage
keeps the tool calls the model writes (``<tool_call>...</tool_call>`` in its ``text``)
from the stages after it: a tool call is never spoken
(:mod:`omni_actors.actors.engines.tool_calls`)."""

TOOL_RESULT_FIELD = "tool_result"
"""A text field adding a tool's result (its output, as text) to the open user turn, as
the release's chat template renders a ``tool`` message (Qwen: a ``<tool_response>``
block in a user turn). Declared by an entry engine that declares :data:`TOOLS_FIELD`."""

TOOL_CALLS_FIELD = "tool_calls"
"""A text field of a ``reply`` mark: the earlier assistant turn it gives back called tools
(a caller holds the conversation, as a chat completion's ``assistant`` message with
``tool_calls``), a JSON object ``{"content": str | null, "tool_calls": [{"type":
"function", "function": {"name": ..., "arguments": "<JSON text>"}}]}``. The entry engine
takes it, words and calls, as the release's chat template renders the assistant's turn
(in place of the mark's ``reply`` ids or ``text``: nothing is generated or yielded).
Declared by an entry engine that declares :data:`TOOLS_FIELD`."""

NO_OPTIONS = ResponseOptions()
"""The options of a response that overrides nothing."""


def response_options(inputs: AsyncIterator[Fields]) -> ResponseOptions:
    """The overrides of the response whose input ``inputs`` is (read after it ended).

    A stage's input iterator carries them as ``options``; any other iterator (an engine
    driven directly, in a test) overrides nothing.
    """
    options = getattr(inputs, "options", None)
    return options if isinstance(options, ResponseOptions) else NO_OPTIONS


def engine_max_new_tokens(engine: object) -> int | None:
    """``engine``'s ``max_new_tokens`` (see the module docstring): a reply's most tokens
    when its response sets none; None for an engine that does not tell."""
    limit = getattr(engine, "max_new_tokens", None)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        return None
    return limit


def engine_max_sessions(engine: object) -> int | None:
    """``engine``'s ``max_sessions`` (see the module docstring): the most sessions it
    holds at once; None for an engine without a limit."""
    limit = getattr(engine, "max_sessions", None)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        return None
    return limit


def engine_prompt_tokens(engine: object) -> Callable[[str], int | None] | None:
    """``engine``'s ``prompt_tokens(session)`` (see the module docstring), or None for
    an engine without it."""
    counted = getattr(engine, "prompt_tokens", None)
    return counted if callable(counted) else None


def engine_voice(engine: object) -> str | None:
    """The voice ``engine`` speaks with when a response names none: its ``voice``; None
    for an engine without one."""
    voice = getattr(engine, "voice", None)
    return voice if isinstance(voice, str) and voice else None


def engine_voices(engine: object) -> list[str] | None:
    """The voices ``engine`` speaks with: its ``voices`` (a talker's speakers, which a
    response's ``voice`` option names), sorted; None for an engine without them."""
    voices = getattr(engine, "voices", None)
    if voices is None or isinstance(voices, str):
        return None
    try:
        names = sorted(voices)
    except TypeError:
        return None
    return names if all(isinstance(name, str) for name in names) else None


def engine_busy_s(engine: object) -> float | None:
    """The seconds ``engine`` has spent in model calls since it started: its ``busy_s``;
    None for an engine that does not tell (a scripted one, or one computing in a
    process of its own)."""
    busy = getattr(engine, "busy_s", None)
    if isinstance(busy, bool) or not isinstance(busy, int | float):
        return None
    return float(busy)


def engine_eager_steps(engine: object) -> int | None:
    """The steps ``engine`` ran eager since it started although it replays them from
    CUDA graphs: its ``eager_steps``; None for an engine without graphs (on the CPU,
    turned off) or one that does not tell."""
    steps = getattr(engine, "eager_steps", None)
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


def engine_step_counts(engine: object) -> StepCounts | None:
    """What ``engine``'s step loop has run since it started: its ``step_counts``; None
    for an engine without one."""
    counts = getattr(engine, "step_counts", None)
    return counts if isinstance(counts, StepCounts) else None


def output_overdue(inputs: AsyncIterator[Fields]) -> bool:
    """Whether the stage cancelled the response whose input ``inputs`` is because its
    first output did not come within ``first_chunk_s`` (read in the engine's handling of
    that ``CancelledError``): the response failed, the session goes on.

    A stage's input iterator carries it as ``output_overdue``; any other iterator never
    is overdue.
    """
    return getattr(inputs, "output_overdue", False) is True


def input_at_hand(inputs: AsyncIterator[Fields]) -> bool:
    """Whether the next read of ``inputs`` returns without waiting for input to come
    (the next chunk, or the input's end, is already there): an engine may take it before
    handing out an output, whose routing may take turns of the event loop.

    A stage's input iterator carries it as ``at_hand``; any other iterator never says so.
    """
    return getattr(inputs, "at_hand", False) is True


@dataclass(frozen=True, slots=True)
class Ports:
    """What an engine takes and yields, read by the pipeline to check and wire its edges.

    Attributes:
        inputs: the fields it takes, each with its accumulate rule.
        outputs: the fields it yields, each with its accumulate rule.
        streams_input: it can work on a segment's chunks as they arrive; an engine that
            needs the whole payload first takes only ``full`` edges.
        audio_rate: the sample rate of the ``audio`` it yields, when it knows it (None:
            whatever the pipeline's ``outputs.sample_rate`` says). The stage that gives
            the caller audio sets the pipeline's ``outputs.sample_rate`` by it, and one
            that disagrees with it is refused when the pipeline loads.
        host_inputs: inputs it reads on the host (row counts, flags): a GPU stage leaves
            them in host memory, where reading them back from its device would wait for
            everything queued there (a running step).
    """

    inputs: Mapping[str, Rule]
    outputs: Mapping[str, Rule]
    streams_input: bool = True
    audio_rate: int | None = None
    host_inputs: frozenset[str] = frozenset()


class Engine(Protocol):
    """One model behind a stage."""

    async def start(self) -> None:
        """Load weights and allocate what every session shares."""

    def generate(self, session: SessionKey, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        """Outputs for ``session`` as they are produced, while ``inputs`` still arrive."""

    async def abort(self, session: SessionKey) -> None:
        """Stop ``session`` now and free its state; its ``generate`` ends promptly."""

    async def release(self, session: SessionKey) -> None:
        """``session`` ended normally: drop whatever state it kept between segments."""

    async def stop(self) -> None:
        """Release everything (after every session has ended or been aborted)."""


class Replayable(Protocol):
    """An engine that holds the conversation and can take a stored reply back (see the
    module docstring)."""

    def last_reply(self, session: SessionKey) -> tuple[int, ...] | None:
        """The token ids of the reply ``session``'s last ``generate`` produced.

        A cancelled reply's as far as it was yielded; None when that call produced no
        reply (cancelled before its first token, or only took reply marks) or failed.
        """


class Truncatable(Protocol):
    """An engine whose per-session state follows its replies (see the module docstring)."""

    async def truncate(self, session: SessionKey, kept: int) -> int:
        """Keep the first ``kept`` outputs of ``session``'s last reply; forget the rest.

        Returns:
            How many rows of its streamed input (the source stage's outputs) the kept
            outputs depend on: what the source stage keeps in turn.

        Raises:
            ValueError: the session has no reply to truncate.
        """
