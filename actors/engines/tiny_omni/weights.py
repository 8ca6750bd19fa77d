"""Build and load tiny-omni weights in the standard Hugging Face layout.

Each stage is saved on its own (``thinker/``, ``talker/``, ``code2wav/``: ``config.json`` +
``model.safetensors``) so a stage engine loads only the model it serves, as separate
processes would with the real checkpoint split by stage. ``config.json`` at the top level
holds the composite :class:`Qwen3OmniMoeConfig` for the pipeline-level special token ids;
it has no weights of its own.

Weights are random but deterministic: every stage is drawn right after
``torch.manual_seed(seed)``, so a stage's weights do not depend on build order and the same
seed always rebuilds the same files' tensors.

Loading treats the files as hostile input (:mod:`omni_actors.models.files`): safetensors
only, every file checked first, and a failure reported as a ``ModelFileError`` naming it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, cast

import torch

from omni_actors.actors.engines.tiny_omni.hf import (
    PreTrainedConfig,
    PreTrainedModel,
    Qwen3OmniMoeCode2Wav,
    Qwen3OmniMoeCode2WavConfig,
    Qwen3OmniMoeTalkerConfig,
    Qwen3OmniMoeTalkerForConditionalGeneration,
    Qwen3OmniMoeTalkerTextExperts,
    Qwen3OmniMoeTalkerTextTopKRouter,
    Qwen3OmniMoeThinkerConfig,
    Qwen3OmniMoeThinkerForConditionalGeneration,
)
from omni_actors.errors import ModelFileError
from omni_actors.models.cache import ModelNotPreparedError
from omni_actors.models.files import read_json, safetensors_weights

from .checkpoint import write_checkpoint
from .configs import DEFAULT_NUM_CODE_GROUPS, quiet_transformers, tiny_configs
from .layout import CHECKPOINT, REBUILD, STAGES
from .tokenizer import write_tokenizer

__all__ = ["CHECKPOINT", "STAGES", "Progress", "build", "is_built", "load"]

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called once a stage's files are written."""

_CLASSES: Final[dict[str, type[PreTrainedModel]]] = {
    "thinker": Qwen3OmniMoeThinkerForConditionalGeneration,
    "talker": Qwen3OmniMoeTalkerForConditionalGeneration,
    "code2wav": Qwen3OmniMoeCode2Wav,
}
_CONFIGS: Final[dict[str, type[PreTrainedConfig]]] = {
    "thinker": Qwen3OmniMoeThinkerConfig,
    "talker": Qwen3OmniMoeTalkerConfig,
    "code2wav": Qwen3OmniMoeCode2WavConfig,
}
"""Each stage's own config class. Passed to ``from_pretrained`` explicitly: before 5.23,
transformers declares the composite ``Qwen3OmniMoeConfig`` as code2wav's config class,
so loading code2wav by itself fails without it (``'Qwen3OmniMoeConfig' object has no
attribute 'layer_types'``). Explicit works on the whole supported range."""
_BY_ARCHITECTURE: Final = {cls.__name__: stage for stage, cls in _CLASSES.items()}


def _stage_configs(
    seed: int, num_code_groups: int
) -> tuple[PreTrainedConfig, dict[str, PreTrainedConfig]]:
    composite = tiny_configs(seed, num_code_groups=num_code_groups)
    stages = {
        "thinker": composite.thinker_config,
        "talker": composite.talker_config,
        "code2wav": composite.code2wav_config,
    }
    # The composite's __post_init__ turns every sub-config into a PreTrainedConfig.
    return composite, {k: cast(PreTrainedConfig, v) for k, v in stages.items()}


@torch.no_grad()
def _init_missed(model: PreTrainedModel, std: float) -> None:
    """Initialize the parameters transformers' ``_init_weights`` skips.

    The talker's MoE experts are allocated with ``torch.empty`` and its router with zeros,
    and (in transformers 5.23) no ``_init_weights`` branch covers the talker variants, only
    the thinker's. A real checkpoint overwrites them; random weights must not: uninitialized
    memory is neither deterministic nor finite. Drawn like the thinker's experts.
    """
    for module in model.modules():
        if isinstance(module, Qwen3OmniMoeTalkerTextExperts):
            module.gate_up_proj.normal_(0.0, std)
            module.down_proj.normal_(0.0, std)
        elif isinstance(module, Qwen3OmniMoeTalkerTextTopKRouter):
            module.weight.normal_(0.0, std)
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise RuntimeError(f"non-finite parameters after initialization: {bad}")


def build(
    out_dir: Path,
    seed: int = 0,
    progress: Progress | None = None,
    *,
    num_code_groups: int = DEFAULT_NUM_CODE_GROUPS,
) -> None:
    """Draw the tiny-omni weights and save one HF directory per stage under ``out_dir``.

    A stage is written to a hidden sibling first and renamed into place, so an interrupted
    build never leaves a half-written stage that :func:`load` would accept.

    Args:
        out_dir: Created if missing; existing stage directories are replaced.
        seed: Seeds ``torch.manual_seed`` before each stage is instantiated.
        progress: Optional ``progress(stage, done, total)`` callback.
        num_code_groups: Codebooks per codec frame (see :func:`tiny_configs`).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    composite, stages = _stage_configs(seed, num_code_groups)
    for done, stage in enumerate(STAGES, start=1):
        final = out_dir / stage
        staging = out_dir / f".{stage}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        # The global RNG is the one HF's initializers draw from; reseeding per stage makes
        # each stage reproducible on its own. fork_rng leaves the caller's RNG untouched.
        with torch.random.fork_rng(devices=[]), quiet_transformers():
            torch.manual_seed(seed)
            model = _CLASSES[stage](stages[stage])
            model.train(False)
            _init_missed(model, stages[stage].initializer_range)
            model.save_pretrained(staging)
            if stage == "thinker":  # the text stage's directory is a complete HF model
                write_tokenizer(staging)
        del model
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        if progress is not None:
            progress(stage, done, len(STAGES))
    composite.to_json_file(out_dir / "config.json")
    write_tokenizer(out_dir)
    write_checkpoint(out_dir, out_dir / CHECKPOINT)


def is_built(out_dir: Path) -> bool:
    """Whether ``out_dir`` holds every stage (config and weights), e.g. to build lazily."""
    out_dir = Path(out_dir)
    return (
        (out_dir / "config.json").is_file()
        and (out_dir / "thinker" / "tokenizer.json").is_file()
        and (out_dir / CHECKPOINT / "model.safetensors").is_file()
        and all(
            (out_dir / s / "config.json").is_file()
            and (out_dir / s / "model.safetensors").is_file()
            for s in STAGES
        )
    )


def load(
    stage_dir: Path, *, dtype: torch.dtype = torch.float32, device: torch.device | None = None
) -> PreTrainedModel:
    """Load one stage saved by :func:`build`, from local files only, in eval mode.

    The class comes from ``architectures`` in the stage's ``config.json`` (written by
    ``save_pretrained``), so the same call serves every stage.

    Args:
        stage_dir: ``<out_dir>/thinker``, ``<out_dir>/talker`` or ``<out_dir>/code2wav``.
        dtype: Parameter dtype; float32 is what CPU runs fastest for these sizes.
        device: where the model is moved once loaded (default: the CPU).

    Returns:
        The model, on ``device``, with gradients off for its parameters.

    Raises:
        ModelFileError: a file is missing, corrupt or not a tiny-omni stage's, or the
            weights are only in a pickle-based format (never loaded); the message names
            the file.
        ModelNotPreparedError: its tensors do not match the model (saved under a layout
            this transformers release does not read); the message has the command.
    """
    stage_dir = Path(stage_dir)
    config_file = stage_dir / "config.json"
    names = read_json(config_file, remedy=REBUILD).get("architectures")
    name = names[0] if isinstance(names, list) and len(names) == 1 else None
    stage = _BY_ARCHITECTURE.get(name) if isinstance(name, str) else None
    if stage is None:
        problem = f"not a tiny-omni stage (architectures={names!r})"
        raise ModelFileError(config_file, problem, REBUILD)
    # Checked here, not left to transformers: it names no file when one is corrupt.
    safetensors_weights(stage_dir, remedy=REBUILD)
    with quiet_transformers():
        try:
            config = _CONFIGS[stage].from_pretrained(stage_dir, local_files_only=True)
        except Exception as error:  # a field of the wrong type or value: the file's fault
            problem = f"is no valid {_CONFIGS[stage].__name__} ({error})"
            raise ModelFileError(config_file, problem, REBUILD) from error
        try:
            # use_safetensors: transformers would fall back to a pytorch_model.bin.
            # With output_loading_info, a (model, info) pair, which the stubs do not describe.
            loaded: Any = _CLASSES[stage].from_pretrained(
                stage_dir,
                config=config,
                local_files_only=True,
                use_safetensors=True,
                dtype=dtype,
                output_loading_info=True,
            )
        except Exception as error:  # the files are whole, but the config and tensors disagree
            problem = f"its weights do not build the model its config.json describes ({error})"
            raise ModelFileError(stage_dir, problem, REBUILD) from error
    model: PreTrainedModel = loaded[0]
    info: dict[str, Any] = loaded[1]
    # transformers fills missing weights with fresh random ones and only logs it: a stage
    # saved under another layout would load as a different model without a word.
    mismatch = {k: info[k] for k in ("missing_keys", "unexpected_keys") if info.get(k)}
    if mismatch:
        raise ModelNotPreparedError(
            f"{stage_dir} does not match {name} of this transformers version "
            f"({mismatch}); {REBUILD}"
        )
    model.train(False)
    model.requires_grad_(False)
    if device is not None and torch.device(device).type != "cpu":
        # transformers' decorator types ``to`` for dtype casts only; a device is valid.
        model.to(device)  # type: ignore[arg-type]
    return model
