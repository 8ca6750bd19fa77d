"""Qwen3-Omni's stages in and out of a release directory, whatever its size.

A release is one directory in the layout Qwen publishes (:mod:`omni_actors.models.release`):
the composite ``config.json``, a safetensors index and its shards, every tensor under its
stage's prefix (``thinker.``, ``talker.``, ``code2wav.``), the MoE experts one tensor per
expert and projection (``...mlp.experts.{e}.gate_proj.weight``). :func:`load` builds one
stage from it: the stage's transformers class, built from its part of ``config.json``
straight on the stage's device in the checkpoint's dtype, then filled tensor by tensor
from the shards that hold its prefix and no other. The host never holds more than one
tensor of it, so loading a 59 GiB thinker onto a GPU costs the host next to nothing.

transformers keeps a layer's experts as two fused parameters (``gate_up_proj``
``[E, 2I, H]``: each expert's gate rows, then its up rows; ``down_proj`` ``[E, H, I]``);
the release keeps them apart. :func:`release_tensors` and :func:`load` convert between the
two, as transformers' own loader does for this model type.

:func:`build` writes tiny-omni: the same release layout, with tiny, seeded random
weights drawn by transformers' initializers, sharded small so that a stage's shards and
code2wav's own last shard are exercised on every CPU.

Loading treats the files as hostile input (:mod:`omni_actors.models.files`): safetensors
only, every shard checked as it is opened, and a failure reported as a ``ModelFileError``
naming the file; a tensor missing, left over or of the wrong shape is one too.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, cast

import torch

from omni_actors.actors.engines.qwen3_omni.graphs import SETUP
from omni_actors.actors.engines.qwen3_omni.hf import (
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
from omni_actors.models.release import INDEX, Release, ReleaseWriter

from .configs import (
    DEFAULT_NUM_CODE_GROUPS,
    audio_feature_extractor,
    quiet_transformers,
    tiny_configs,
)
from .layout import ARCHITECTURE, STAGES, remedy
from .tokenizer import TinyVocab, write_tokenizer

__all__ = [
    "STAGES",
    "STAGE_CLASSES",
    "Progress",
    "build",
    "build_stage",
    "front_end_configs",
    "load",
    "release_config",
    "release_tensors",
    "stage_config",
    "stage_config_of",
]

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called once a stage's tensors are written."""

STAGE_CLASSES: Final[dict[str, type[PreTrainedModel]]] = {
    "thinker": Qwen3OmniMoeThinkerForConditionalGeneration,
    "talker": Qwen3OmniMoeTalkerForConditionalGeneration,
    "code2wav": Qwen3OmniMoeCode2Wav,
}
_CONFIGS: Final[dict[str, type[PreTrainedConfig]]] = {
    "thinker": Qwen3OmniMoeThinkerConfig,
    "talker": Qwen3OmniMoeTalkerConfig,
    "code2wav": Qwen3OmniMoeCode2WavConfig,
}
"""Each stage's own config class, built from its part of the composite ``config.json``.
Explicit: before 5.23, transformers declares the composite config as code2wav's class."""

_DTYPES: Final = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

_EXPERT: Final = re.compile(
    r"^(?P<experts>.+\.experts)\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$"
)
"""A release's per-expert key: the fused parameter's module, the expert, the projection."""

_TINY_SHARD_BYTES: Final = 1_500_000
"""tiny-omni's shard size: its thinker and talker (1.7 MB each) span three shards, and
code2wav (1.2 MB) fits the last one alone, as the real release's 554 MB do."""


def stage_config(release: Release, stage: str) -> PreTrainedConfig:
    """``stage``'s config, from its part of the release's composite ``config.json``.

    Raises:
        ModelFileError: that part is missing or not a valid config of the stage.
    """
    return stage_config_of(release.config, stage, release.path / "config.json")


def stage_config_of(config: Mapping[str, Any], stage: str, path: Path) -> PreTrainedConfig:
    """``stage``'s config, from its part of the composite ``config`` read from ``path``.

    Raises:
        ModelFileError: that part is missing or not a valid config of the stage.
    """
    part = config.get(f"{stage}_config")
    if not isinstance(part, dict):
        raise ModelFileError(path, f"has no {stage}_config object", remedy(path))
    try:
        with quiet_transformers():
            return _CONFIGS[stage](**part)
    except Exception as error:  # a field of the wrong type or value: the file's fault
        problem = f"has a {stage}_config that is no valid {_CONFIGS[stage].__name__} ({error})"
        raise ModelFileError(path, problem, remedy(path)) from error


def build_stage(stage: str, config: PreTrainedConfig, dtype: torch.dtype) -> PreTrainedModel:
    """``stage``'s module from its config, on the current default device (a ``with
    torch.device(...)`` around the call: the stage's own, or ``meta`` for shapes only)."""
    # transformers' ``_from_config`` is untyped; it builds the class it is called on.
    build: Callable[..., PreTrainedModel] = STAGE_CLASSES[stage]._from_config
    # One stage built at a time in a process (graphs.SETUP): ``_from_config`` sets the
    # process-wide default dtype while it builds, so a stage built meanwhile in another
    # engine's thread would get some tensors in the dtype this build restores.
    with SETUP:
        return build(config, dtype=dtype)


def release_dtype(release: Release, stage: str) -> torch.dtype:
    """The dtype the release stores ``stage`` in: its config's ``dtype`` (or the older
    ``torch_dtype``), the stage's own first, float32 if neither says."""
    part = release.config.get(f"{stage}_config")
    for config in (part if isinstance(part, dict) else {}, release.config):
        name = config.get("dtype") or config.get("torch_dtype")
        if isinstance(name, str) and name in _DTYPES:
            return _DTYPES[name]
    return torch.float32


def release_tensors(
    stage: str, state: Mapping[str, torch.Tensor]
) -> Iterator[tuple[str, torch.Tensor]]:
    """A stage module's ``state_dict`` under the release's names: prefixed with the
    stage, each fused expert parameter split into one tensor per expert and projection."""
    for name, tensor in state.items():
        if name.endswith(".experts.gate_up_proj"):
            base = f"{stage}.{name.removesuffix('.gate_up_proj')}"
            half = tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                yield f"{base}.{e}.gate_proj.weight", tensor[e, :half]
                yield f"{base}.{e}.up_proj.weight", tensor[e, half:]
        elif name.endswith(".experts.down_proj"):
            base = f"{stage}.{name.removesuffix('.down_proj')}"
            for e in range(tensor.shape[0]):
                yield f"{base}.{e}.down_proj.weight", tensor[e]
        else:
            yield f"{stage}.{name}", tensor


def _target(state: Mapping[str, torch.Tensor], name: str) -> tuple[str, torch.Tensor] | None:
    """The parameter (or the slice of a fused one) a release tensor fills, and the key
    that tracks it; None if the module has no such tensor."""
    match = _EXPERT.match(name)
    if match is None:
        found = state.get(name)
        return None if found is None else (name, found)
    proj, e = match["proj"], int(match["e"])
    fused = state.get(f"{match['experts']}.{'down_proj' if proj == 'down' else 'gate_up_proj'}")
    if fused is None or fused.dim() != 3 or e >= fused.shape[0]:
        return None
    half = fused.shape[1] // 2
    part = {"gate": fused[e, :half], "up": fused[e, half:], "down": fused[e]}[proj]
    return name, part


def load(
    release_dir: Path,
    stage: str,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    release: Release | None = None,
) -> PreTrainedModel:
    """Build ``stage`` of the release in ``release_dir`` on ``device``, in eval mode.

    Only the shards that hold the stage's prefix are opened (``release.opened`` lists
    them), one tensor at a time straight onto ``device``.

    Args:
        release_dir: the release directory.
        stage: ``thinker``, ``talker`` or ``code2wav``.
        dtype: the parameters' dtype (default: the release's, :func:`release_dtype`).
        device: where the model is built (default: the CPU).
        release: the release already opened (tests read its ``opened``).

    Returns:
        The model, with gradients off for its parameters.

    Raises:
        ModelFileError: a file is missing, truncated or corrupt, or its tensors do not
            make the model its config describes (one missing, one too many, a wrong
            shape); the message names the file.
    """
    if stage not in STAGE_CLASSES:
        raise ValueError(f"no stage {stage!r}; the stages are {', '.join(STAGES)}")
    release = release or Release.open(Path(release_dir), remedy=remedy(Path(release_dir)))
    config = stage_config(release, stage)
    dtype = dtype or release_dtype(release, stage)
    # Built and filled while no other engine thread of this process builds, loads or
    # captures a graph (graphs.SETUP): the copies onto the device run on its default
    # stream, which would invalidate a capture under way there.
    with SETUP:
        return _build_and_fill(release, stage, config, dtype, torch.device(device or "cpu"))


def _build_and_fill(
    release: Release, stage: str, config: PreTrainedConfig, dtype: torch.dtype, device: torch.device
) -> PreTrainedModel:
    with quiet_transformers(), torch.device(device):
        # Built where it runs: the host never holds the stage, whatever its size.
        model = build_stage(stage, config, dtype)
    model.train(False)
    model.requires_grad_(False)
    state = model.state_dict(keep_vars=True)
    filled: set[str] = set()
    index = release.path / INDEX
    with torch.no_grad():
        for name, tensor in release.tensors(f"{stage}.", device=device):
            found = _target(state, name)
            if found is None:
                problem = f"holds {stage}.{name}, which the {stage} its config describes has not"
                raise ModelFileError(index, problem, remedy(index))
            key, target = found
            if tuple(target.shape) != tuple(tensor.shape):
                problem = (
                    f"holds {stage}.{name} of shape {list(tensor.shape)}; "
                    f"the config makes it {list(target.shape)}"
                )
                raise ModelFileError(index, problem, remedy(index))
            target.copy_(tensor)
            filled.add(key)
    missing = _missing(state, filled)
    if missing:
        shown = ", ".join(f"{stage}.{n}" for n in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ModelFileError(index, f"lacks tensors of the {stage}: {shown}{more}", remedy(index))
    return model


def _missing(state: Mapping[str, torch.Tensor], filled: set[str]) -> list[str]:
    """The module's tensors no release tensor filled (a tied one counts as filled when
    the tensor it shares is; a fused expert one when every expert's part was)."""
    by_storage: dict[int, set[str]] = {}
    for name, tensor in state.items():
        by_storage.setdefault(tensor.data_ptr(), set()).add(name)
    missing: list[str] = []
    for name, tensor in state.items():
        if name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
            base, fused = name.rsplit(".", 1)
            projs = ("down",) if fused == "down_proj" else ("gate", "up")
            parts = [f"{base}.{e}.{p}_proj.weight" for e in range(tensor.shape[0]) for p in projs]
            missing += [p for p in parts if p not in filled]
        elif not filled & by_storage[tensor.data_ptr()]:
            missing.append(name)
    return missing


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


def release_config(composite: PreTrainedConfig) -> dict[str, Any]:
    """The composite ``config.json`` as a release has it.

    Fields vLLM reads that transformers' config classes do not write are added: the
    vision tower's ``image_size`` (16-pixel patches, 8 by 8: its 64 position embeddings)
    and ``apply_vit_abs_pos_embed`` (vLLM builds the tower though text and audio never
    run it), and an untied language-model head (tiny-omni's is a separate tensor).
    """
    config: dict[str, Any] = composite.to_dict()
    config["architectures"] = [ARCHITECTURE]
    thinker = config["thinker_config"]
    thinker["vision_config"].update(image_size=128, apply_vit_abs_pos_embed=True)
    thinker["text_config"]["tie_word_embeddings"] = False
    return config


def front_end_configs() -> dict[str, dict[str, Any]]:
    """The front ends' files: ``preprocessor_config.json`` (the Whisper feature extractor,
    what the thinker's audio front end is built from) and ``processor_config.json`` (the
    ``Qwen3OmniMoeProcessor`` a server such as vLLM builds)."""
    features = audio_feature_extractor().to_dict()
    preprocessor = {**features, "processor_class": "Qwen3OmniMoeProcessor"}
    features.pop("processor_class", None)
    processor = {
        "processor_class": "Qwen3OmniMoeProcessor",
        "feature_extractor": features,
        "image_processor": {"image_processor_type": "Qwen2VLImageProcessor"},
        "video_processor": {"video_processor_type": "Qwen2VLVideoProcessor"},
    }
    return {"preprocessor_config.json": preprocessor, "processor_config.json": processor}


def build(
    out_dir: Path,
    seed: int = 0,
    progress: Progress | None = None,
    *,
    num_code_groups: int = DEFAULT_NUM_CODE_GROUPS,
    max_shard_bytes: int = _TINY_SHARD_BYTES,
    vocab: TinyVocab | None = None,
) -> None:
    """Draw the tiny-omni weights and write them as a release into ``out_dir``.

    The release is written beside ``out_dir`` and moved into place whole, so an
    interrupted build never leaves a half-written one that :func:`load` would accept.

    Args:
        out_dir: replaced by the release.
        seed: Seeds ``torch.manual_seed`` before each stage is instantiated: a stage's
            weights do not depend on build order, and the same seed rebuilds them.
        progress: Optional ``progress(stage, done, total)`` callback.
        num_code_groups: Codebooks per codec frame (see :func:`tiny_configs`).
        max_shard_bytes: the largest shard (code2wav gets a last shard of its own).
        vocab: where the text tokens sit (default: tiny-omni's own layout); another
            layout makes a release whose every special id and vocabulary size differ.
    """
    composite = tiny_configs(seed, num_code_groups=num_code_groups, vocab=vocab)
    configs = {
        stage: cast(PreTrainedConfig, getattr(composite, f"{stage}_config")) for stage in STAGES
    }
    with ReleaseWriter(Path(out_dir), max_shard_bytes=max_shard_bytes) as writer:
        for done, stage in enumerate(STAGES, start=1):
            # The global RNG is the one HF's initializers draw from; fork_rng leaves the
            # caller's untouched.
            with torch.random.fork_rng(devices=[]), quiet_transformers():
                torch.manual_seed(seed)
                model = STAGE_CLASSES[stage](configs[stage])
                model.train(False)
                _init_missed(model, configs[stage].initializer_range)
            if stage == "code2wav":
                writer.new_shard()  # as Qwen3-Omni's release: code2wav alone in the last shard
            for name, tensor in release_tensors(stage, model.state_dict()):
                writer.add(name, tensor)
            del model
            if progress is not None:
                progress(stage, done, len(STAGES))
        writer.write_json("config.json", release_config(composite))
        for name, data in front_end_configs().items():
            writer.write_json(name, data)
        writer.write_json("generation_config.json", {"do_sample": False})
        with tempfile.TemporaryDirectory() as files:
            write_tokenizer(Path(files), vocab)
            for path in sorted(Path(files).iterdir()):
                writer.copy_file(path)
