"""``cpu_engine_args``: vLLM on a CPU runs its model in the EngineCore on few threads,
unless the pipeline chose an executor or parallelism (no vLLM needed to check)."""

from __future__ import annotations

import os

import pytest

from omni_actors.actors.engines.vllm.runtime import cpu_engine_args

MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTIPROCESSING, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def test_a_single_process_model_runs_in_the_engine_core_on_the_threads_asked() -> None:
    given = {"dtype": "float32"}
    args = cpu_engine_args(given, 1)
    assert args == {"dtype": "float32", "distributed_executor_backend": "uni"}
    assert given == {"dtype": "float32"}  # the caller's dict is not changed
    assert os.environ[MULTIPROCESSING] == "0"
    assert os.environ["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize(
    "chosen",
    [
        {"distributed_executor_backend": "mp"},
        {"tensor_parallel_size": 2},
        {"pipeline_parallel_size": 2},
        {"data_parallel_size": 2},
    ],
)
def test_a_chosen_executor_or_parallelism_is_left_alone(chosen: dict[str, object]) -> None:
    assert cpu_engine_args(chosen, None) == chosen
    assert MULTIPROCESSING not in os.environ
    assert "OMP_NUM_THREADS" not in os.environ  # no threads asked: vLLM's choice


def test_a_multiprocessing_setting_of_the_caller_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MULTIPROCESSING, "1")
    cpu_engine_args({}, 2)
    assert os.environ[MULTIPROCESSING] == "1"
    assert os.environ["OMP_NUM_THREADS"] == "2"
