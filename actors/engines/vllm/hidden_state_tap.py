"""The worker side of the hidden-state tap: the tapped thinker model and the worker extension.

This module runs inside vLLM's worker: vLLM imports it there (by the qualified name
:data:`~.hidden_states.TAP_EXTENSION`) before it builds and compiles the model, and the
import registers :class:`TappedThinker` under :data:`~.hidden_states.TAP_ARCHITECTURE`,
the architecture the engine's ``hf_overrides`` names. The engine's process imports it
too (:func:`~.hidden_states.tap_engine_args`), where vLLM resolves the architecture.

Why a model class and not a hook: vLLM compiles the language model on its first forward
(Dynamo traces once and later calls skip its guards) and on a GPU replays CUDA graphs
captured at start, so a forward hook put on a layer after start never runs, and host
work inside the forward cannot run under a graph. So the tap is in place before the
compile, and its forward does device work only:

- :class:`TappedThinker` asks its language model for the state after the tapped layer
  (``aux_hidden_state_layers``, how vLLM's own models hand EAGLE-3 its hidden states:
  traced into the compiled graph) and copies it into a buffer allocated at build time,
  ``[max_num_batched_tokens, H]``. A captured graph writes the same buffer.
- After the forward, in the same step, ``compute_logits`` (which vLLM calls eagerly,
  outside the compiled region and any graph) hands the buffer to :class:`HiddenStateTap`,
  which keeps, per request, the rows at the audio placeholder id. Which rows those are
  it reads from the runner's host-side copy of the step's token ids, so it keeps device
  slices of the buffer (copies queued after the forward, before the next one) with no
  wait on the device; steps without audio (every decode step) cost one host comparison.
- The engine takes a request's rows with ``collective_rpc("omni_tap_take", ...)`` once
  the chunk holding a clip was prefilled; the copy to the host happens there, after the
  step.

What it leans on beyond vLLM's public API: the runner's ``input_batch.req_ids``,
``query_start_loc`` and ``input_ids`` host buffers (to map rows to requests), the
language model's ``aux_hidden_state_layers`` (vLLM's EAGLE-3 hook in its Qwen models),
and ``compute_logits`` being called once per step after the forward (it is, for every
step that samples; prompt logprobs, which would call it twice, are never requested).

Rows that nobody takes (a clip prefilled again after a reopen whose prefix left vLLM's
cache) are dropped as soon as their request is no longer in the runner, so the tap's
memory is bounded by the live requests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from vllm.model_executor.models.qwen3_omni_moe_thinker import (
    Qwen3OmniMoeThinkerForConditionalGeneration,
)

from omni_actors.actors.engines.vllm.hidden_states import TAP_ARCHITECTURE, TAP_CONFIG

__all__ = ["HiddenStateTap", "TappedThinker", "register"]

_SUFFIX = 9
"""vLLM appends ``-`` and 8 random characters to a request id (its internal id)."""


def _owns(internal: str, request_id: str) -> bool:
    return internal == request_id or (
        len(internal) == len(request_id) + _SUFFIX and internal.startswith(f"{request_id}-")
    )


class TappedThinker(Qwen3OmniMoeThinkerForConditionalGeneration):  # type: ignore[no-untyped-call]
    """vLLM's Qwen3-Omni thinker that also writes one layer's states into a buffer.

    The layer is ``additional_config[TAP_CONFIG]["layer"]`` (1-based:
    ``hidden_states[layer]`` in transformers' numbering), set before vLLM compiles.
    """

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        tap = (vllm_config.additional_config or {}).get(TAP_CONFIG)
        if not isinstance(tap, dict):
            raise ValueError(f"{TAP_ARCHITECTURE} needs additional_config[{TAP_CONFIG!r}]")
        model = self.language_model.model
        layer = tap["layer"]
        if not 1 <= layer <= len(model.layers):
            raise ValueError(f"accept_hidden_layer {layer} is not in 1..{len(model.layers)}")
        model.aux_hidden_state_layers = (layer,)
        rows = vllm_config.scheduler_config.max_num_batched_tokens
        hidden = vllm_config.model_config.get_hidden_size()
        # Built under vLLM's device and dtype context: on the model's device, in its dtype.
        self.omni_tap_buffer = torch.zeros(rows, hidden, dtype=vllm_config.model_config.dtype)
        self.omni_tap_keep: Callable[[torch.Tensor], None] | None = None
        """Set by :meth:`HiddenStateTap.omni_tap_install`; None until then (warm-up)."""

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> Any:
        out = super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
        if not isinstance(out, tuple):
            return out  # pipeline parallelism's intermediate tensors: no final state here
        hidden, (state,) = out
        self.omni_tap_buffer[: state.shape[0]].copy_(state)
        return hidden

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        if self.omni_tap_keep is not None:
            self.omni_tap_keep(self.omni_tap_buffer)  # after the forward, before the next
        logits: torch.Tensor | None = super().compute_logits(hidden_states)
        return logits


class HiddenStateTap:
    """vLLM worker extension: keeps, per request, the tapped rows at audio positions.

    Methods are prefixed ``omni_`` because vLLM refuses an extension whose names clash
    with its worker's.
    """

    model_runner: Any
    _omni_rows: dict[str, list[torch.Tensor]]

    def omni_tap_install(self, token_id: int) -> None:
        """Keep, from each step on, the tapped states at positions holding ``token_id``.

        Raises:
            TypeError: the model is not a :class:`TappedThinker` (the engine's
                ``hf_overrides`` did not name :data:`TAP_ARCHITECTURE`).
        """
        runner = self.model_runner
        model = runner.get_model()
        if not isinstance(model, TappedThinker):
            raise TypeError(f"vLLM built {type(model).__name__}, not {TAP_ARCHITECTURE}")
        self._omni_rows = {}
        rows = self._omni_rows

        def keep(buffer: torch.Tensor) -> None:
            if rows:
                for request in [r for r in rows if r not in runner.requests]:
                    del rows[request]  # ended with rows nobody took
            n = runner.input_batch.num_reqs
            starts = runner.query_start_loc.cpu[: n + 1].tolist()
            at = runner.input_ids.cpu[: starts[-1]] == token_id  # host memory: no wait
            if not bool(at.any()):
                return  # a step with no audio (every decode step): nothing to keep
            for i, request in enumerate(runner.input_batch.req_ids[:n]):
                runs = _runs(at, starts[i], starts[i + 1])
                if runs:
                    kept = torch.cat([buffer[a:b] for a, b in runs])  # queued on the device
                    rows.setdefault(request, []).append(kept)

        model.omni_tap_keep = keep

    def omni_tap_take(self, request_id: str) -> tuple[list[int], bytes] | None:
        """The rows kept for ``request_id`` since the last take, in position order:
        ``(shape, float32 bytes)``, or None if there are none."""
        taken: list[torch.Tensor] = []
        for internal in [r for r in self._omni_rows if _owns(r, request_id)]:
            taken.extend(self._omni_rows.pop(internal))
        if not taken:
            return None
        rows = torch.cat(taken).float().cpu().contiguous()
        return list(rows.shape), rows.numpy().tobytes()


def _runs(at: torch.Tensor, start: int, stop: int) -> list[tuple[int, int]]:
    """The ``[a, b)`` runs of True in ``at[start:stop]`` (audio placeholders come in runs,
    one per encoder window), as positions of the step."""
    found = (torch.nonzero(at[start:stop]).flatten() + start).tolist()
    runs: list[tuple[int, int]] = []
    for position in found:
        if runs and runs[-1][1] == position:
            runs[-1] = (runs[-1][0], position + 1)
        else:
            runs.append((position, position + 1))
    return runs


def register() -> None:
    """Register :class:`TappedThinker` with vLLM under :data:`TAP_ARCHITECTURE`.

    Idempotent; runs on import, which is how vLLM's worker gets it."""
    from vllm import ModelRegistry

    ModelRegistry.register_model(TAP_ARCHITECTURE, TappedThinker)


register()
