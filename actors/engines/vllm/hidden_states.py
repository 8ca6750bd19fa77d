"""The thinker's hidden states at audio positions, read out of vLLM's worker.

The talker reads, at each audio placeholder of a user turn, the thinker's hidden state
after its ``accept_hidden_layer``-th decoder layer (text positions use the token's input
embedding, which the engine has itself). vLLM returns sampled tokens only, so the state
is taken where the model runs:

- :class:`HiddenStateTap` is a *worker extension* (vLLM's ``worker_extension_cls``, a
  public setting): vLLM mixes it into its worker class, in its worker process. Its
  :meth:`~HiddenStateTap.omni_tap_install` puts a forward hook on that decoder layer,
  which keeps, for each request in the step, the rows of the positions holding the audio
  placeholder id (vLLM's runner lays the step's tokens out request by request).
- The engine calls ``collective_rpc("omni_tap_take", ...)`` (public too) once the chunk
  holding a clip was prefilled, and gets that request's rows as raw bytes (vLLM's RPC
  codec would turn a tensor into nested lists).

Cost: the hook copies only audio rows (one ``[n, H]`` slice per clip), and one RPC per
clip. What it leans on beyond vLLM's public API: the runner's ``input_batch.req_ids``,
``query_start_loc`` and ``input_ids`` buffers (to map rows to requests), and decoder
layers that return ``(hidden, residual)``, as vLLM's Qwen models do.

Rows that nobody takes (a clip prefilled again after a reopen whose prefix left vLLM's
cache) are dropped as soon as their request is no longer in the runner, so the tap's
memory is bounded by the live requests.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

__all__ = ["TAP_EXTENSION", "HiddenStateTap", "take_states"]

log = logging.getLogger(__name__)

TAP_EXTENSION = f"{__name__}.HiddenStateTap"
"""The qualified name vLLM's ``worker_extension_cls`` takes."""

_SUFFIX = 9
"""vLLM appends ``-`` and 8 random characters to a request id (its internal id)."""


def _owns(internal: str, request_id: str) -> bool:
    return internal == request_id or (
        len(internal) == len(request_id) + _SUFFIX and internal.startswith(f"{request_id}-")
    )


class HiddenStateTap:
    """vLLM worker extension: a hook that keeps audio rows of one decoder layer.

    Methods are prefixed ``omni_`` because vLLM refuses an extension whose names clash
    with its worker's.
    """

    model_runner: Any
    _omni_rows: dict[str, list[torch.Tensor]]

    def omni_tap_install(self, layer: int, token_id: int) -> None:
        """Keep the state after decoder layer ``layer`` (1-based: ``hidden_states[layer]``
        in transformers' numbering) at positions holding ``token_id``."""
        runner = self.model_runner
        model = runner.get_model()
        layers = model.get_language_model().model.layers
        if not 1 <= layer <= len(layers):
            raise ValueError(f"accept_hidden_layer {layer} is not in 1..{len(layers)}")
        self._omni_rows = {}
        rows = self._omni_rows

        def keep(_module: torch.nn.Module, _args: Any, out: Any) -> None:
            hidden, residual = out if isinstance(out, tuple) else (out, None)
            state = hidden if residual is None else hidden + residual
            batch = runner.input_batch
            n = batch.num_reqs
            starts = runner.query_start_loc.cpu[: n + 1].tolist()
            ids = runner.input_ids.cpu[: starts[-1]]
            if rows:
                for request in [r for r in rows if r not in runner.requests]:
                    del rows[request]  # ended with rows nobody took
            if not bool((ids == token_id).any()):
                return  # a step with no audio (every decode step): nothing to keep
            for i, request in enumerate(batch.req_ids[:n]):
                at = ids[starts[i] : starts[i + 1]] == token_id
                if bool(at.any()):
                    kept = state[starts[i] : starts[i + 1]][at.to(state.device)]
                    rows.setdefault(request, []).append(kept.detach().float().cpu())

        layers[layer - 1].register_forward_hook(keep)

    def omni_tap_take(self, request_id: str) -> tuple[list[int], bytes] | None:
        """The rows kept for ``request_id`` since the last take, in position order:
        ``(shape, float32 bytes)``, or None if there are none."""
        taken: list[torch.Tensor] = []
        for internal in [r for r in self._omni_rows if _owns(r, request_id)]:
            taken.extend(self._omni_rows.pop(internal))
        if not taken:
            return None
        rows = torch.cat(taken).contiguous()
        return list(rows.shape), rows.numpy().tobytes()


async def take_states(llm: Any, request_id: str) -> torch.Tensor | None:
    """The audio rows vLLM's worker kept for ``request_id`` (see the module docstring)."""
    replies = await llm.collective_rpc("omni_tap_take", args=(request_id,))
    reply = replies[0]
    if reply is None:
        return None
    shape, data = reply
    return torch.frombuffer(bytearray(data), dtype=torch.float32).view(*shape)
