"""The engine registry: kinds from entry points and families, import paths, declarations."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from omni_actors.actors.engines.contract import Ports
from omni_actors.actors.engines.registry import (
    ENGINE_ENTRY_POINTS,
    EngineArgsError,
    EngineUnavailableError,
    build_engine,
    engine_kinds,
    engine_type,
)
from omni_actors.actors.engines.scripted import ScriptedEngine
from omni_actors.models.family import FAMILY_ENTRY_POINTS, model_family

WriteModule = Callable[[str], str]


@pytest.fixture
def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WriteModule]:
    """Write a throwaway module on the import path; returns its (unique) name."""
    written: list[str] = []
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(source: str) -> str:
        name = f"user_engines_{uuid.uuid4().hex[:12]}"
        (tmp_path / f"{name}.py").write_text(source)
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


ECHO = """
from pydantic import BaseModel


class EchoArgs(BaseModel):
    model_config = {"extra": "forbid"}
    times: int = 1


class Echo:
    Args = EchoArgs
    inputs = {"text": "concat"}
    outputs = {"text": "concat"}

    def __init__(self, args: EchoArgs) -> None:
        self.times = args.times

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def abort(self, session: str) -> None: ...
    async def release(self, session: str) -> None: ...

    async def generate(self, session, inputs):
        async for chunk in inputs:
            yield {"text": chunk["text"] * self.times}
"""


def test_builtin_kinds_come_from_this_packages_entry_points() -> None:
    engines = {p.name: p.value for p in entry_points(group=ENGINE_ENTRY_POINTS)}
    assert engines["scripted"] == "omni_actors.actors.engines.scripted:ScriptedEngine"
    families = {p.name: p.value for p in entry_points(group=FAMILY_ENTRY_POINTS)}
    assert families["tiny-omni"] == "omni_actors.actors.engines.qwen3_omni.family:TINY_OMNI"
    # a family's engines are kinds too, imported only when a pipeline names one
    kinds = engine_kinds()
    assert kinds["scripted"] == engines["scripted"]
    for kind, path in model_family("tiny-omni").engines.items():
        assert kinds[kind] == path
    assert set(kinds) >= {"qwen3-omni.thinker", "qwen3-omni.talker", "qwen3-omni.code2wav"}
    assert engine_type("scripted").cls is ScriptedEngine


def test_an_unknown_kind_lists_the_known_ones() -> None:
    with pytest.raises(EngineUnavailableError, match="unknown engine kind 'onnx'") as info:
        engine_type("onnx")
    assert "scripted" in str(info.value)
    assert "qwen3-omni.talker" in str(info.value)
    assert "package.module:Class" in str(info.value)
    assert "vllm" in str(info.value)


def test_the_vllm_kind_is_registered_and_imports_no_vllm_until_it_runs() -> None:
    import sys

    found = engine_type("vllm")
    assert found.cls.__name__ == "VllmThinkerEngine"
    assert found.ports(found.args({"model": "tiny-omni"})).streams_input
    assert "vllm" not in sys.modules  # the server's process never loads vLLM itself


def test_the_cascade_llm_on_vllm_has_the_torch_llms_ports_and_imports_no_vllm() -> None:
    import sys

    found = engine_type("cascade.llm-vllm")
    torch_llm = engine_type("cascade.llm")
    assert found.cls.__name__ == "VllmLlmEngine"
    assert found.ports(found.args({})) == torch_llm.ports(torch_llm.args({}))
    assert found.args({}).model is None  # tiny-cascade's LLM, as cascade.llm loads
    assert "vllm" not in sys.modules


def test_the_talker_reads_its_row_counts_on_the_host() -> None:
    found = engine_type("qwen3-omni.talker")
    assert found.ports(found.args({})).host_inputs == {"user_edits"}
    thinker = engine_type("qwen3-omni.thinker")
    assert thinker.ports(thinker.args({})).host_inputs == frozenset()


def test_a_class_named_by_import_path_is_an_engine(write_module: WriteModule) -> None:
    module = write_module(ECHO)
    found = engine_type(f"{module}:Echo")
    assert found.ports(found.args({})) == Ports({"text": "concat"}, {"text": "concat"})
    engine = build_engine(f"{module}:Echo", {"times": 2})
    assert engine.times == 2  # type: ignore[attr-defined]
    with pytest.raises(EngineArgsError, match=r"stages\[echo\]\.engine\.args\.times: "):
        build_engine(f"{module}:Echo", {"times": "many"}, where="stages[echo].engine")


def test_an_import_path_that_does_not_import_is_a_clear_error(write_module: WriteModule) -> None:
    with pytest.raises(EngineUnavailableError, match="cannot import no_such_module:Engine"):
        engine_type("no_such_module:Engine")
    module = write_module(ECHO)
    with pytest.raises(EngineUnavailableError, match=f"cannot import {module}:Missing"):
        engine_type(f"{module}:Missing")


LIFECYCLE = """
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def abort(self, session: str) -> None: ...
    async def release(self, session: str) -> None: ...
    async def generate(self, session, inputs):
        async for chunk in inputs:
            yield chunk
"""


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("inputs = {'text': 'concat'}", "declare outputs"),
        ("inputs = {'text': 'append'}\n    outputs = {}", "need a rule of concat or replace"),
        ("Args = dict\n    inputs = outputs = {}", "Args must be a pydantic BaseModel"),
        (
            "inputs = {'text': 'concat'}\n    outputs = {}\n    host_inputs = {'count'}",
            "host_inputs \\['count'\\] are not among its inputs",
        ),
        (
            "inputs = outputs = {}\n    @classmethod\n    def ports(cls, args): return {}",
            "ports\\(\\) returned dict",
        ),
    ],
)
def test_a_malformed_declaration_is_a_clear_error(
    write_module: WriteModule, body: str, message: str
) -> None:
    module = write_module(f"class Bad:\n    {body}\n{LIFECYCLE}")
    with pytest.raises(EngineUnavailableError, match=message):
        build_engine(f"{module}:Bad", {})


def _without(method: str) -> str:
    """``Echo`` without ``method``: its ``def`` line and body taken out."""
    lines = ECHO.splitlines()
    start = next(i for i, line in enumerate(lines) if f"def {method}(" in line)
    end = start + 1
    while end < len(lines) and lines[end].startswith("        "):
        end += 1
    return "\n".join(lines[:start] + lines[end:]) + "\n"


@pytest.mark.parametrize("method", ["generate", "release", "start", "stop", "abort"])
def test_an_engine_without_a_method_of_the_protocol_is_refused_naming_it(
    write_module: WriteModule, method: str
) -> None:
    module = write_module(_without(method))
    with pytest.raises(EngineUnavailableError) as info:
        build_engine(f"{module}:Echo", {})
    message = str(info.value)
    assert f"{module}:Echo" in message
    assert f"has no {method}()" in message
    assert f"async def {method}(" in message


@pytest.mark.parametrize(
    ("source", "says"),
    [
        (
            "    def generate(self, session, inputs):\n        yield {'text': 'x'}\n",
            ["generate() is a plain generator", "async def generate("],
        ),
        (
            "    async def generate(self, session, inputs):\n        return {'text': 'x'}\n",
            ["generate() is async but never yields", "yield each output"],
        ),
        (
            "    def release(self, session):\n        pass\n",
            ["release() is not async", "async def release("],
        ),
    ],
)
def test_a_method_that_does_not_fit_the_protocol_is_refused_naming_it(
    write_module: WriteModule, source: str, says: list[str]
) -> None:
    method = source.split("def ")[1].split("(")[0]
    module = write_module(_without(method) + source)
    with pytest.raises(EngineUnavailableError) as info:
        build_engine(f"{module}:Echo", {})
    for words in says:
        assert words in str(info.value)


def test_a_generate_that_returns_an_async_iterator_is_an_engine(write_module: WriteModule) -> None:
    # As an engine that keeps a conversation does: it returns ``conversation.respond``.
    source = (
        "    def generate(self, session, inputs):\n        return self._reply(inputs)\n"
        "    async def _reply(self, inputs):\n        async for chunk in inputs:\n"
        "            yield chunk\n"
    )
    module = write_module(_without("generate") + source)
    assert type(build_engine(f"{module}:Echo", {})).__name__ == "Echo"


def test_an_engine_without_args_takes_none(write_module: WriteModule) -> None:
    module = write_module(
        f"class Plain:\n    inputs = outputs = {{'codes': 'concat'}}\n{LIFECYCLE}"
    )
    found = engine_type(f"{module}:Plain")
    assert found.ports(found.args({})).streams_input
    with pytest.raises(EngineArgsError, match=r"engine\.args\.speed: Extra inputs"):
        build_engine(f"{module}:Plain", {"speed": 2})


GAIN = f"""
from pydantic import BaseModel, ConfigDict


class GainArgs(BaseModel):
    gain: float = 1.0
    boost: bool = False


class Gain:
    Args = GainArgs
    inputs = {{'audio': 'concat'}}
    outputs = {{'audio': 'concat'}}

    def __init__(self, args: GainArgs) -> None:
        self.args = args
{LIFECYCLE}

class LooseArgs(BaseModel):
    model_config = ConfigDict(extra="allow")
    gain: float = 1.0


class Loose(Gain):
    Args = LooseArgs
"""


def test_a_users_args_refuse_an_unknown_key_as_the_builtin_engines_do(
    write_module: WriteModule,
) -> None:
    module = write_module(GAIN)
    with pytest.raises(EngineArgsError) as info:
        build_engine(f"{module}:Gain", {"gian": 0.8}, where="stages[gain].engine")
    message = str(info.value)
    assert "stages[gain].engine.args.gian: Extra inputs are not permitted" in message
    assert f"({module}:Gain takes boost, gain)" in message
    engine = build_engine(f"{module}:Gain", {"gain": 0.8})
    assert engine.args.gain == 0.8  # type: ignore[attr-defined]
    assert type(engine.args).__name__ == "GainArgs"  # type: ignore[attr-defined]
    with pytest.raises(EngineArgsError, match=r"args\.speed: Extra inputs.*\(scripted takes "):
        build_engine("scripted", {"speed": 2})


def test_a_users_args_that_allow_extra_keys_keep_them(write_module: WriteModule) -> None:
    module = write_module(GAIN)
    engine = build_engine(f"{module}:Loose", {"gain": 0.5, "colour": "red"})
    assert engine.args.model_extra == {"colour": "red"}  # type: ignore[attr-defined]
