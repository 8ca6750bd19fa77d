"""Failures on a cluster: a replica's worker dies, a whole node goes away.

A cluster of its own (node A, and two nodes B and C that both offer ``node_b``), since
the last test removes a node.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_helpers import events_of, host_of, node_of

from omni_actors.cluster.local_ray import LocalRay, start_local_ray
from omni_actors.pipeline.cluster_hosts import pin
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineSpec, load_pipeline
from omni_actors.protocols.events import Done, SessionError
from omni_actors.testing import eventually, kill_worker, worker_pid

pytestmark = [pytest.mark.ray, pytest.mark.integration]


@pytest.fixture(scope="module")
def three_nodes() -> Iterator[tuple[LocalRay, Any]]:
    local = start_local_ray()
    try:
        node_c = local.cluster.add_node(num_cpus=2, resources={"node_b": 16}, labels={"zone": "c"})
        local.cluster.wait_for_nodes()
        yield local, node_c
    finally:
        local.shutdown()


def _spec(address: str, strategy: str = "PACK", **talker: Any) -> PipelineSpec:
    data = load_pipeline("scripted-omni").model_dump(by_alias=True, exclude_none=True)
    data["cluster"] = {"ray": {"strategy": strategy}}
    data["stages"][0]["engine"]["args"]["per_output_s"] = 0.05  # ~1.6 s of thinking
    data["stages"][1].update(talker)
    data["deadlines"] |= {"admission_s": 60, "start_s": 90}
    return pin(PipelineSpec.model_validate(data), address)


async def test_node_labels_pick_the_node(three_nodes: tuple[LocalRay, Any]) -> None:
    local, node_c = three_nodes
    spec = _spec(local.address).model_dump(by_alias=True, exclude_none=True)
    spec["stages"][1]["placement"]["ray"]["node_labels"] = {"zone": "c"}
    async with OmniPipeline(PipelineSpec.model_validate(spec)) as omni:
        stages = await omni.stages()
        assert node_of(stages["talker"]) == node_c.node_id  # node B has node_b, not zone c
        events = [e async for e in omni.generate(text="labelled")]
        assert isinstance(events[-1], Done), events[-3:]


async def test_a_dead_replica_fails_only_its_own_sessions(
    three_nodes: tuple[LocalRay, Any],
) -> None:
    local, _ = three_nodes
    async with OmniPipeline(_spec(local.address, "SPREAD", replicas=2)) as omni:
        stages = await omni.stages()
        # SPREAD: the two replicas' bundles went to the two nodes that offer node_b.
        assert node_of(stages["talker-0"]) != node_of(stages["talker-1"])
        doomed = stages["talker-0"]
        first = worker_pid(doomed)
        async with omni.session() as one, omni.session() as two:
            for session in (one, two):
                await session.send(text="x", end="finished")
            # Least loaded: the two sessions are on different replicas.
            live = await omni.live_sessions()
            assert len(live["talker-0"]) == len(live["talker-1"]) == 1
            ends = await asyncio.gather(events_of(one, lambda: kill_worker(doomed)), events_of(two))
        failed = [e for e in ends if isinstance(e[-1], SessionError)]
        served = [e for e in ends if isinstance(e[-1], Done)]
        assert len(failed) == len(served) == 1, [e[-1] for e in ends]
        error = failed[0][-1]
        assert isinstance(error, SessionError)
        assert (error.code, error.stage) == ("stage_failed", "talker"), error
        await omni.inspect(timeout=60)
        assert worker_pid(doomed) != first


async def test_closing_never_waits_on_a_keeper_that_cannot_answer(
    three_nodes: tuple[LocalRay, Any],
) -> None:
    from ray._private import state

    local, _ = three_nodes
    omni = OmniPipeline(_spec(local.address))
    await omni.start()
    try:
        worker = host_of((await omni.stages())["talker"]).worker
        assert worker is not None
        keeper = worker.proc._keeper  # type: ignore[attr-defined]
        actor = state.actors()[keeper._actor_id.hex()]
        os.kill(actor["Pid"], signal.SIGSTOP)  # as if its node stopped answering
    finally:
        async with asyncio.timeout(60):  # stop_timeout, then the keeper is given up
            await omni.close()
    assert state.actors()[keeper._actor_id.hex()]["State"] == "DEAD"


async def test_a_lost_node_s_stages_come_back_on_a_node_that_fits(
    three_nodes: tuple[LocalRay, Any],
) -> None:
    local, node_c = three_nodes
    async with OmniPipeline(_spec(local.address)) as omni:
        stages = await omni.stages()
        talker, code2wav, thinker = stages["talker"], stages["code2wav"], stages["thinker"]
        where = node_of(talker)
        assert where in (local.node_b, node_c.node_id)
        assert node_of(thinker) == local.node_a
        lost = local.cluster.list_all_nodes()
        (gone,) = [n for n in lost if n.node_id == where]
        local.cluster.remove_node(gone)

        async def back() -> bool:
            try:
                await omni.inspect(timeout=60)
                return node_of(talker) != where and node_of(code2wav) != where
            except Exception:  # restarting: no worker yet, or asks failing
                return False

        await eventually(back, timeout=120)
        other = node_c.node_id if where == local.node_b else local.node_b
        assert node_of(talker) == node_of(code2wav) == other
        events = [e async for e in omni.generate(text="after the loss")]
        assert isinstance(events[-1], Done), events[-3:]
