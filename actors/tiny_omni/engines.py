"""The ``torch`` engine kind for tiny-omni: one engine class per stage.

A stage's ``engine.args`` name the model family (``model``, default ``tiny-omni``), the
seed and cache of its prepared weights, and the ``stage`` it serves; the other keys go
to that stage's engine.
"""

from __future__ import annotations

from typing import Any

from omni_actors.actors.engine import Engine

__all__ = ["STAGE_ENGINES", "build_torch_engine"]

STAGE_ENGINES = ("thinker", "talker", "code2wav")


def build_torch_engine(args: dict[str, Any]) -> Engine:
    """The engine for ``args["stage"]`` (imported here: torch engines load transformers).

    Raises:
        ValueError: no or an unknown ``stage``.
        ModelNotPreparedError: the weights are not prepared (the message has the command).
    """
    stage = args.get("stage")
    if stage == "thinker":
        from omni_actors.actors.tiny_omni.thinker_engine import ThinkerEngine

        return ThinkerEngine(args)
    if stage == "talker":
        from omni_actors.actors.tiny_omni.talker_engine import TalkerEngine

        return TalkerEngine(args)
    if stage == "code2wav":
        from omni_actors.actors.tiny_omni.code2wav_engine import Code2WavEngine

        return Code2WavEngine(args)
    raise ValueError(f"torch engine args need stage: one of {', '.join(STAGE_ENGINES)}")
