"""``OpenRequest``: one vLLM request that stays open while a conversation goes on.

vLLM takes a request's prompt as an async generator of chunks (``StreamingInput``): each
chunk is appended to what the request holds and generated under its own
``SamplingParams``, and the request waits between chunks until the generator ends. A
conversation keeps one such request per session, so every turn is prefilled once, as it
arrives, and the KV cache of the conversation stays where it is between responses.

One chunk is outstanding at a time: a chunk is sent once the one before has produced
its last output. vLLM merges delta outputs that its reader has not taken yet, so with
two chunks in flight the outputs of one could not be told from the next one's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Chunk", "OpenRequest", "RequestEndedError"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of a request's prompt.

    Attributes:
        token_ids: the ids to append, one placeholder per audio item.
        sampling: vLLM ``SamplingParams`` of what the chunk generates.
        audio: vLLM's audio items, in placeholder order (the multimodal data's
            ``audio`` entry), or None.
        uuids: the items' identities for vLLM's caches.
    """

    token_ids: list[int]
    sampling: Any
    audio: Mapping[str, Any] | None = None
    uuids: tuple[str, ...] = ()


class RequestEndedError(RuntimeError):
    """The request ended (closed, aborted or failed) while a chunk waited on it."""


class OpenRequest:
    """A vLLM streaming request fed chunk by chunk (see the module docstring).

    Args:
        llm: the ``AsyncLLM``.
        request_id: unique among the engine's requests.
        first: the first chunk's ``(token_ids, sampling_params)``.
    """

    def __init__(self, llm: Any, request_id: str, first: Chunk) -> None:
        self.llm = llm
        self.request_id = request_id
        self._inputs: asyncio.Queue[Any] = asyncio.Queue()
        self._outputs: asyncio.Queue[Any] = asyncio.Queue()
        self._ended: BaseException | None = None
        self._send(first)
        self._task = asyncio.get_running_loop().create_task(
            self._run(first.sampling), name=f"vllm request {request_id}"
        )

    def _send(self, chunk: Chunk) -> None:
        from vllm.engine.protocol import StreamingInput
        from vllm.inputs import TokensPrompt

        prompt: Any = TokensPrompt(prompt_token_ids=chunk.token_ids)
        if chunk.audio is not None:
            # vLLM expands each placeholder to the item's encoder outputs; the uuids
            # name the items for its caches.
            prompt["multi_modal_data"] = {"audio": chunk.audio}
            prompt["multi_modal_uuids"] = {"audio": list(chunk.uuids)}
        self._inputs.put_nowait(StreamingInput(prompt, chunk.sampling))

    def send(self, chunk: Chunk) -> None:
        """Append ``chunk`` and generate under its sampling (after the last chunk ended).

        Raises:
            RequestEndedError: the request has ended.
        """
        if self._ended is not None or self._task.done():
            raise RequestEndedError(f"vLLM request {self.request_id} has ended") from self._ended
        self._send(chunk)

    async def output(self) -> Any:
        """The next ``RequestOutput`` (delta) of the current chunk.

        Raises:
            RequestEndedError: the request ended; its cause is chained.
        """
        item = await self._outputs.get()
        if isinstance(item, BaseException):
            self._outputs.put_nowait(item)  # every later call sees the end too
            raise RequestEndedError(f"vLLM request {self.request_id} ended") from item
        return item

    async def _feed(self) -> AsyncIterator[Any]:
        while (chunk := await self._inputs.get()) is not None:
            yield chunk

    async def _run(self, sampling: Any) -> None:
        try:
            async for out in self.llm.generate(self._feed(), sampling, self.request_id):
                self._outputs.put_nowait(out)
            end: BaseException = RequestEndedError("finished")
        except asyncio.CancelledError:
            end = RequestEndedError("cancelled")
            raise
        except Exception as exc:
            end = exc
        finally:
            self._ended = end
            self._outputs.put_nowait(end)

    async def close(self, timeout: float) -> None:
        """End the request: no more chunks; wait (up to ``timeout``) until vLLM let it go."""
        self._inputs.put_nowait(None)
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._task)
        except TimeoutError:
            log.warning(
                "vLLM request %s did not end in %.1fs; aborting it", self.request_id, timeout
            )
            await self.abort()
        except Exception:
            pass  # a failed request is over too

    async def abort(self) -> None:
        """Stop the request now: vLLM frees it; a waiting :meth:`output` raises."""
        if not self._task.done():
            self._task.cancel()  # generate() aborts the request in vLLM as it unwinds
            with contextlib.suppress(BaseException):
                await self._task
        with contextlib.suppress(Exception):
            await self.llm.abort(self.request_id)
