"""``engine_pipeline``: a pipeline of one stage around an engine, to test it without YAML."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from omni_actors.actors.engines.registry import EngineUnavailableError, engine_type
from omni_actors.pipeline.spec.pipeline import PipelineSpec, load_pipeline

__all__ = ["engine_pipeline"]


def engine_pipeline(
    engine: type[Any] | str,
    args: Mapping[str, Any] | None = None,
    *,
    name: str = "engine",
    **sections: Any,
) -> PipelineSpec:
    """A pipeline whose only stage, ``name``, runs ``engine``: the caller's input goes
    to it, and what it yields of ``text`` and ``audio`` comes back as the caller's events.

    ::

        async with OmniPipeline(engine_pipeline(Echo, {"gain": 0.5}), system=kit.system) as omni:
            ...

    Args:
        engine: the engine class (importable by its module: a test module or a
            package, not a function's local class) or its kind (``scripted``,
            ``package.module:Class``).
        args: the engine's ``engine.args``.
        name: the stage's name (and the pipeline's).
        sections: the pipeline's other sections as its YAML would give them
            (``deadlines={"first_chunk_s": 6}``, ``inputs={"sample_rate": 24000}``, ...).

    Raises:
        PipelineConfigError: what a YAML file of the same pipeline would be refused for.
        EngineUnavailableError: a class that cannot be named by an import path.
    """
    kind = engine if isinstance(engine, str) else f"{engine.__module__}:{engine.__qualname__}"
    if "<locals>" in kind:
        raise EngineUnavailableError(
            f"engine {kind!r} is defined inside a function: a pipeline names an engine by "
            "its import path; define the class at the top of a module"
        )
    raw = dict(args or {})
    found = engine_type(kind)
    try:
        outputs = found.ports(found.args(raw)).outputs
    except (ValidationError, ValueError):
        outputs = {"text": "concat"}  # the pipeline's validation says what is wrong
    yields = {port: name for port in ("text", "audio") if port in outputs}
    return load_pipeline(
        {
            "name": name,
            "stages": [{"name": name, "engine": {"kind": kind, "args": raw}}],
            "outputs": yields or {"text": name},
            **sections,
        }
    )
