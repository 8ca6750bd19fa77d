"""The ``cascade`` model family, and ``tiny-cascade``, the release it prepares locally.

Registered under the entry point group ``omni_actors.families`` (see ``pyproject.toml``):

- ``cascade``: four engines, one per stage of a voice agent's cascade, each loading a
  release of its own (``model:`` a directory or a Hub repo id): ``cascade.asr`` (a
  transformers speech recognizer, such as ``openai/whisper-large-v3-turbo``),
  ``cascade.llm`` (a transformers causal LM, such as ``Qwen/Qwen3-8B``; or
  ``cascade.llm-vllm``, the same on vLLM),
  ``cascade.tts`` (Sesame CSM, ``sesame/csm-1b``) and ``cascade.mimi`` (the Mimi codec's
  decoder: CSM's own, or ``kyutai/mimi``). Without a ``model`` they load their part of
  ``tiny-cascade``.
- ``tiny-cascade``: the four at toy size, seeded random weights, each in its published
  layout, written here (``omni-actors prepare tiny-cascade``).
- ``cascade-random``: the same at the real releases' sizes (``omni-actors prepare
  cascade-random``; ``--model cascade-random`` points every stage at it).

This module imports nothing heavy.
"""

from __future__ import annotations

from pathlib import Path

from omni_actors.models.family import ModelFamily, Progress, WeightsArgs

__all__ = [
    "CASCADE",
    "CASCADE_RANDOM",
    "DEFAULT_RELEASE",
    "TINY_CASCADE",
    "stage_checkpoint",
]

DEFAULT_RELEASE = "tiny-cascade"
"""The release the engines load when their ``model`` argument names none."""

_ENGINES = "omni_actors.actors.engines.cascade"


def _prepare_tiny(out_dir: Path, seed: int, progress: Progress | None) -> None:
    from omni_actors.actors.engines.cascade.tiny_release import write_tiny_cascade

    write_tiny_cascade(out_dir, seed, progress)


def _prepare_random(out_dir: Path, seed: int, progress: Progress | None) -> None:
    from omni_actors.actors.engines.cascade.tiny_release import write_tiny_cascade

    write_tiny_cascade(out_dir, seed, progress, full_size=True)


def _verify(out_dir: Path) -> None:
    from omni_actors.actors.engines.cascade.tiny_release import verify

    verify(out_dir)


def stage_checkpoint(args: WeightsArgs, stage: str) -> Path:
    """The checkpoint a cascade engine of ``stage`` loads: the directory ``model`` names
    (a directory, a Hub repo id or a family), or its ``stage`` subdirectory when it is
    a whole cascade (``tiny-cascade``, or a directory laid out as it is).

    Raises:
        ModelNotPreparedError: the weights are not prepared (the message has the command).
        ModelFileError: ``model`` names nothing usable (the message says why).
    """
    from omni_actors.models.cache import locate

    # Every shard: a stage's checkpoint is a whole model, not a part of a composite
    # release (whose shards a prefix picks out).
    path = locate(args.model or DEFAULT_RELEASE, cache_dir=args.cache_dir, seed=args.seed)
    inner = path / stage
    return inner if (inner / "config.json").is_file() else path


CASCADE = ModelFamily(
    name="cascade",
    engines={
        "cascade.asr": f"{_ENGINES}.recognizer:RecognizerEngine",
        "cascade.llm": f"{_ENGINES}.llm_engine:LlmEngine",
        # The same LLM on vLLM (the omni-actors[vllm] extra), sharing the thinker's engine.
        "cascade.llm-vllm": "omni_actors.actors.engines.vllm.llm:VllmLlmEngine",
        "cascade.tts": f"{_ENGINES}.tts_engine:SynthesizerEngine",
        "cascade.mimi": f"{_ENGINES}.mimi_engine:MimiEngine",
    },
    default_model=DEFAULT_RELEASE,
)
"""The cascade's engines: any recognizer, causal LM, CSM and Mimi release."""

TINY_CASCADE = ModelFamily(
    name="tiny-cascade",
    engines={},
    prepare=_prepare_tiny,
    checkpoint=".",  # each stage's checkpoint is a subdirectory (`stage_checkpoint`)
    verify=_verify,
)
"""The cascade at toy size, with seeded random weights (no download)."""

CASCADE_RANDOM = ModelFamily(
    name="cascade-random",
    engines={},
    prepare=_prepare_random,
    checkpoint=".",
    verify=_verify,
)
"""The cascade at its real releases' sizes (Whisper large-v3-turbo, Qwen3-8B, CSM-1B),
with seeded random weights and tiny-cascade's tokenizers: GPU benches, no download."""
