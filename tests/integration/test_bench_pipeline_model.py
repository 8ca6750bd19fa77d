"""``bench pipeline`` on a model preset: random prompts of an exact length, replies and
audio of a set length, and the serving figures per concurrency level."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from omni_actors.actors.engines.qwen3_omni.vocabulary import Vocabulary
from omni_actors.bench import models
from omni_actors.bench.models import model_table
from omni_actors.cli import main
from omni_actors.models.cache import locate, prepare
from omni_actors.pipeline.omni_pipeline import OmniPipeline

pytestmark = pytest.mark.integration

INPUT_TOKENS, OUTPUT_TOKENS, FRAMES_PER_TOKEN = 24, 6, 3
SAMPLES_PER_FRAME, RATE = 1920, 24_000


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("weights")
    prepare("tiny-omni", cache_dir=root)
    return locate("tiny-omni", cache_dir=root)


def test_random_prompts_set_replies_and_serving_figures(
    release: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sent: list[str] = []
    real_drive = models._drive

    async def recording(
        omni: OmniPipeline, requests: int, concurrency: int, texts: Sequence[str] = ()
    ) -> list[Any]:
        sent.extend(texts[:requests])
        return await real_drive(omni, requests, concurrency, texts)

    monkeypatch.setattr(models, "_drive", recording)
    argv = ["bench", "pipeline", "--preset", "tiny-omni", "--model", str(release), "--json"]
    argv += ["--input-tokens", str(INPUT_TOKENS), "--output-tokens", str(OUTPUT_TOKENS)]
    argv += ["--frames-per-token", str(FRAMES_PER_TOKEN), "--concurrency", "1", "2"]
    argv += ["--requests-per-level", "1", "--streaming-only", "--no-input-length", "--quiet"]

    assert main(argv) == 0

    report = json.loads(capsys.readouterr().out)
    # Every request (warm-ups too) sent a prompt of exactly INPUT_TOKENS tokens: two
    # warm-ups per level, then one wave of c requests.
    vocabulary = Vocabulary.load(release)
    assert len(sent) == (2 + 1) + (2 + 2)
    assert [len(vocabulary.encode(text)) for text in sent] == [INPUT_TOKENS] * len(sent)
    assert set(report["variants"]) == {"tiny-omni"}  # streaming only
    assert report["stream_vs_full_ttfa"] == {}
    assert "reference" not in report  # vllm-omni's figures are qwen3-omni's
    audio_s = OUTPUT_TOKENS * FRAMES_PER_TOKEN * SAMPLES_PER_FRAME / RATE
    for c, level in report["variants"]["tiny-omni"].items():
        assert level["errors"] == 0, level.get("first_error")
        assert level["requests"] == int(c)
        assert 0 < level["ttft_ms_p50"] <= level["ttft_ms_p90"]
        assert level["ttft_ms_p50"] < level["ttfa_ms_p50"] <= level["ttfa_ms_p90"]
        assert 0 < level["ttft_ms_mean"] < level["ttfa_ms_mean"]
        assert level["rtf_mean"] > 0
        assert level["rtf_p50"] > 0
        assert level["audio_s_mean"] == pytest.approx(audio_s)
        assert level["output_tokens_per_s"] == pytest.approx(
            int(c) * OUTPUT_TOKENS / level["wall_s"], rel=0.01
        ), c
        assert level["underruns"] >= 0
        assert (level["stall_ms"] > 0) == (level["underruns"] > 0)
        assert set(level["engine_busy"]) == {"thinker", "talker", "code2wav"}
        for stage, busy in level["engine_busy"].items():
            # The talker and code2wav report from their worker processes.
            assert busy["device"] == "cpu"
            assert 0 < busy["busy_fraction"] <= 1, stage
            assert busy["eager_steps"] is None, stage  # no CUDA graphs on the CPU
            steps = busy["steps"]  # every stage runs a step loop
            assert steps["steps"] > 0, stage
            assert steps["steps_per_s"] > 0, stage
            assert steps["prefill_steps"] <= steps["steps"], stage
        thinker = level["engine_busy"]["thinker"]["steps"]
        # Warm-ups ran before the level: its own prompts, each prefilled once.
        assert thinker["prefill_tokens"] >= int(c) * INPUT_TOKENS
        assert thinker["prefill_wait_ms_mean"] >= 0
        assert thinker["prefill_step_ms_mean"] > 0
        assert thinker["decode_step_ms_mean"] > 0
        assert thinker["decode_rows_per_step"] > 0
        assert thinker["ahead_steps"] == 0  # decode_ahead is off by default
        assert level["host_cpu_s_per_audio_s"] > 0
    expected = {
        "model": str(release),
        "input_tokens": INPUT_TOKENS,
        "output_tokens": OUTPUT_TOKENS,
        "frames_per_token": FRAMES_PER_TOKEN,
        "full_edges": False,
        "requests": "1*c",
        "requests_per_level": 1,
    }
    assert {key: report["parameters"][key] for key in expected} == expected
    engines = report["parameters"]["engines"]
    assert set(engines) == {"thinker", "talker", "code2wav"}  # the transcriber is not run
    assert engines["thinker"]["kind"] == "qwen3-omni.thinker"
    assert engines["thinker"]["model"] == str(release)
    assert engines["thinker"]["max_new_tokens"] == OUTPUT_TOKENS
    table = model_table(report)
    assert table[1] == "tiny-omni (engines: thinker cpu, talker cpu, code2wav cpu)"
    assert [row.split()[0] for row in table[3:5]] == ["1", "2"]
    assert table[5].split()[:2] == ["c", "steps"]  # each level's step loops below
    stages = [row.split()[:2] for row in table[6:12]]
    assert stages == [[c, a] for c in ("1", "2") for a in ("thinker", "talker", "code2wav")]
    assert "vllm-omni" not in "\n".join(table)
