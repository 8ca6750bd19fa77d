"""Stages built in threads of one process never overlap: transformers' ``_from_config``
sets torch's process-wide default dtype while it builds, so a stage built meanwhile
would get some tensors in the dtype another build restored (a bf16 code2wav with float32
layers, beside the thinker loading in its own engine thread)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch

from omni_actors.actors.engines.qwen3_omni import weights


def test_stage_builds_in_two_threads_take_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    inside, most = 0, 0
    count = threading.Lock()
    overlapped = threading.Event()

    def build(config: Any, dtype: torch.dtype) -> Any:
        nonlocal inside, most
        with count:
            inside += 1
            most = max(most, inside)
            if inside > 1:
                overlapped.set()
        overlapped.wait(timeout=0.3)  # long enough for an overlapping build to show
        with count:
            inside -= 1
        return dtype

    for stage in ("thinker", "code2wav"):
        monkeypatch.setattr(weights.STAGE_CLASSES[stage], "_from_config", build)
    threads = [
        threading.Thread(target=weights.build_stage, args=(stage, None, torch.bfloat16))
        for stage in ("thinker", "code2wav")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert not any(thread.is_alive() for thread in threads)
    assert most == 1
