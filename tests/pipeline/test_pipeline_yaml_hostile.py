"""Hostile pipeline files: each ends in a ``PipelineConfigError`` that says what is wrong
and where, or loads, and none costs more than the limits of
``omni_actors.pipeline.spec.yaml_reader`` allow. Alias bombs, deep nesting, huge numbers,
unknown keys, graphs of a thousand stages, files of many megabytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_actors.pipeline.spec.pipeline import PipelineConfigError, load_pipeline
from omni_actors.pipeline.spec.yaml_reader import (
    MAX_ALIASES,
    MAX_DEPTH,
    MAX_NODES,
    MAX_PIPELINE_BYTES,
    YamlLimitError,
    parse_yaml,
)

ONE_STAGE = """\
name: p
stages:
  - name: a
    engine: {kind: scripted}
outputs: {text: a}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return path


def _refused(tmp_path: Path, text: str, message: str) -> str:
    """Load ``text`` expecting a refusal matching ``message``; the error's text."""
    path = _write(tmp_path, text)
    with pytest.raises(PipelineConfigError, match=message) as info:
        load_pipeline(path)
    assert str(path) in str(info.value)
    return str(info.value)


# -- aliases ---------------------------------------------------------------------------


def test_ordinary_anchors_aliases_and_merges_still_load(tmp_path: Path) -> None:
    text = """\
name: p
stages:
  - name: a
    engine: &engine {kind: scripted, args: {outputs: 3}}
  - name: b
    engine:
      <<: *engine
      args: {outputs: 5}
  - name: c
    engine: *engine
edges: [{from: a, to: b, mode: full}, {from: b, to: c, mode: full}]
outputs: {text: c}
"""
    spec = load_pipeline(_write(tmp_path, text))
    assert [s.engine.args["outputs"] for s in spec.stages] == [3, 5, 3]


def test_a_billion_laughs_is_refused_before_it_expands(tmp_path: Path) -> None:
    # Nine levels, each repeating the one below ten times: 10**9 values from 10 lines.
    levels = ["l0: &l0 [lol]"]
    levels += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    message = _refused(tmp_path, ONE_STAGE + "\n".join(levels), f"more than {MAX_NODES:,} values")
    assert "line " in message  # where in the file


def test_a_few_aliases_of_a_large_anchor_are_refused(tmp_path: Path) -> None:
    # Twenty aliases, well under the alias limit, of a list of 5,000 values.
    big = "[" + ", ".join(["x"] * 5_000) + "]"
    text = ONE_STAGE + f"big: &big {big}\nagain: [{', '.join(['*big'] * 20)}]\n"
    _refused(tmp_path, text, f"more than {MAX_NODES:,} values")


def test_more_aliases_than_a_pipeline_needs_are_refused(tmp_path: Path) -> None:
    text = ONE_STAGE + f"x: &x 1\nmany: [{', '.join(['*x'] * (MAX_ALIASES + 1))}]\n"
    _refused(tmp_path, text, f"more than {MAX_ALIASES} aliases")


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    text = ONE_STAGE.replace("{kind: scripted}", "&e {kind: scripted, args: {nested: *e}}")
    _refused(tmp_path, text, "alias \\*e repeats a collection it is inside")


# -- nesting ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,
        "{" * 100_000,
        "a: " + "[" * 5_000 + "]" * 5_000,
        "".join(f"{'  ' * i}k{i}:\n" for i in range(200)),
    ],
    ids=["brackets", "braces", "closed-brackets", "block-mappings"],
)
def test_deep_nesting_is_refused_not_a_recursion_error(tmp_path: Path, text: str) -> None:
    message = _refused(tmp_path, text, f"collections nest deeper than {MAX_DEPTH} levels")
    assert "line " in message


def test_nesting_up_to_the_limit_is_read() -> None:
    deep = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    value = parse_yaml(deep)
    for _ in range(MAX_DEPTH - 1):
        value = value[0]
    assert value == []
    with pytest.raises(YamlLimitError, match="nest deeper"):
        parse_yaml("[" + deep + "]")


# -- numbers ---------------------------------------------------------------------------


def _with(field: str, value: str) -> str:
    """The one-stage pipeline with ``field: value`` (``stage.`` fields on the stage)."""
    if field.startswith("stage."):
        return ONE_STAGE.replace("    engine:", f"    {field[6:]}: {value}\n    engine:")
    section, name = field.split(".")
    return ONE_STAGE + f"{section}: {{{name}: {value}}}\n"


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("stage.replicas", "1e400", r"stages\[a\]\.replicas: Input should be a valid integer"),
        ("stage.replicas", ".inf", r"stages\[a\]\.replicas: Input should be a finite number"),
        ("stage.replicas", ".nan", r"stages\[a\]\.replicas: Input should be a finite number"),
        ("stage.replicas", '"' + "9" * 10_000 + '"', r"stages\[a\]\.replicas: Unable to parse"),
        ("deadlines.total_s", ".inf", r"deadlines\.total_s: Input should be a finite number"),
        ("deadlines.total_s", "1e400", r"deadlines\.total_s: Input should be a finite number"),
        ("deadlines.total_s", "1.0e+400", r"deadlines\.total_s: Input should be a finite number"),
        ("deadlines.total_s", ".nan", r"deadlines\.total_s: Input should be a finite number"),
        ("deadlines.total_s", '"' + "9" * 10_000 + '"', r"deadlines\.total_s: .* finite"),
        ("deadlines.start_s", "-.inf", r"deadlines\.start_s: Input should be a finite number"),
        ("supervision.period_s", ".inf", r"supervision\.period_s: Input should be a finite"),
        ("flow.window", "1e400", r"flow\.window: Input should be a valid integer"),
        ("flow.window", "9" * 4_000, r"flow\.window: Input should be less than or equal"),
    ],
)
def test_huge_and_infinite_numbers_fail_validation_naming_the_field(
    tmp_path: Path, field: str, value: str, where: str
) -> None:
    message = _refused(tmp_path, _with(field, value), where)
    assert "at least 1 item" not in message  # no echo of the failed stage as a second problem


DIGITS = "9" * 10_000


@pytest.mark.parametrize(
    "text",
    [
        _with("stage.replicas", DIGITS),
        _with("deadlines.total_s", DIGITS),
        ONE_STAGE.replace("name: p", f"name: {DIGITS}"),
    ],
    ids=["replicas", "total_s", "name"],
)
def test_an_integer_past_pythons_digit_limit_is_a_config_error(tmp_path: Path, text: str) -> None:
    # int() raises ValueError past 4,300 digits; it must not escape untyped.
    message = _refused(tmp_path, text, "an integer of 10,000 characters")
    assert "line " in message


def test_a_long_base_60_integer_is_refused_before_its_quadratic_read(tmp_path: Path) -> None:
    text = _with("stage.replicas", "1" + ":1" * 20_000)
    _refused(tmp_path, text, "a base-60 integer of 40,001 characters")


@pytest.mark.parametrize(
    "value",
    ["2001-02-30", "!!bool maybe", "!!timestamp someday", "!!int ''", "!!float x", "!!int 0x"],
)
def test_values_pyyaml_cannot_construct_are_config_errors(tmp_path: Path, value: str) -> None:
    _refused(
        tmp_path,
        _with("stage.replicas", value),
        r"(?s)not valid YAML: cannot read .* line 4, column 15",
    )


def test_python_tags_are_refused_unrun(tmp_path: Path) -> None:
    text = _with("stage.replicas", "!!python/object/apply:os.getcwd []")
    _refused(tmp_path, text, "could not determine a constructor")


def test_bytes_that_are_not_utf8_are_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_bytes(ONE_STAGE.replace("name: p", "name: p\xe9").encode("latin-1"))
    with pytest.raises(PipelineConfigError, match="not valid YAML"):
        load_pipeline(path)


# -- unknown keys ----------------------------------------------------------------------

PIPELINE = """\
name: p
stages:
  - name: a
    engine: {kind: scripted, args: {outputs: 2}}
    staging: {slots: 2}
  - name: b
    engine: {kind: scripted, args: {fields: [codes]}}
edges:
  - {from: a, to: b, fields: [hidden], chunk_policy: {frames: 5}}
inputs: {sample_rate: 16000}
outputs: {text: a, audio: b}
supervision: {max_restarts: 1}
deadlines: {total_s: 60}
flow: {window: 8}
"""


@pytest.mark.parametrize(
    ("anchor", "where"),
    [
        ("name: p\n", "bogus"),
        ("  - name: a\n", r"stages\[a\]\.bogus"),
        ("{kind: scripted, args: {outputs: 2}", r"stages\[a\]\.engine\.bogus"),
        ("args: {outputs: 2", r"stages\[a\]\.engine\.args\.bogus"),
        ("staging: {slots: 2", r"stages\[a\]\.staging\.bogus"),
        ("{from: a, to: b", r"edges\[0\]\.bogus"),
        ("chunk_policy: {frames: 5", r"edges\[0\]\.chunk_policy\.bogus"),
        ("inputs: {sample_rate: 16000", r"inputs\.bogus"),
        ("outputs: {text: a, audio: b", r"outputs\.bogus"),
        ("supervision: {max_restarts: 1", r"supervision\.bogus"),
        ("deadlines: {total_s: 60", r"deadlines\.bogus"),
        ("flow: {window: 8", r"flow\.bogus"),
    ],
)
def test_an_unknown_key_at_any_level_is_named(tmp_path: Path, anchor: str, where: str) -> None:
    assert load_pipeline(_write(tmp_path, PIPELINE)).name == "p"  # the base is valid
    if anchor.endswith("\n"):
        indent = anchor[: len(anchor) - len(anchor.lstrip(" -"))].replace("-", " ")
        text = PIPELINE.replace(anchor, f"{anchor}{indent}bogus: 1\n", 1)
    else:
        text = PIPELINE.replace(anchor, f"{anchor}, bogus: 1", 1)
    message = _refused(tmp_path, text, f"{where}: Extra inputs are not permitted")
    assert "(1 problem(s))" in message  # no echo of the failed item as a second problem


# -- a thousand stages -----------------------------------------------------------------

STAGES = 1_000


def _graph(edges: list[tuple[int, int]], entry: int = 0, text: int = STAGES - 1) -> str:
    lines = ["name: big", "stages:"]
    lines += [f"  - {{name: s{i}, engine: {{kind: scripted}}}}" for i in range(STAGES)]
    lines += ["edges:" if edges else "edges: []"]
    lines += [f"  - {{from: s{a}, to: s{b}, mode: full}}" for a, b in edges]
    lines += [f"entry: s{entry}", f"outputs: {{text: s{text}}}"]
    return "\n".join(lines) + "\n"


def test_a_chain_of_a_thousand_stages_loads(tmp_path: Path) -> None:
    chain = [(i, i + 1) for i in range(STAGES - 1)]
    spec = load_pipeline(_write(tmp_path, _graph(chain)))
    order = [f"s{i}" for i in range(STAGES)]
    assert spec.stages_order() == order
    assert spec.stages_for(text=True, audio=False) == order
    assert spec.downstream("s0") == set(order[1:])


def test_a_fan_out_to_a_thousand_stages_loads(tmp_path: Path) -> None:
    fan = [(0, i) for i in range(1, STAGES)]
    spec = load_pipeline(_write(tmp_path, _graph(fan, text=500)))
    assert spec.stages_for(text=True, audio=False) == ["s0", "s500"]
    assert len(spec.downstream("s0")) == STAGES - 1


def test_a_cycle_through_a_thousand_stages_is_refused_in_a_short_message(
    tmp_path: Path,
) -> None:
    cycle = [(i, (i + 1) % STAGES) for i in range(STAGES)]
    message = _refused(tmp_path, _graph(cycle), r"the stages form a cycle through \['s0', ")
    assert "and 990 more" in message
    assert len(message) < 1_000


def test_a_thousand_unreachable_stages_are_refused_in_a_short_message(tmp_path: Path) -> None:
    message = _refused(tmp_path, _graph([], text=0), "not reachable from entry 's0'")
    assert "and 989 more" in message
    assert len(message) < 1_000


# -- size ------------------------------------------------------------------------------


def test_a_file_of_50_mb_is_refused_naming_its_size(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.yaml"
    with path.open("wb") as f:
        f.write(ONE_STAGE.encode())
        f.truncate(50 * 2**20)  # sparse: nothing written past the pipeline
    with pytest.raises(PipelineConfigError, match=f"52,428,800 bytes; .* {MAX_PIPELINE_BYTES:,}"):
        load_pipeline(path)


def test_a_valid_pipeline_one_byte_past_the_limit_is_refused(tmp_path: Path) -> None:
    padding = "#" * (MAX_PIPELINE_BYTES - len(ONE_STAGE) - 1) + "\n"
    path = _write(tmp_path, ONE_STAGE + padding)  # exactly the limit
    assert load_pipeline(path).name == "p"
    path = _write(tmp_path, ONE_STAGE + "#" + padding)
    with pytest.raises(PipelineConfigError, match="MAX_PIPELINE_BYTES"):
        load_pipeline(path)
