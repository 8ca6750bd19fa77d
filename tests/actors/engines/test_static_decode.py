"""The static-cache settings: when an engine plans graphs for its steps."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch

from omni_actors.actors.engines.qwen3_omni.static_decode import StaticDecodeArgs, StaticPlan


def test_a_plan_is_on_for_cuda_by_default_and_graphs_only_there() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 1)
    assert StaticPlan.of(StaticDecodeArgs(), cpu, 8) is None
    assert StaticPlan.of(StaticDecodeArgs(), cuda, 8) == StaticPlan(8, 4096, True, warm=True)
    cold = StaticDecodeArgs(warm_graphs=False)
    assert StaticPlan.of(cold, cuda, 8) == StaticPlan(8, 4096, graphs=True, warm=False)
    forced = StaticDecodeArgs(static_cache=True, max_context=64)
    assert StaticPlan.of(forced, cpu, 2) == StaticPlan(2, 64, graphs=False)
    assert StaticPlan.of(StaticDecodeArgs(static_cache=False), cuda, 8) is None
    # What the engines ask of it when they load: graphs on a GPU unless turned off.
    assert StaticDecodeArgs().graphs_on(cuda)
    assert not StaticDecodeArgs().graphs_on(cpu)
    assert not forced.graphs_on(cpu)
    assert not StaticDecodeArgs(static_cache=False).graphs_on(cuda)
