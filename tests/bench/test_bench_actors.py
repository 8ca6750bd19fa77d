"""``omni-actors bench actors`` runs and prints well-formed numbers.

Only the shape of the result is checked: benchmarks are never timed assertions.
"""

from __future__ import annotations

import json
import math

import pytest

from omni_actors.bench.actors import run_actor_bench
from omni_actors.cli import main

NUMBERS = (
    "tell_per_s",
    "queue_baseline_per_s",
    "tell_vs_queue_ratio",
    "ask_roundtrip_us_p50",
    "ask_roundtrip_us_p99",
    "messages",
    "asks",
)
SMALL = ["--messages", "2000", "--asks", "200", "--repeat", "1"]


def test_json_has_every_key_with_a_positive_finite_number(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["bench", "actors", "--json", *SMALL])

    assert code == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one JSON object, nothing else
    result = json.loads(out)
    for key in NUMBERS:
        value = result[key]
        assert isinstance(value, int | float), key
        assert not isinstance(value, bool), key
        assert math.isfinite(value), key
        assert value > 0, key
    assert result["messages"] == 2000
    assert result["asks"] == 200
    assert result["loop"] in ("uvloop", "asyncio")
    for key in ("python", "machine"):
        assert isinstance(result[key], str)
        assert result[key]


def test_table_names_every_measure(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "actors", "--messages", "1000", "--asks", "10", "--repeat", "2"]) == 0

    out = capsys.readouterr().out
    for key in NUMBERS:
        assert key in out


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "nothing"],
        ["bench"],
        ["bench", "actors", "--messages", "0"],
        ["bench", "actors", "--repeat", "-1"],
        ["bench", "actors", "--asks", "many"],
    ],
)
def test_bad_arguments_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2


async def test_library_call_rejects_empty_runs() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        await run_actor_bench(100, 10, 0)
