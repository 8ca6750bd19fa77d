"""The hidden-state tap under vLLM's compilation, not only with ``enforce_eager``.

vLLM compiles the language model on its first forward and later calls skip Dynamo's
guards (on a GPU they replay CUDA graphs), so the tap must be part of the model before
it is compiled (``hidden_state_tap``). On the CPU build, compilation is Dynamo traced
once; its ``eager`` backend (``VLLM_CPU_CI_ENV``, as vLLM's own CPU CI runs) runs the
traced graph without inductor's code generation, which the tap does not depend on and
which would take minutes on a small machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerEngine
from omni_actors.actors.engines.vllm.hidden_states import (
    TAP_ARCHITECTURE,
    TAP_CONFIG,
    tap_engine_args,
)
from omni_actors.errors import EngineError

from .conftest import CPU_ENGINE_ARGS, thinkers
from .test_vllm_thinker import ATOL, COMMIT, both, noise

COMPILED = {key: value for key, value in CPU_ENGINE_ARGS.items() if key != "enforce_eager"}
"""vLLM's default compilation (``-O``) on the CPU."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engines(cache_dir: Path) -> AsyncIterator[tuple[Any, ThinkerEngine]]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_CPU_CI_ENV", "1")
        async with thinkers(
            cache_dir, {"max_new_tokens": 6, "min_new_tokens": 2}, COMPILED
        ) as pair:
            yield pair


@pytest.mark.asyncio(loop_scope="module")  # the module's one vLLM
async def test_a_compiled_thinker_gives_the_hidden_states_at_audio_positions(
    engines: Any,
) -> None:
    vllm, torch_thinker = engines
    config = vllm._llm.vllm_config.compilation_config
    assert config.mode != 0  # compiled: CompilationMode.NONE is 0
    heard = await both(
        engines, "heard", [{"text": "Listen:"}, {"audio": noise(1.5, 2)}, COMMIT], ATOL
    )
    assert int(heard["user_mask"].sum()) == 20  # 150 log-mel frames: the rows of the clip
    # A second turn: the buffer is rewritten by every step; each clip's rows are its own.
    await both(engines, "heard", [{"audio": noise(1.0, 3)}, {"text": "And this?"}], ATOL)
    await asyncio.gather(vllm.release("heard"), torch_thinker.release("heard"))


@pytest.mark.parametrize(
    ("engine_args", "problem"),
    [
        ({"worker_extension_cls": "my.Extension"}, "worker_extension_cls is taken"),
        ({"hf_overrides": {"architectures": ["Other"]}}, "without 'architectures'"),
        ({"additional_config": {TAP_CONFIG: {"layer": 1}}}, f"without '{TAP_CONFIG}'"),
    ],
)
def test_engine_args_may_not_take_the_taps_settings(
    engine_args: dict[str, Any], problem: str
) -> None:
    with pytest.raises(EngineError, match=problem):
        tap_engine_args(engine_args, 1)


def test_engine_args_keep_their_own_overrides_beside_the_tap() -> None:
    args = tap_engine_args(
        {"hf_overrides": {"rope_theta": 1.0}, "additional_config": {"other": 2}}, 3
    )
    assert args["hf_overrides"] == {"rope_theta": 1.0, "architectures": [TAP_ARCHITECTURE]}
    assert args["additional_config"] == {"other": 2, TAP_CONFIG: {"layer": 3}}
