"""``/healthz``, ``/readyz`` and ``/metrics``: liveness, readiness through a stage's crash
and restart, and the counts a scrape shows after a realtime response, a chat completion
and a bad request."""

from __future__ import annotations

from typing import Any

from http_client import get, post
from prometheus_client.parser import text_string_to_metric_families
from realtime_client import connect

from omni_actors.pipeline.spec.pipeline import PipelineSpec, load_pipeline
from omni_actors.server.runner import RunningServer, run_server
from omni_actors.server.settings import ServerSettings
from omni_actors.testing import eventually, kill_worker

STAGES = ("thinker", "talker", "code2wav")
HELLO = [{"role": "user", "content": "hello"}]


def talker_in_a_worker(backoff_s: float) -> PipelineSpec:
    """scripted-omni with its talker in a worker process, restarted after ``backoff_s``."""
    data: dict[str, Any] = load_pipeline("scripted-omni").model_dump(by_alias=True)
    data["stages"][1]["process"] = True
    data["supervision"] = {"backoff_min_s": backoff_s, "backoff_max_s": backoff_s}
    return PipelineSpec.model_validate(data)


async def scrape(server: RunningServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``, by name and labels."""
    status, text = await get(server.url + "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def stage(name: str) -> tuple[tuple[str, str], ...]:
    return (("stage", name),)


async def test_liveness_and_readiness_of_an_idle_server(server: RunningServer) -> None:
    assert await get(server.url + "/healthz") == (200, {"status": "ok"})
    status, ready = await get(server.url + "/readyz")
    assert status == 200
    assert ready == {
        "ready": True,
        "draining": False,
        "stages": {
            name: {
                "stage": name,
                "state": "running",
                "restarts": 0,
                "sessions": 0,
                "queued": 0,
                "voices": None,
                "voice": None,
                "busy_s": None,  # scripted engines do not tell
                "max_sessions": None,  # nor hold sessions in slots
                "eager_steps": None,  # nor replay CUDA graphs
                "steps": None,  # nor run step loops
                "links": None,  # nor send over device links
            }
            for name in STAGES
        },
        "sessions": {"realtime": 0, "active": 0},
    }
    async with connect(server.ws_url):
        status, ready = await get(server.url + "/readyz")
        assert ready["sessions"] == {"realtime": 1, "active": 1}
        assert {s["sessions"] for s in ready["stages"].values()} == {1}
    server.state.draining = True
    status, ready = await get(server.url + "/readyz")
    assert (status, ready["ready"], ready["draining"]) == (503, False, True)
    server.state.draining = False


async def test_readiness_follows_a_stage_crash_and_restart() -> None:
    settings = ServerSettings(preset="scripted-omni", port=0)
    async with run_server(settings, pipeline=talker_in_a_worker(backoff_s=1.0)) as server:
        talker = (await server.state.pipeline.stages())["talker"]
        kill_worker(talker)

        async def unready() -> dict[str, Any]:
            status, ready = await get(server.url + "/readyz")
            assert status == 503, ready
            return ready  # type: ignore[no-any-return]

        ready = await eventually(unready)
        assert ready["ready"] is False
        assert ready["stages"]["talker"]["state"] == "restarting"
        assert ready["stages"]["talker"]["restarts"] == 1
        assert ready["stages"]["thinker"]["state"] == "running"
        samples = await scrape(server)
        assert samples[("omni_stage_running", stage("talker"))] == 0
        assert samples[("omni_stage_restarts", stage("talker"))] == 1

        async def recovered() -> dict[str, Any]:
            status, ready = await get(server.url + "/readyz")
            assert status == 200, ready
            return ready  # type: ignore[no-any-return]

        ready = await eventually(recovered, timeout=60.0)
        assert ready["stages"]["talker"]["restarts"] == 1
        samples = await scrape(server)
        assert samples[("omni_stage_running", stage("talker"))] == 1


async def test_metrics_after_a_realtime_response_a_chat_completion_and_a_bad_request(
    server: RunningServer,
) -> None:
    async with connect(server.ws_url) as client:
        await client.send(
            "conversation.item.create",
            item={"type": "message", "role": "user",
                  "content": [{"type": "input_text", "text": "hello"}]},
        )  # fmt: skip
        await client.send("response.create")
        events = await client.until("response.done")
    status, _ = await post(
        server.url + "/v1/chat/completions",
        {"messages": HELLO, "modalities": ["text", "audio"],
         "audio": {"voice": "alloy", "format": "pcm16"}},
    )  # fmt: skip
    assert status == 200
    status, _ = await post(server.url + "/v1/chat/completions", b"not json")
    assert status == 400

    await eventually(lambda: server.state.active == 0)
    samples = await scrape(server)
    assert samples[("omni_sessions_opened_total", ())] == 1  # the realtime connection
    assert samples[("omni_sessions", ())] == 0
    for event in events:
        assert samples[("omni_events_total", (("type", event["type"]),))] >= 1
    assert samples[("omni_events_total", (("type", "response.done"),))] == 1
    assert samples[("omni_responses_total", (("status", "completed"),))] == 2
    assert samples[("omni_ttft_ms_count", ())] == 2
    assert samples[("omni_ttfa_ms_count", ())] == 2
    assert samples[("omni_ttfa_ms_sum", ())] > 0
    # Both responses had audio: how smoothly it came, and each stage's waits per hop.
    assert samples[("omni_audio_gap_max_ms_count", ())] == 2
    assert samples[("omni_audio_underruns_total", ())] >= 0
    assert samples[("omni_audio_stall_ms_total", ())] >= 0
    for name in STAGES:
        assert samples[("omni_copy_wait_ms_count", stage(name))] == 2
    assert samples[("omni_chunk_wait_max_ms_count", stage(STAGES[-1]))] == 2
    assert samples[("omni_chat_completions_total", (("status", "completed"),))] == 1
    assert samples[("omni_chat_completions_total", (("status", "invalid_json"),))] == 1
    assert samples[("omni_errors_total", (("code", "invalid_json"),))] == 1
    for name in STAGES:
        assert samples[("omni_stage_running", stage(name))] == 1
        assert samples[("omni_stage_restarts", stage(name))] == 0
        assert samples[("omni_stage_sessions", stage(name))] == 0
        assert samples[("omni_stage_queued", stage(name))] == 0


async def test_the_stage_gauges_show_a_session_in_flight(server: RunningServer) -> None:
    async with connect(server.ws_url):
        samples = await scrape(server)
    assert {samples[("omni_stage_sessions", stage(name))] for name in STAGES} == {1}
