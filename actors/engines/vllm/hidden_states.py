"""The thinker's hidden states at audio positions, read out of vLLM's worker.

The talker reads, at each audio placeholder of a user turn, the thinker's hidden state
after its ``accept_hidden_layer``-th decoder layer (text positions use the token's input
embedding, which the engine has itself). vLLM returns sampled tokens only, so the state
is taken where the model runs, by a tap that is part of the model vLLM compiles (its
worker side, and why it must be so: :mod:`.hidden_state_tap`):

- :func:`tap_engine_args` are the engine arguments that put it there: the worker
  extension (vLLM's ``worker_extension_cls``, a public setting), the tapped model's
  architecture (``hf_overrides``) and the tapped layer (``additional_config``, which
  vLLM's compile cache key includes, so a graph compiled without the tap is never
  reused).
- After start, the engine calls ``collective_rpc("omni_tap_install", ...)`` to name the
  audio placeholder id, and ``collective_rpc("omni_tap_take", ...)`` (:func:`take_states`)
  once the chunk holding a clip was prefilled, to get that request's rows as raw bytes
  (vLLM's RPC codec would turn a tensor into nested lists).

Cost: one ``[n, H]`` copy into a preallocated buffer per forward; per step with audio,
device copies of the audio rows; one RPC per clip.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import torch

from omni_actors.errors import EngineError

__all__ = ["TAP_ARCHITECTURE", "TAP_CONFIG", "TAP_EXTENSION", "take_states", "tap_engine_args"]

_WORKER_SIDE: Final = "omni_actors.actors.engines.vllm.hidden_state_tap"

TAP_EXTENSION: Final = f"{_WORKER_SIDE}.HiddenStateTap"
"""The qualified name vLLM's ``worker_extension_cls`` takes."""

TAP_ARCHITECTURE: Final = "OmniActorsTappedQwen3OmniThinker"
"""The architecture the tapped thinker is registered under in vLLM's model registry."""

TAP_CONFIG: Final = "omni_actors_hidden_state_tap"
"""The key of ``additional_config`` that holds the tapped layer."""


def tap_engine_args(engine_args: Mapping[str, Any], layer: int) -> dict[str, Any]:
    """The engine arguments that build vLLM's thinker with the tap on ``layer`` (1-based:
    ``hidden_states[layer]`` in transformers' numbering), merged into ``engine_args``'s
    own ``hf_overrides`` and ``additional_config``.

    Registers the tapped model in this process's vLLM model registry (vLLM's worker
    registers it when it imports the extension).

    Raises:
        EngineError: ``engine_args`` sets one of these itself.
    """
    import importlib

    extension = engine_args.get("worker_extension_cls", TAP_EXTENSION)
    if extension != TAP_EXTENSION:
        raise EngineError(
            f"engine_args.worker_extension_cls is taken by the vllm thinker's hidden-state "
            f"tap ({TAP_EXTENSION})"
        )
    overrides = engine_args.get("hf_overrides") or {}
    if not isinstance(overrides, Mapping) or "architectures" in overrides:
        raise EngineError(
            "engine_args.hf_overrides must be a mapping without 'architectures': the vllm "
            f"thinker's hidden-state tap sets the architecture ({TAP_ARCHITECTURE})"
        )
    additional = engine_args.get("additional_config") or {}
    if not isinstance(additional, Mapping) or TAP_CONFIG in additional:
        raise EngineError(
            f"engine_args.additional_config must be a mapping without {TAP_CONFIG!r}: the "
            "vllm thinker's hidden-state tap sets it"
        )
    importlib.import_module(_WORKER_SIDE)  # registers the tapped model here
    return {
        "worker_extension_cls": TAP_EXTENSION,
        "hf_overrides": {**overrides, "architectures": [TAP_ARCHITECTURE]},
        "additional_config": {**additional, TAP_CONFIG: {"layer": layer}},
    }


async def take_states(llm: Any, request_id: str) -> torch.Tensor | None:
    """The audio rows vLLM's worker kept for ``request_id`` (see the module docstring)."""
    replies = await llm.collective_rpc("omni_tap_take", args=(request_id,))
    reply = replies[0]
    if reply is None:
        return None
    shape, data = reply
    return torch.frombuffer(bytearray(data), dtype=torch.float32).view(*shape)
