"""The commands around a release: ``prepare --out``, ``run --model``, ``bench load``.

A user with a release directory names it with ``--model``; one written here
(``prepare tiny-omni --out``) stands in for a downloaded one.
"""

from __future__ import annotations

import json
import wave
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from omni_actors.cli import main
from omni_actors.models.release import INDEX

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("release") / "tiny"
    assert main(["prepare", "tiny-omni", "--out", str(out), "--seed", "2"]) == 0
    return out


def test_prepare_out_writes_a_release_outside_the_cache(
    release: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (release / INDEX).is_file()
    assert (release / "config.json").is_file()
    assert not (release / "prepared.json").exists()  # the cache's manifest: not the cache
    assert main(["prepare", "tiny-omni", "--out", str(release), "--seed", "2"]) == 0
    assert f"written to {release}" in capsys.readouterr().out


def test_run_with_model_loads_every_stage_from_that_release(
    release: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "reply.wav"
    cache = tmp_path / "empty-cache"  # nothing prepared there: the release is all it has
    argv = ["run", "--model", str(release), "--cache-dir", str(cache), "--no-prepare"]
    assert main([*argv, "--text", "hi", "--out", str(out)]) == 0
    with wave.open(str(out)) as wav:
        assert wav.getnframes() > 0
    assert not cache.exists()


def test_a_model_that_is_no_release_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere"
    argv = ["run", "--model", str(missing), "--text", "hi", "--out", str(tmp_path / "o.wav")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"omni-actors run: {missing}: is no model directory" in err
    assert "Traceback" not in err


def test_a_family_of_engines_is_not_something_to_prepare(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["prepare", "qwen3-omni"])
    err = capsys.readouterr().err
    assert "invalid choice: 'qwen3-omni'" in err
    assert "'qwen3-omni-random'" in err
    assert "'tiny-omni'" in err


def test_bench_load_reports_each_stage_and_the_shards_it_opened(
    release: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "load", "--json", "--quiet", "--model", str(release)]
    assert main([*argv, "--stage", "code2wav=cpu", "--stage", "thinker=cpu"]) == 0
    report = json.loads(capsys.readouterr().out)
    index = json.loads((release / INDEX).read_text())["weight_map"]
    assert list(report["stages"]) == ["code2wav", "thinker"]
    for stage, entry in report["stages"].items():
        own = sorted({f for n, f in index.items() if n.startswith(f"{stage}.")})
        assert entry["shards_opened"] == own
        assert entry["seconds"] >= 0
        assert entry["weights_gib"] > 0
    assert len(report["stages"]["code2wav"]["shards_opened"]) == 1


def test_bench_boundary_measures_what_a_left_context_costs(
    release: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "boundary", "--json", "--quiet", "--model", str(release)]
    assert main([*argv, "--left-context", "0", "25", "--utterance-frames", "60"]) == 0
    rows = json.loads(capsys.readouterr().out)["left_context"]
    # tiny-omni's decoder sees 20 frames back: 25 frames of context decode every window
    # as the one-shot decode does; none leaves an audible seam right after each boundary.
    assert rows["25"]["max_error"] < 1e-5
    assert rows["0"]["boundary_max_error"] > 1e-3
    assert rows["0"]["boundary_max_error"] == rows["0"]["max_error"]
    assert rows["0"]["chunks"] == rows["25"]["chunks"] == 4  # 4 + 25 + 25 + 6
    assert rows["0"]["signal_rms"] > 1e-3
