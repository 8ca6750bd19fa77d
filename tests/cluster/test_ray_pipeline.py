"""Pipelines whose stages Ray places on the nodes of a (local, two-node) cluster.

The thinker is pinned to node A and the talker and code2wav to node B by custom
resources; the stage workers link to each other and to this process over TCP with
CURVE, and Ray only starts them.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
import zmq
from cluster_helpers import events_of, host_of, node_of, ours_alive

from omni_actors.cluster.local_ray import LocalRay
from omni_actors.pipeline.cluster_hosts import pin
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineSpec, load_pipeline
from omni_actors.protocols.events import AudioDelta, Done, Event, SessionError, TextDelta
from omni_actors.testing import eventually, kill_worker, worker_pid
from omni_actors.transport.endpoints import CurveKeys

pytestmark = [pytest.mark.ray, pytest.mark.integration]


def placed(spec: PipelineSpec, address: str) -> PipelineSpec:
    """``spec`` with the thinker on node A, the talker and code2wav on node B."""
    return pin(spec, address, {"thinker": "node_a", "talker": "node_b", "code2wav": "node_b"})


async def collect(omni: OmniPipeline, **kw: Any) -> list[Event]:
    return [e async for e in omni.generate(**kw)]


def text_of(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def audio_of(events: list[Event]) -> torch.Tensor:
    pieces = [e.audio for e in events if isinstance(e, AudioDelta)]
    return torch.cat(pieces) if pieces else torch.zeros(0)


async def test_tiny_omni_across_two_nodes_makes_the_local_reply(
    local_ray: LocalRay, cache: Path
) -> None:
    spec = load_pipeline("tiny-omni").without_transcriber().with_weights(cache_dir=cache)
    async with OmniPipeline(placed(spec, local_ray.address)) as omni:
        stages = await omni.stages()
        nodes = {name: node_of(ref) for name, ref in stages.items()}
        endpoints = {name: host_of(ref).remote.endpoint for name, ref in stages.items()}
        remote = await collect(omni, text="across nodes")
        assert ours_alive()
    assert nodes == {
        "thinker": local_ray.node_a,
        "talker": local_ray.node_b,
        "code2wav": local_ray.node_b,
    }
    assert all(e.startswith("tcp://") for e in endpoints.values()), endpoints
    async with OmniPipeline(spec) as omni:
        local = await collect(omni, text="across nodes")
    assert isinstance(remote[-1], Done), remote[-3:]
    assert text_of(remote) == text_of(local)
    assert audio_of(remote).numel() > 0
    assert torch.allclose(audio_of(remote), audio_of(local), atol=1e-4)
    # Shutdown leaves no keeper and no placement group behind.
    await eventually(lambda: not ours_alive(), timeout=30)


async def test_a_stage_worker_admits_no_client_without_a_key(local_ray: LocalRay) -> None:
    async with OmniPipeline(placed(load_pipeline("scripted-omni"), local_ray.address)) as omni:
        talker = (await omni.stages())["talker"]
        host = host_of(talker)
        node = host.workers.node
        ctx = zmq.Context()
        socket = ctx.socket(zmq.PUSH)
        CurveKeys.generate().apply_client(socket, node.peer_keys[host.remote.peer])
        monitor = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        try:
            socket.connect(host.remote.endpoint)
            socket.send(b"let me in", zmq.NOBLOCK)
            refused = await asyncio.to_thread(monitor.poll, 10_000)
        finally:
            socket.disable_monitor()
            monitor.close(linger=0)
            socket.close(linger=0)
            ctx.term()
        assert refused, "a client with an unknown key got through"
        events = await collect(omni, text="still serving")
        assert isinstance(events[-1], Done), events[-3:]


async def test_a_killed_worker_on_node_b_fails_its_session_and_comes_back(
    local_ray: LocalRay,
) -> None:
    spec = load_pipeline("scripted-omni").model_dump(by_alias=True, exclude_none=True)
    spec["stages"][0]["engine"]["args"]["per_output_s"] = 0.05  # ~1.6 s of thinking
    spec["deadlines"]["admission_s"] = 60
    async with OmniPipeline(placed(PipelineSpec.model_validate(spec), local_ray.address)) as omni:
        stages = await omni.stages()
        talker, thinker = stages["talker"], stages["thinker"]
        first, thinker_pid = worker_pid(talker), worker_pid(thinker)
        async with omni.session() as victim, omni.session(modalities=("text",)) as bystander:
            for session in (victim, bystander):
                await session.send(text="x", end="finished")
            events = await events_of(victim, lambda: kill_worker(talker))
            text_events = [e async for e in bystander]
        error = events[-1]
        assert isinstance(error, SessionError), events[-3:]
        assert (error.code, error.stage) == ("stage_failed", "talker"), error
        assert isinstance(text_events[-1], Done), text_events[-3:]  # thinker on A went on
        # The talker comes back, in its bundle: on node B, the one node that fits it.
        await omni.inspect(timeout=60)
        assert worker_pid(talker) != first
        assert node_of(talker) == local_ray.node_b
        assert worker_pid(thinker) == thinker_pid
        after = await collect(omni, text="again")
        assert isinstance(after[-1], Done), after[-3:]
        assert audio_of(after).numel() > 0
    assert not os.path.exists(f"/proc/{first}")
    await eventually(lambda: not ours_alive(), timeout=30)


async def test_a_pipeline_that_does_not_fit_fails_to_start_and_leaves_nothing(
    local_ray: LocalRay,
) -> None:
    data = placed(load_pipeline("scripted-omni"), local_ray.address).model_dump(
        by_alias=True, exclude_none=True
    )
    data["stages"][1]["placement"]["ray"]["resources"] = {"node_c": 1}  # no such node
    data["deadlines"]["start_s"] = 3
    with pytest.raises(TimeoutError, match="no room"):
        async with OmniPipeline(PipelineSpec.model_validate(data)):
            pass
    await eventually(lambda: not ours_alive(), timeout=30)


async def test_the_cross_node_bench_measures_both_placements(
    local_ray: LocalRay, tmp_path: Path
) -> None:
    from omni_actors.bench.cluster import run_cluster_bench

    preset = tmp_path / "placed.yaml"
    spec = placed(load_pipeline("scripted-omni"), "auto")
    data = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    preset.write_text(yaml.safe_dump(data))
    report = await run_cluster_bench(preset, local_ray.address, requests=2)
    for placement in ("process", "cluster"):
        level = report["placements"][placement]
        assert (level["requests"], level["errors"]) == (2, 0), level
        assert level["ttfa_ms_p50"] > 0
    assert report["hops"] == 4  # input, thinker -> talker -> code2wav, and to the caller
    measured = report["targets"]["cross_node_ms_per_hop_p50"]["measured"]
    assert measured == report["cross_node_ms_per_hop_p50"]
    expected = (
        report["placements"]["cluster"]["ttfa_ms_p50"]
        - report["placements"]["process"]["ttfa_ms_p50"]
    ) / 4
    assert measured == pytest.approx(expected, abs=1e-3)
    await eventually(lambda: not ours_alive(), timeout=30)
