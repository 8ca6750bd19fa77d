"""``VllmThinkerEngine``: a conversation's thinker on vLLM, prefilling as input arrives.

The ``vllm`` engine kind. It serves the thinker stage of an omni pipeline with vLLM's
``AsyncLLM`` inside the stage's own worker process (vLLM starts its EngineCore as a
child of that process, in the worker's process group, which the pipeline reaps whatever
way the worker ends). It takes and yields the fields of tiny-omni's torch thinker, so
the same talker follows either: text tokens with their input embeddings, the user
turns' rows, and per reply the assistant opening and the TTS embeddings. The
conversation (one open vLLM request per session, rollbacks that reopen it, replay,
instructions) is :class:`~.engine.VllmConversationEngine`'s, which a text LLM on vLLM
shares; what the thinker adds is below.

**Rows out.** The talker's inputs for text positions and generated tokens are rows of
the thinker's input-embedding table, read once from the checkpoint (:mod:`.embedding`).

**Audio in, hidden states out.** A clip is heard as it arrives: each time a whole
audio-encoder window (8 s) of it is in, the window is sent to vLLM as one placeholder
and its log-mel features (vLLM's audio encoder expands it) and prefilled at once; when
the clip ends only its last, partial window is left to send (:mod:`.audio_input`, which
also says how the windows are framed). The talker's rows at the placeholders are the
thinker's hidden states there, which a worker extension keeps in vLLM's worker and the
engine takes once each window is prefilled (:mod:`.hidden_states`).

**Rows ahead of the commit.** The talker's rows of the open user turn go as they become
final, after each chunk (``Response.ahead``, with ``user_edits``): text positions once
prefilled, a window's once its states are taken (:meth:`~.conversation.History.unsent`),
so the talker prefills the turn while it is spoken and the commit sends only its end
(``<|im_end|> \\n`` and what was not prefilled yet). A ``clear`` takes back the rows
sent; a response closed at rows of its open turn sent ahead leaves the turn committed
without a reply (its rows are the talker's). A truncation is refused while a turn is
open and every other cut drops the open turn, so the rows sent are never recomputed
behind another prefix.

A pipeline names the checkpoint by path (``model: /models/Qwen3-Omni-30B-A3B-Instruct``)
or by a prepared model family (``model: tiny-omni``: its ``checkpoint`` directory in the
cache, at the stage's ``seed`` and ``cache_dir``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from omni_actors.actors.engines.contract import TURN_FIELD, Fields, Rule
from omni_actors.actors.engines.conversation import Outcome, Response
from omni_actors.actors.engines.rows_ahead import RowsAhead
from omni_actors.actors.engines.thinker_ports import THINKER_INPUTS, THINKER_OUTPUTS
from omni_actors.actors.engines.torch_engine import AbortSignal
from omni_actors.actors.engines.vllm.args import VllmThinkerArgs
from omni_actors.actors.engines.vllm.audio_input import AudioSpec, ClipStream, user_rows
from omni_actors.actors.engines.vllm.conversation import Clip, Mark, VllmInputError
from omni_actors.actors.engines.vllm.embedding import load_input_embeddings
from omni_actors.actors.engines.vllm.engine import ConversationResponse, VllmConversationEngine
from omni_actors.actors.engines.vllm.hidden_states import tap_engine_args
from omni_actors.actors.engines.vllm.runtime import EngineDiedError, resolve_checkpoint
from omni_actors.actors.engines.vllm.session import Session
from omni_actors.errors import EngineError, MissingExtraError
from omni_actors.models.files import read_json

__all__ = ["EngineDiedError", "VllmInputError", "VllmThinkerArgs", "VllmThinkerEngine"]

log = logging.getLogger(__name__)

if importlib.util.find_spec("vllm") is None:  # vLLM itself is imported where it runs
    raise MissingExtraError("the vllm engine", "vllm", ModuleNotFoundError(name="vllm"))


class VllmThinkerEngine(VllmConversationEngine):
    """A thinker on vLLM with streaming prefill (see the module docstring).

    Inputs per chunk: ``text`` (str), ``instructions`` (str), or a turn mark (a
    ``reply`` mark's ``reply``: a 1-D integer tensor of token ids). Outputs, as
    tiny-omni's torch thinker: per token ``token_ids`` [1] int64, ``text`` (what the token
    adds to the reply's text) and ``embed`` [1, H]; with the first token
    ``opening`` [3, H] and ``tts`` [3, H]; per user turn, as its positions are
    prefilled, ``user`` [n, H] and ``user_mask`` [n] bool (True at audio placeholders,
    whose rows are hidden states) with ``user_edits``.
    Input ``audio``: float mono samples at the checkpoint processor's rate (16 kHz).
    """

    kind: ClassVar[str] = "vllm"
    Args: ClassVar[type[VllmThinkerArgs]] = VllmThinkerArgs
    inputs: ClassVar[Mapping[str, Rule]] = THINKER_INPUTS
    outputs: ClassVar[Mapping[str, Rule]] = THINKER_OUTPUTS
    args: VllmThinkerArgs

    # -- life cycle ------------------------------------------------------------------------

    def _checkpoint(self) -> Path:
        return resolve_checkpoint(self.args.model, self.args.cache_dir, self.args.seed)

    async def _load(self, path: Path) -> None:
        """The audio front end's settings and the input-embedding table."""
        config = read_json(path / "config.json")
        processor = read_json(path / "processor_config.json")
        self.audio = AudioSpec.of(self.tokenizer, config, processor)
        self.placeholder = self.audio.ids[1]
        self.extractor = self.audio.extractor()
        tts = [config[f"tts_{name}_token_id"] for name in ("bos", "eos", "pad")]
        self.embeddings = await asyncio.to_thread(load_input_embeddings, path)
        self.vocab_size = len(self.embeddings)
        self.opening = self.embeddings[list(self.turns.opening)]
        self.tts = self.embeddings[tts]

    def _engine_args(self) -> dict[str, Any]:
        if not self.args.engine_args.get("enable_mm_embeds", True):
            raise EngineError(
                "engine_args.enable_mm_embeds must stay on: the vllm thinker sends audio as "
                "log-mel features"
            )
        return {
            **tap_engine_args(self.args.engine_args, self.audio.accept_layer),
            # Audio goes in as log-mel features (audio_input), an input vLLM takes
            # only with this on; prompts are built here, never by the caller.
            "enable_mm_embeds": True,
        }

    async def _started(self) -> None:
        await self._llm.collective_rpc("omni_tap_install", args=(self.audio.ids[1],))

    def _new_session(self) -> Session:
        return Session(ClipStream(self.audio, self.extractor))

    def _response(self, session: str, state: Session, signal: AbortSignal) -> Response[Mark]:
        return _Response(self, session, state, signal)

    # -- helpers ---------------------------------------------------------------------------

    async def _hear(self, session: str, state: Session, clips: list[Clip]) -> None:
        """``clips`` (windows of the clip being received) join the turn, prefilled now."""
        for clip in clips:
            state.history.hear(clip, self.turns, self.audio.ids)
        if clips:
            await self._prefill(session, state)


class _Response(ConversationResponse[VllmThinkerEngine]):
    """One response of the vLLM thinker: the conversation's steps, with the session's
    clip being received and the talker's rows of each user turn."""

    def __init__(
        self, engine: VllmThinkerEngine, session: str, state: Session, signal: AbortSignal
    ) -> None:
        super().__init__(engine, session, state, signal)
        assert state.clip is not None, "a thinker's session receives audio"
        self.clip = state.clip

    # -- input ------------------------------------------------------------------------

    async def before_input(self, fields: Fields) -> None:
        engine, state = self.engine, self.state
        if "audio" in fields:
            # The windows this made whole are sent now, while the clip goes on.
            await engine._hear(self.session, state, self.clip.push(fields["audio"]))
            if len(fields) == 1:
                return
        if fields.get(TURN_FIELD) == "clear":
            self.clip.drop()  # windows sent already go with the cleared turn
        else:  # anything else ends the clip: what is left of it joins the turn now
            await engine._hear(self.session, state, self.clip.end())

    # -- marks ------------------------------------------------------------------------

    async def commit(self) -> Fields | None:
        committed = self.history.commit(self.turns)
        if committed is None:
            return None
        rows, ahead = committed
        return self._send_rows(rows, ahead)

    def ahead(self) -> Fields | None:
        history = self.history
        return self._send_rows(history.unsent(self.state.fed), history.ahead)

    def _send_rows(self, rows: range, ahead: RowsAhead) -> Fields | None:
        """The output sending the talker's rows at ``rows`` (none if empty), counted by
        ``ahead`` (with what it takes back first)."""
        if not rows:
            return ahead.output(None, None)
        out = user_rows(self.history, rows, self.engine.embeddings)
        return ahead.output(out["user"], out["user_mask"])

    # -- the reply --------------------------------------------------------------------

    async def before_reply(self) -> None:
        await self.engine._hear(self.session, self.state, self.clip.end())

    def token_fields(self, token: int, first: bool) -> Fields:
        engine = self.engine
        out: dict[str, torch.Tensor | str] = {"embed": engine.embeddings[token][None]}
        if first:
            out["opening"] = engine.opening
            out["tts"] = engine.tts
        return out

    # -- settling ---------------------------------------------------------------------

    def end(self) -> None:
        super().end()
        # What is left of a clip not ended by the end of the response is not heard
        # (its windows sent already are in the open turn).
        self.clip.drop()

    async def finish(self, outcome: Outcome) -> Outcome:
        if outcome == "cancelled" and not self.decoding and self.history.turn_start is not None:
            # Closed at rows of the open turn sent ahead: they are the talker's now, so
            # the turn stays, committed without a reply (the rows of its end not sent).
            self.history.commit(self.turns)
        return await super().finish(outcome)
