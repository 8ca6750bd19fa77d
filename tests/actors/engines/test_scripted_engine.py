"""ScriptedEngine: deterministic outputs, both modes, abort, no leaked sessions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import torch
from pydantic import ValidationError

from omni_actors.actors.engines.contract import Engine, Fields
from omni_actors.actors.engines.scripted import ScriptedArgs, ScriptedEngine, reply_pieces


async def _inputs(n: int) -> AsyncIterator[Fields]:
    for i in range(n):
        yield {"token_ids": torch.tensor([i])}


async def _collect(engine: ScriptedEngine, session: str, n_inputs: int) -> list[Fields]:
    return [out async for out in engine.generate(session, _inputs(n_inputs))]


def test_it_satisfies_the_engine_protocol() -> None:
    engine: Engine = ScriptedEngine()
    assert engine is not None


async def test_entry_mode_yields_declared_outputs_after_the_input_ends() -> None:
    engine = ScriptedEngine(ScriptedArgs(outputs=5))
    await engine.start()
    outs = await _collect(engine, "s", 3)
    assert [int(o["token_ids"][0]) for o in outs] == [0, 1, 2, 3, 4]  # type: ignore[index]
    assert "".join(str(o["text"]) for o in outs) == "t0 t1 t2 t3 t4 "
    assert outs[2]["hidden"].shape == (1, 8)  # type: ignore[union-attr]
    assert engine.active_sessions == set()


async def test_streaming_mode_yields_per_input_while_inputs_arrive() -> None:
    engine = ScriptedEngine(ScriptedArgs(outputs_per_input=2, fields=("codes",), codebooks=3))
    seen_before_last_input = 0
    arrived = 0

    async def inputs() -> AsyncIterator[Fields]:
        nonlocal arrived
        for _ in range(3):
            arrived += 1
            yield {"hidden": torch.zeros(1, 8)}

    outs = []
    async for out in engine.generate("s", inputs()):
        outs.append(out)
        if arrived < 3:
            seen_before_last_input += 1
    assert len(outs) == 6
    assert seen_before_last_input >= 2  # outputs flowed before the input stream ended
    assert torch.equal(outs[5]["codes"], torch.full((1, 3), 5))  # type: ignore[arg-type]


async def test_same_inputs_same_outputs() -> None:
    a = await _collect(ScriptedEngine(ScriptedArgs(outputs=4)), "x", 1)
    b = await _collect(ScriptedEngine(ScriptedArgs(outputs=4)), "y", 2)
    assert all(torch.equal(p["hidden"], q["hidden"]) for p, q in zip(a, b, strict=True))  # type: ignore[arg-type]


async def test_abort_ends_a_session_promptly_and_frees_it() -> None:
    engine = ScriptedEngine(ScriptedArgs(outputs=1000, first_output_s=0.0, per_output_s=10.0))
    outs: list[Fields] = []
    first = asyncio.Event()

    async def consume() -> None:
        async for out in engine.generate("s", _inputs(1)):
            outs.append(out)
            first.set()

    task = asyncio.ensure_future(consume())
    await asyncio.wait_for(first.wait(), 1.0)
    assert engine.active_sessions == {"s"}
    await engine.abort("s")
    await asyncio.wait_for(task, 1.0)  # not 10 s: the abort cut the wait short
    assert len(outs) == 1
    assert engine.active_sessions == set()
    await engine.abort("unknown")  # a no-op


async def test_a_session_cannot_generate_twice_at_once() -> None:
    engine = ScriptedEngine(ScriptedArgs(outputs=2, per_output_s=5.0))
    first = engine.generate("s", _inputs(1))
    await anext(first)
    with pytest.raises(ValueError, match="already generating"):
        await anext(engine.generate("s", _inputs(1)))
    await engine.stop()
    assert [o async for o in first] == []
    assert engine.active_sessions == set()


def test_bad_declarations() -> None:
    with pytest.raises(ValueError, match="first_output_s"):
        ScriptedArgs(first_output_s=-1)
    with pytest.raises(ValueError, match="outputs_per_input"):
        ScriptedArgs(outputs_per_input=0)
    with pytest.raises(ValueError, match="fields"):
        ScriptedArgs(fields=("pixels",))  # type: ignore[arg-type]


def test_its_ports_follow_its_arguments() -> None:
    ports = ScriptedEngine.ports(ScriptedArgs(fields=("codes",), replace=("hidden",)))
    assert ports.outputs == {"codes": "concat"}
    assert ports.inputs["hidden"] == "replace"
    assert ports.inputs["token_ids"] == "concat"
    assert ports.streams_input
    narrow = ScriptedEngine.ports(ScriptedArgs(inputs=("codes",), replace=("codes",)))
    assert narrow.inputs == {"codes": "replace"}


def test_scripted_preset_stages_build_engines() -> None:
    from omni_actors.actors.engines.registry import build_engine
    from omni_actors.pipeline.spec.pipeline import load_pipeline

    spec = load_pipeline("scripted-omni")
    engines = {s.name: build_engine(s.engine.kind, s.engine.args) for s in spec.stages}
    assert all(isinstance(e, ScriptedEngine) for e in engines.values())
    talker, code2wav = engines["talker"], engines["code2wav"]
    assert isinstance(talker, ScriptedEngine)
    assert talker.args.fields == ("codes",)
    assert isinstance(code2wav, ScriptedEngine)
    assert code2wav.output(3)["audio"].shape == (1920,)  # type: ignore[union-attr]


TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


async def test_reply_text_is_spelled_out_piece_by_piece() -> None:
    engine = ScriptedEngine(ScriptedArgs(reply_text="Let me check. " + TOOL_CALL))
    outs = await _collect(engine, "s", 1)
    texts = [str(o["text"]) for o in outs]
    assert "".join(texts) == "Let me check. " + TOOL_CALL
    assert texts[:3] == ["Let", " me", " check."]
    assert len(outs) == len(reply_pieces("Let me check. " + TOOL_CALL)) > 3
    assert [int(o["token_ids"][0]) for o in outs] == list(range(len(outs)))  # type: ignore[index]


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({"reply_text": ""}, "at least 1 character"),
        ({"reply_text": "hi", "fields": ("token_ids",)}, "needs 'text' among fields"),
        ({"reply_text": "hi", "outputs_per_input": 1}, "drop outputs_per_input"),
        ({"reply_text": "hi there", "outputs": 5}, "spells 2 outputs but outputs is 5"),
    ],
)
def test_reply_text_is_checked(args: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        ScriptedArgs.model_validate(args)


def test_reply_text_with_its_own_count_of_outputs_is_accepted() -> None:
    assert ScriptedArgs(reply_text="hi there", outputs=2).replies == 2
