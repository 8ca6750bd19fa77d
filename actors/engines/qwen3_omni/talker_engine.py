"""``TalkerEngine``: tiny-omni's talker, one codec frame per output, across a conversation.

The talker turns the thinker's answer into codec frames, conditioned as HF's reference
``Qwen3OmniMoeForConditionalGeneration.generate`` conditions it: on *every user turn of
the conversation so far* (the user-role positions, gathered contiguously), then the
9-position assistant prefix of the reply (which already holds its first text token);
earlier assistant turns are not part of its input. So a session keeps, across responses
until release or abort, a KV cache of the user parts only. Per response it crops the
cache back to the end of the user parts (dropping the previous reply's positions),
prefills a user turn's rows as the thinker sends them (the thinker sends them as it
prefills the turn, while the user still speaks: the talker's ``generate`` runs during
the user's turn), drops the last rows it prefilled when the thinker takes them back (a
``clear`` of the open turn: its ``user`` positions come back to the last commit, as a
failed response's come back to its start), then, when the first token comes, the user
rows left plus the assistant prefix in one forward, then steps one frame at a time:
frame ``k``'s text input is token ``k``'s embedding while ``k < N``, then TTS_EOS once,
then TTS_PAD — HF's schedule, so the codes equal HF's for the same conversation
(``tests/integration/test_tiny_omni_talker_turns.py``).

It never guesses ahead: when frame ``k`` needs token ``k`` and that has not arrived, it
waits for the next input chunk. The total ``N`` is only known once the input ended, so
the output does not depend on how the thinker's output was chunked (one output per
chunk on a ``stream`` edge, one chunk with everything on a ``full`` edge).

State across responses: a response that completes, or is cancelled (its ``generate``
closed at a ``yield``), keeps the user turns it prefilled; one that fails rolls back to
where it started; release and abort drop the session. Frame ``k`` is conditioned on
tokens ``0 .. min(k, N - 1)``, so :meth:`TalkerEngine.truncate` maps kept frames to kept
tokens one to one, capped at the reply's ``N``.

Serving. Every forward is work on the engine's
:class:`~omni_actors.actors.engines.step_loop.StepLoop`, as the thinker's: each step
runs a frame row of every session whose next frame's text has come, and prefill chunks
of user rows and of replies' openings, in one forward over the
:class:`~.slot_cache.SlotCache` (one slot per session: the talker's only KV cache; a
reply's frames are dropped by moving the session's length back to its user parts), then
one code-predictor loop over every row that makes a frame. A frame whose token has not
arrived is not asked for: the session waits for its input instead. A row's logits in a
step of several can differ from its solo run in the last bits (other matmul shapes), so
a near-tied pick could flip (``tests/integration/test_tiny_omni_talker_batching.py``
pins the codes of sessions stepped together against solo runs with the model driven
directly; through the engine, where timing decides the steps, tests assert structure).
A failed step fails every session in it, each rolled back as above.

On a GPU a frame-only step returns before the device has run it (its codec EOS flags
come back behind it: :class:`~.talker_model.Framed`), but only once the step before it
has run (``_step``): the device holds one step behind the one it runs, and the loop's
steps come at the device's pace, not the host's. A session queues its next frame before
it hands out the one it has, in the turn of the event loop that step's results come in,
so every session whose token has come is in the next step.

A reply ends at codec EOS, as HF and a real checkpoint end their speech (or at
``max_frames``). tiny-omni's presets instead mask EOS and cap the reply at
``frames_per_token * N`` frames (``stop_at_codec_eos: false``), a length tests and
benchmarks can plan for: its random weights pick EOS only now and then (e.g. at frame
91 of 256 for "Tell me a story." answered in 128 tokens). Every frame HF would produce
is the same either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

import torch
from pydantic import Field, field_validator, model_validator

from omni_actors.actors.engines.contract import (
    Fields,
    ResponseOptions,
    Rule,
    input_at_hand,
    response_options,
)
from omni_actors.actors.engines.qwen3_omni.family import DEFAULT_RELEASE
from omni_actors.actors.engines.qwen3_omni.frame_compile import (
    FrameCompileArgs,
    end_compile_workers,
)
from omni_actors.actors.engines.qwen3_omni.moe import MoeArgs
from omni_actors.actors.engines.qwen3_omni.slot_cache import DecodeAttentionArgs
from omni_actors.actors.engines.qwen3_omni.static_decode import PrefillGraphArgs
from omni_actors.actors.engines.qwen3_omni.talker_input import ReplyInput, TalkerInputError
from omni_actors.actors.engines.qwen3_omni.talker_model import (
    Framed,
    TalkerChunk,
    TalkerFeed,
    TalkerModel,
    Voice,
)
from omni_actors.actors.engines.step_loop import RequestClosedError
from omni_actors.actors.engines.stepped_engine import StepLoopArgs, SteppedTorchEngine
from omni_actors.actors.engines.thinker_ports import USER_EDITS_FIELD
from omni_actors.actors.engines.torch_engine import AbortSignal, DeviceArgs, release_dir
from omni_actors.cuda import Completable, EventWaiter
from omni_actors.models.family import WeightsArgs

__all__ = ["TalkerArgs", "TalkerEngine", "TalkerInputError"]


class TalkerArgs(
    WeightsArgs,
    DeviceArgs,
    PrefillGraphArgs,
    DecodeAttentionArgs,
    FrameCompileArgs,
    StepLoopArgs,
    MoeArgs,
):
    """The talker's arguments: ``seed`` and ``cache_dir`` locate its weights; the static
    slot cache's and its fresh prefill graphs' (:class:`PrefillGraphArgs`), its frames'
    backbone attention (:class:`DecodeAttentionArgs`), its frame
    step's compile (:class:`FrameCompileArgs`: on a GPU by default) and its experts'
    forward (:class:`MoeArgs`).

    Attributes:
        frames_per_token: cap a reply at that many codec frames per thinker token (the
            length a test or a benchmark plans for); None: no cap, the reply ends at
            codec EOS, as a real checkpoint ends its speech.
        speaker: the voice, one of the checkpoint's (``talker_config.speaker_id``;
            Qwen3-Omni's are ``chelsie``, ``ethan`` and ``aiden``), checked when the model
            loads; a response's ``voice`` option overrides it.
        stop_at_codec_eos: end the reply when the talker picks codec EOS (the
            default); False masks EOS, so a reply is exactly ``frames_per_token`` frames
            per token (see the module docstring).
        max_frames: the most frames of one reply (HF's ``talker_max_new_tokens``): a
            reply whose EOS never comes ends there.
        max_context: the most positions a session holds: its user turns and a reply's
            frames (one position each, ``max_frames`` at most).
        prefill_graphs: a session's first user rows (and a one-shot reply's opening)
            replay a fresh prefill graph of their length (on by default where steps
            replay graphs, as the thinker's).
        prefill_batch: 1 by default, unlike the thinker's 4: batching the talker's
            prompts is not settled by measurement yet (docs/gpus.md).
    """

    frames_per_token: int | None = Field(None, ge=1)
    speaker: str = "chelsie"
    stop_at_codec_eos: bool = Field(True, strict=True)
    max_frames: int = Field(4096, ge=1)
    max_context: int = Field(8192, ge=2)
    prefill_batch: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _ends(self) -> TalkerArgs:
        if self.frames_per_token is None and not self.stop_at_codec_eos:
            raise ValueError(
                "a reply would end only at max_frames: set frames_per_token, or leave "
                "stop_at_codec_eos on"
            )
        return self

    @field_validator("speaker")
    @classmethod
    def _lower_case(cls, speaker: str) -> str:
        return speaker.lower()


class TalkerEngine(SteppedTorchEngine[Voice, TalkerFeed, Framed | None]):
    """Codec frames for the thinker's tokens, conditioned on the conversation's user turns.

    Inputs (any subset per chunk; see the module docstring): ``user`` [n, H] and
    ``user_mask`` [n] bool, rows of user turns (at placeholder positions, where the mask is
    True, the thinker's ``accept_hidden_layer`` state, elsewhere its input embedding), sent
    before or with the first token, with ``user_edits`` [k] int64 (rows joining, and rows
    taken back: :mod:`~omni_actors.actors.engines.thinker_ports`); ``opening`` [3, H]
    (embeddings of ``<|im_start|> assistant \\n``) and ``tts`` [3, H] (TTS_BOS, TTS_EOS,
    TTS_PAD) with the first token; ``embed`` [n, H], one row per token. Outputs: ``codes``
    [1, G] int64, one frame each, every code in ``[0, codebook_size)``.

    Args:
        args: see :class:`TalkerArgs`.

    Raises:
        ModelNotPreparedError: the weights are not prepared.
    """

    kind: ClassVar[str] = "qwen3-omni.talker"
    Args: ClassVar[type[TalkerArgs]] = TalkerArgs
    inputs: ClassVar[dict[str, Rule]] = {
        "user": "concat",
        "user_mask": "concat",
        USER_EDITS_FIELD: "concat",
        "opening": "replace",
        "tts": "replace",
        "embed": "concat",
    }
    outputs: ClassVar[dict[str, Rule]] = {"codes": "concat"}
    streams_input: ClassVar[bool] = True
    # Row counts, read as a list when rows arrive: from the device that read would wait
    # for the running frame step, on the event loop.
    host_inputs: ClassVar[frozenset[str]] = frozenset({USER_EDITS_FIELD})

    def __init__(self, args: TalkerArgs) -> None:
        self.frames_per_token = args.frames_per_token
        self.max_frames = args.max_frames
        self.stop_at_codec_eos = args.stop_at_codec_eos
        self.speaker = args.speaker
        self._args = args
        # Frame steps' codec EOS flags, read back behind the steps (``_at_eos``).
        self._readback = EventWaiter(name="talker codec EOS")
        # The last frame step's event, which the next step waits for (``_step``).
        self._behind: Completable | None = None
        super().__init__(
            release_dir(DEFAULT_RELEASE, args, "talker"),
            "talker",
            args.device,
            args=args,
            max_context=args.max_context,
        )
        # A fresh prefill split by the step's budget would replay its graph for the
        # first part and run the rest as a forward of its own (the thinker's reason).
        self.loop.whole_fresh_prefills = args.prefill_graphs_on(self.device)

    def _load(self, path: Path) -> None:
        args = self._args
        graphs = args.graphs_on(self.device)
        model = TalkerModel(
            path,
            self.device,
            stop_at_codec_eos=self.stop_at_codec_eos,
            slots=args.max_sessions,
            max_context=args.max_context,
            max_rows=args.max_batch,
            graphs=graphs,
            warm=graphs and args.warm_graphs,
            frame_compile=args.frame_compile(self.device),
            moe=args.moe,
            moe_combine=args.moe_combine,
            compile_prefill=args.prefill_compile(self.device),
            prefill_graphs=args.prefill_graphs_on(self.device),
            prefill_bucket=args.prefill_bucket,
            prefill_batch=args.prefill_batch,
            step_tokens=args.max_tokens_per_step,
            decode_attention=args.decode_attention,
        )
        if self.speaker not in model.speakers:
            raise ValueError(
                f"unknown speaker {self.speaker!r}: the checkpoint's voices are "
                f"{', '.join(sorted(model.speakers))}; set engine.args.speaker to one of them"
            )
        self._model = model

    async def stop(self) -> None:
        """Stop the step loop and the model thread, then the compile workers its frame
        and prefill compiles started (:func:`~.frame_compile.end_compile_workers`)."""
        await super().stop()
        readback, self._readback = self._readback, EventWaiter(name="talker codec EOS")
        await readback.close()  # (a fresh one for a restart: a closed waiter takes none)
        model: TalkerModel | None = getattr(self, "_model", None)
        if model is None:
            return
        regions = [*model.compiled.values(), model.prefill_compiled]
        if any(region != "off" for region in regions):
            end_compile_workers()

    @property
    def voices(self) -> list[str]:
        """The voices ``speaker`` and a response's ``voice`` may name (once started)."""
        return sorted(self._model.speakers)

    @property
    def voice(self) -> str:
        """The voice a response naming none speaks with (``speaker``)."""
        return self.speaker

    def _step(self, chunks: list[TalkerChunk]) -> list[Framed | None]:
        out = self._model.step(chunks)
        # A frame step returns before the device runs it; the step loop is paced by the
        # device all the same: this one returns once the step before it has run, so the
        # device holds one step behind the one it runs and every session's next frame
        # joins the next step (``generate``). A loop that went on as soon as a step was
        # queued ran whoever had queued by then, a step for every session or two (1.65
        # frames a step at c=8 on two H200s, RTF 0.47 against 0.18); a talker whose
        # queue was not bounded ran through the whole reply, taking the thinker's
        # tokens and its GPU's time from the other work there (RTF 0.110 against 0.099
        # at c=1).
        ready = next((f.ready for f in out if f is not None and f.ready is not None), None)
        behind, self._behind = self._behind, ready
        if behind is not None:
            behind.synchronize()
        return out

    @property
    def eager_steps(self) -> int | None:
        """Steps run eager for want of a graph (:attr:`TalkerModel.eager_steps`); None
        on the CPU, or before the model is loaded."""
        model: TalkerModel | None = getattr(self, "_model", None)
        return None if model is None else model.eager_steps

    async def _prefill_user(self, voice: Voice, rows: torch.Tensor, mask: torch.Tensor) -> None:
        """Append user rows to the session's user parts."""
        voice.crop()
        inputs = await self.call(self._model.user_inputs, rows, mask)

        def then() -> None:
            voice.user += rows.shape[0]

        await self.feed(voice, TalkerFeed(inputs=inputs), rows.shape[0], lambda _: then())

    @staticmethod
    def _take_back(voice: Voice, count: int) -> None:
        """The session's last ``count`` user positions go (the thinker took their rows
        back)."""
        voice.user -= count
        voice.crop()

    # -- introspection -------------------------------------------------------------------

    def user_positions(self, session: str) -> int:
        """Positions of ``session``'s user parts in its KV cache (0 when it has no state)."""
        voice = self._sessions.get(session)
        return 0 if voice is None else voice.user

    # -- the engine protocol --------------------------------------------------------------

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        """Prefill the response's user rows as they come, then frames until codec EOS
        (``stop_at_codec_eos``, as the real model ends its speech: the reply then ends
        at once, its remaining input left unread for the stage to drain), the cap of
        ``frames_per_token * N`` for its ``N`` tokens, or ``max_frames``. The voice is
        the response's ``voice`` option, else ``speaker``, read when the first token
        comes (the thinker's input, which the option comes with, has ended by then).

        Raises:
            ValueError: the session is already generating.
            TalkerInputError: tokens came without ``opening``/``tts``, user rows without their
                mask or after the first token, ``user_edits`` that do not count the rows they
                came with or take back more than the response sent, or the voice is unknown. The
                response fails alone: the session's state goes back to its start.
        """
        voice = self._sessions.get(session)
        if voice is None:
            voice = self._sessions[session] = Voice(self.loop.open(session), self.loop)
        if voice.signal is not None:
            raise ValueError(f"session {session!r} is already generating")
        signal = voice.signal = AbortSignal()
        start, last_reply = voice.user, voice.reply
        got = ReplyInput()
        step: asyncio.Future[list[Framed | None]] | None = None
        failed = False
        try:
            if not await self._listen(voice, signal, inputs, got) or not got.embeds:
                return  # aborted, or the thinker said nothing: no speech
            speaker = self._speaker_id(response_options(inputs))
            if got.opening is None or got.tts is None:
                raise TalkerInputError(
                    "talker input lacks opening or tts: the thinker -> talker edge must "
                    "carry them with the first embed"
                )
            if dropped := got.take_dropped():
                self._take_back(voice, dropped)
            rows, mask = got.take_user()
            voice.crop()
            prefix = await self.call(
                self._model.opening_inputs, rows, mask, got.opening, got.tts, got.embeds[0], speaker
            )

            def opened() -> None:
                voice.user += rows.shape[0]

            feed = TalkerFeed(inputs=prefix, frame=True)
            # Urgent: its frame is the reply's first audio, which is being waited for;
            # other sessions' user rows, queued earlier, wait for their first tokens.
            length = prefix.shape[0]
            (*_, first) = await self.feed(voice, feed, length, lambda _: opened(), urgent=True)
            assert first is not None, "an opening makes frame 0"
            framed = first
            produced = 0
            while framed.frame is not None and not signal.aborted:
                codes, carry = framed.frame
                produced += 1
                if step is None:
                    step = await self._at_hand(voice, signal, inputs, got, carry, produced)
                following: Framed | None = None
                if step is not None and not _settled(framed):
                    # The next frame's step returns once the device has run this one's
                    # (``_step``): this frame's codec EOS flag is then at hand, and the
                    # frame after the next is queued before this one goes out, in the
                    # turn of the event loop that step's other sessions queue theirs
                    # in, so they share the next step.
                    (following,) = await step
                    step = None
                if await self._at_eos(framed) or signal.aborted:
                    return  # (aborted while the device finished the frame: not handed out)
                if following is not None and following.frame is not None:
                    _, after = following.frame
                    step = await self._at_hand(voice, signal, inputs, got, after, produced + 1)
                    if signal.aborted:
                        return
                yield {"codes": codes}
                if following is None:
                    if step is None:
                        if not await self._wait_for(signal, inputs, got, produced):
                            return
                        if self._done(got, produced):
                            return
                        step = self._frame(voice, carry, got.text(produced))
                    (following,) = await step
                    step = None
                assert following is not None, "a frame step makes a frame"
                framed = following
        except RequestClosedError:
            if not signal.aborted:
                failed = True
                raise
        except Exception:
            failed = True
            raise
        finally:
            if step is not None and not step.done():
                step.cancel()  # its forward only extends the reply's part of the slot
            voice.signal = None
            if self._sessions.get(session) is voice:
                if failed:
                    # Nothing that moves ``user`` runs now: prefills are awaited in turn.
                    voice.user, voice.reply = start, last_reply
                else:
                    voice.reply = len(got.embeds)

    async def _listen(
        self, voice: Voice, signal: AbortSignal, inputs: AsyncIterator[Fields], got: ReplyInput
    ) -> bool:
        """Read input until the first token (or the end), prefilling user rows as they
        come and dropping those the thinker takes back; False if aborted meanwhile."""
        while not got.embeds and not got.ended:
            if not await self._read(signal, inputs, got):
                return False
            if got.embeds:
                break  # what is left goes with the assistant prefix, in one forward
            if dropped := got.take_dropped():
                self._take_back(voice, dropped)
            if got.user:
                rows, mask = got.take_user()
                await self._prefill_user(voice, rows, mask)
        return not signal.aborted

    async def _at_hand(
        self,
        voice: Voice,
        signal: AbortSignal,
        inputs: AsyncIterator[Fields],
        got: ReplyInput,
        carry: torch.Tensor,
        frame: int,
    ) -> asyncio.Future[list[Framed | None]] | None:
        """Frame ``frame``'s step, queued now if its token already came (read from input
        at hand, without a turn of the event loop), else None (or aborted meanwhile).
        Queued before the last frame goes out (its routing may take turns of the event
        loop, and the step loop schedules after one), and before that frame is known
        not to be codec EOS: a frame queued past EOS only extends the reply's part of
        the slot, which the next reply drops."""
        while not got.known(frame) and not got.ended and input_at_hand(inputs):
            if not await self._read(signal, inputs, got):
                return None
        if signal.aborted or not got.known(frame) or self._done(got, frame):
            return None
        return self._frame(voice, carry, got.text(frame))

    async def _at_eos(self, framed: Framed) -> bool:
        """Whether ``framed`` is codec EOS, once its step has run on the device: where it
        has not yet, waited for on the engine's event waiter thread, without blocking
        the event loop."""
        if not _settled(framed):
            assert framed.ready is not None
            await self._readback.wait(framed.ready)
        return framed.at_eos()

    def _frame(
        self, voice: Voice, carry: torch.Tensor, text: torch.Tensor
    ) -> asyncio.Future[list[Framed | None]]:
        """The session's next frame, as a frame row of a step."""
        feed = TalkerFeed(carry=carry, text=text, frame=True)
        return self.loop.submit(voice.request, feed, 1, decode=True)

    def _speaker_id(self, options: ResponseOptions) -> int:
        name = (options.voice or self.speaker).lower()
        speakers = self._model.speakers
        if name not in speakers:
            raise TalkerInputError(
                f"unknown voice {options.voice!r}: the checkpoint's voices are "
                f"{', '.join(sorted(speakers))}"
            )
        return speakers[name]

    def _done(self, got: ReplyInput, produced: int) -> bool:
        if produced >= self.max_frames:
            return True
        per_token = self.frames_per_token
        return per_token is not None and got.ended and produced >= per_token * len(got.embeds)

    async def _wait_for(
        self, signal: AbortSignal, inputs: AsyncIterator[Fields], got: ReplyInput, frame: int
    ) -> bool:
        """Read input until frame ``frame``'s text is known; False if aborted meanwhile."""
        while not got.known(frame):
            if not await self._read(signal, inputs, got):
                return False
        return not signal.aborted

    @staticmethod
    async def _read(signal: AbortSignal, inputs: AsyncIterator[Fields], got: ReplyInput) -> bool:
        """Take the next input (or the input's end) into ``got``; False if aborted."""
        fields = await signal.next_input(inputs)
        if signal.aborted:
            return False
        if fields is None:
            got.ended = True
        else:
            got.take(fields)
        return True

    async def truncate(self, session: str, kept: int) -> int:
        """Keep the first ``kept`` frames of the last reply: the tokens they depend on.

        Frame ``k`` is conditioned on tokens ``0 .. k`` (capped at the reply's last), so
        ``kept`` frames depend on ``min(kept, N)`` tokens. The talker's own state holds
        no reply (only user turns), so only what later truncations cap at changes.

        Raises:
            ValueError: the session has no reply to truncate, or ``kept`` is negative.
        """
        voice = self._sessions.get(session)
        if voice is None or voice.reply is None:
            raise ValueError(f"talker session {session!r} has no reply to truncate")
        if kept < 0:
            raise ValueError(f"cannot keep {kept} frames; pass 0 or more")
        voice.reply = min(kept, voice.reply)
        return voice.reply


def _settled(framed: Framed) -> bool:
    """Whether ``framed``'s step has run on the device (its codec EOS flag is known)."""
    return framed.ready is None or framed.ready.query()
