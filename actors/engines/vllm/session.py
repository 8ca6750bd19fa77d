"""``Session``: one conversation on the vLLM thinker and the request that holds it.

The conversation is a token list (:class:`~.conversation.History`); the request is one
vLLM streaming request (:class:`~.request.OpenRequest`) holding its first :attr:`fed`
tokens. :meth:`Session.send` sends what the request lacks, opening a new request over
the whole list when a cut left the open one holding tokens the list no longer has.
"""

from __future__ import annotations

import asyncio
from typing import Any

from omni_actors.actors.engines.torch_engine import AbortSignal
from omni_actors.actors.engines.vllm.audio_input import ClipStream, audio_items
from omni_actors.actors.engines.vllm.conversation import Clip, History
from omni_actors.actors.engines.vllm.hidden_states import take_states
from omni_actors.actors.engines.vllm.request import Chunk, OpenRequest, RequestEndedError
from omni_actors.errors import EngineError

__all__ = ["Session"]


class Session:
    """One conversation: its token list, its open request and the response running."""

    def __init__(self, clip: ClipStream | None = None) -> None:
        self.history = History()
        self.request: OpenRequest | None = None
        self.fed = 0
        """Tokens of ``history`` the open request holds (0 with none open)."""
        self.signal: AbortSignal | None = None
        """The running response's, if one runs."""
        self.decoded: tuple[int, ...] | None = None
        """The reply the last response decoded, as far as it was yielded; None when it
        decoded none, failed or still runs (``VllmThinkerEngine.last_reply``)."""
        self.clip = clip
        """The clip being received (None: the engine takes no audio)."""
        self.sent: list[Clip] = []
        """Clips of the chunk in flight: their states are taken once it was prefilled."""

    def resync(self) -> OpenRequest | None:
        """After a cut: forget a request holding tokens the list no longer has (returned,
        for the caller to abort); the next chunk opens one with the whole conversation."""
        stale = None
        if self.history.low_water < self.fed:
            stale, self.request, self.fed = self.request, None, 0
        self.history.synced()
        return stale

    def send(
        self, llm: Any, request_id: str, placeholder: int | None, sampling: Any
    ) -> OpenRequest:
        """Send what the open request lacks of the list, under ``sampling``; a new request
        named ``request_id`` if none is open (call :meth:`resync` first). ``placeholder``:
        the audio placeholder id (None: the list holds no clips)."""
        clips: list[Clip] = []
        if placeholder is None:
            ids = self.history.tokens[self.fed :]
        else:
            ids, clips = self.history.sent_form(self.fed, placeholder)
        items = audio_items(clips) if clips else None
        chunk = Chunk(ids, sampling, items, tuple(clip.uuid for clip in clips))
        if self.request is None:
            self.request = OpenRequest(llm, request_id, chunk)
        else:
            self.request.send(chunk)
        self.fed = len(self.history.tokens)
        self.sent = clips
        return self.request

    async def output(self, request: OpenRequest, died: asyncio.Future[BaseException] | None) -> Any:
        """``request``'s next output; None once the session was aborted.

        Args:
            request: the session's open request.
            died: resolves when vLLM's engine process exits (the runtime's).

        Raises:
            EngineDiedError: vLLM's engine process exited (what ``died`` holds).
            EngineError: vLLM ended the request otherwise.
        """
        signal = self.signal
        read = asyncio.ensure_future(request.output())
        waits: list[asyncio.Future[Any]] = [read]
        if died is not None:
            waits.append(died)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not read.done():
                read.cancel()
        if died is not None and died.done() and not read.done():
            raise died.result()
        try:
            return read.result()
        except RequestEndedError as exc:
            self.request, self.fed = None, 0
            if signal is not None and signal.aborted:
                return None
            raise EngineError(f"vLLM ended the request: {exc.__cause__ or exc}") from exc

    async def take_states(self, llm: Any, request: OpenRequest) -> None:
        """After a chunk with clips was prefilled: the new clips' hidden states.

        Raises:
            EngineError: vLLM's worker kept fewer rows than the new clips have
                placeholders.
        """
        sent, self.sent = self.sent, []
        if not sent:
            return
        rows = await take_states(llm, request.request_id)
        new = [clip for clip in sent if clip.states is None]
        needed = sum(clip.count for clip in new)
        got = 0 if rows is None else rows.shape[0]
        if got < needed:
            raise EngineError(f"vLLM kept {got} hidden states for {needed} audio positions")
        if rows is None or not new:
            return  # clips sent again after a reopen: drained, not needed
        at = got - needed  # new clips are the list's last; earlier rows were recomputed
        for clip in new:
            clip.states, at = rows[at : at + clip.count], at + clip.count

    async def end_request(self, *, abort: bool, timeout: float) -> None:
        """End the open request: aborted now, or closed (aborted after ``timeout``)."""
        request, self.request, self.fed = self.request, None, 0
        if request is None:
            return
        if abort:
            await request.abort()
        else:
            await request.close(timeout)
