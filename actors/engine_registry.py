"""Engines by kind: the one place a pipeline's ``engine.kind`` becomes an object."""

from __future__ import annotations

from typing import Any

from omni_actors.actors.engine import Engine
from omni_actors.errors import OmniError

__all__ = ["EngineUnavailableError", "build_engine"]


class EngineUnavailableError(OmniError):
    """A pipeline names an engine kind this installation cannot run, or bad arguments."""


def build_engine(kind: str, args: dict[str, Any]) -> Engine:
    """Construct the engine of ``kind`` from a stage's ``engine.args``.

    Raises:
        EngineUnavailableError: unknown kind, a kind not available yet, or arguments the
            engine rejects (the message names them).
    """
    if kind == "scripted":
        from omni_actors.actors.scripted import ScriptedEngine

        try:
            return ScriptedEngine(**args)
        except (TypeError, ValueError) as exc:
            raise EngineUnavailableError(f"scripted engine args {args!r}: {exc}") from None
    if kind == "torch":
        try:
            from omni_actors.actors.tiny_omni.engines import build_torch_engine
        except ImportError as exc:
            raise EngineUnavailableError(
                f"engine kind 'torch' needs transformers ({exc}); install omni-actors again"
            ) from None
        try:
            return build_torch_engine(args)
        except (TypeError, ValueError) as exc:
            raise EngineUnavailableError(f"torch engine args {args!r}: {exc}") from None
    if kind == "vllm":
        raise EngineUnavailableError(
            "engine kind 'vllm' is not available in this version of omni-actors; "
            "use kind 'scripted' or 'torch'"
        )
    raise EngineUnavailableError(f"unknown engine kind {kind!r}; use scripted, torch or vllm")
