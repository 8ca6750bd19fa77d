"""The talker's frame compile: what its arguments turn on where, and how a failed compile
is told and let go (the compiled frames themselves: ``tests/integration``'s tiny-omni
talker tests)."""

from __future__ import annotations

import logging
import os

import pytest

pytest.importorskip("transformers")

import torch

from omni_actors.actors.engines.qwen3_omni.frame_compile import (
    CompileState,
    FrameCompile,
    FrameCompileArgs,
    ThinkerCompileArgs,
    end_compile_workers,
)
from omni_actors.actors.engines.qwen3_omni.talker_engine import TalkerArgs
from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerArgs
from omni_actors.testing import eventually


def test_the_frame_compiles_on_cuda_by_default_and_where_asked() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 1)
    assert FrameCompileArgs().frame_compile(cuda) == FrameCompile("inductor")
    assert FrameCompileArgs().frame_compile(cpu) is None
    assert FrameCompileArgs(compile_frame=False).frame_compile(cuda) is None
    forced = FrameCompileArgs(compile_frame=True, compile_backend="aot_eager")
    assert forced.frame_compile(cpu) == FrameCompile("aot_eager")
    args = TalkerArgs.model_validate({"compile_frame": False, "compile_backend": "eager"})
    assert args.frame_compile(cuda) is None
    assert TalkerArgs(compile_frame=True, compile_backend="eager").frame_compile(cpu) == (
        FrameCompile("eager")
    )
    with pytest.raises(ValueError, match="compile_frame"):
        TalkerArgs.model_validate({"compile_frame": "yes"})


def test_the_thinker_s_decode_layers_compile_on_cuda_by_default_and_where_asked() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert ThinkerCompileArgs().decode_compile(cuda) == "inductor"
    assert ThinkerCompileArgs().decode_compile(cpu) is None
    assert ThinkerCompileArgs(compile_decode=False).decode_compile(cuda) is None
    forced = ThinkerArgs(compile_decode=True, compile_backend="aot_eager")
    assert forced.decode_compile(cpu) == "aot_eager"
    assert ThinkerArgs.model_validate({"compile_decode": False}).decode_compile(cuda) is None
    with pytest.raises(ValueError, match="compile_decode"):
        ThinkerArgs.model_validate({"compile_decode": "yes"})
    with pytest.raises(ValueError, match="compile_backend"):
        ThinkerArgs.model_validate({"compile_backend": ""})


def test_the_thinker_s_prefill_layers_compile_on_a_gpu_or_where_asked() -> None:
    cpu, gpu = torch.device("cpu"), torch.device("cuda:0")
    assert ThinkerCompileArgs().prefill_compile(cpu) is None
    assert ThinkerCompileArgs().prefill_compile(gpu) == "inductor"
    assert ThinkerCompileArgs(compile_prefill=False).prefill_compile(gpu) is None
    asked = ThinkerArgs(compile_prefill=True, compile_backend="aot_eager")
    assert asked.prefill_compile(cpu) == "aot_eager"
    with pytest.raises(ValueError, match="compile_prefill"):
        ThinkerArgs.model_validate({"compile_prefill": "yes"})


def test_a_failed_compile_is_told_once_with_its_cause(caplog: pytest.LogCaptureFixture) -> None:
    state = CompileState("talker layers")
    try:
        try:
            raise RuntimeError("no C++ compiler found\nlong details")
        except RuntimeError as inner:
            raise ValueError("backend='inductor' raised:") from inner
    except ValueError as error:
        with caplog.at_level(logging.WARNING):
            state.fall_back(error)
    assert state.failed == "ValueError: RuntimeError: no C++ compiler found"
    assert [r.getMessage() for r in caplog.records] == [
        "talker layers: torch.compile failed (ValueError: RuntimeError: no C++ compiler "
        "found); runs uncompiled"
    ]


def test_out_of_memory_is_not_a_failed_compile() -> None:
    state = CompileState("talker code predictor")
    with pytest.raises(torch.OutOfMemoryError):
        state.fall_back(torch.OutOfMemoryError("CUDA out of memory"))
    assert state.failed is None


def _children() -> set[int]:
    """This process's live child processes, read from /proc."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = f.read().rsplit(")", 1)[1].split()[1]
            except OSError:
                continue
            if int(parent) == os.getpid():
                found.add(int(entry))
    return found


async def test_the_compile_workers_inductor_started_are_ended() -> None:
    """What end_compile_workers ends: the subprocesses of inductor's compile pool."""
    async_compile = pytest.importorskip("torch._inductor.async_compile")
    before = _children()
    async_compile.AsyncCompile.process_pool()
    try:
        await eventually(lambda: _children() - before, timeout=60, what="the compile workers")
    finally:
        end_compile_workers()
    await eventually(lambda: not (_children() - before), timeout=60, what="no compile worker")
