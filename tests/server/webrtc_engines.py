"""A scripted pipeline whose replies are a tone: audio that survives Opus.

scripted-omni's audio is a constant per codec frame (``k / 1000``), which Opus's DC
filter takes out; a caller of a WebRTC call must hear something. ``Tone`` is the
scripted code2wav with a 440 Hz sine for audio; the rest (text ``t{k} ``, two 80 ms codec
frames per text output, truncation) is scripted-omni's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from omni_actors.actors.engines.scripted import ScriptedEngine
from omni_actors.pipeline.spec.pipeline import PipelineSpec

RATE = 24_000
TONE_HZ = 440.0
LEVEL = 0.3


class Tone(ScriptedEngine):
    """Scripted code2wav speaking a continuous 440 Hz tone."""

    def _make(self, k: int) -> dict[str, torch.Tensor | str]:
        made = super()._make(k)
        if "audio" in made:
            n = self.args.audio_samples
            t = (k * n + torch.arange(n, dtype=torch.float64)) / RATE
            made["audio"] = (LEVEL * torch.sin(2 * math.pi * TONE_HZ * t)).to(torch.float32)
        return made


def tone_pipeline(per_output_s: float = 0.06) -> PipelineSpec:
    """scripted-omni with a tone for audio; the thinker writes a text output every
    ``per_output_s`` (0.06 s: 32 outputs in about 2 s, while their 5.12 s of audio play)."""
    return PipelineSpec.model_validate(
        {
            "name": "tone",
            "stages": [
                {
                    "name": "thinker",
                    "engine": {
                        "kind": "scripted",
                        "args": {
                            "first_output_s": 0.05,
                            "per_output_s": per_output_s,
                            "outputs": 32,
                        },
                    },
                },
                {
                    "name": "talker",
                    "engine": {
                        "kind": "scripted",
                        "args": {"outputs_per_input": 2, "fields": ["codes"]},
                    },
                },
                {
                    "name": "code2wav",
                    "engine": {
                        "kind": "webrtc_engines:Tone",
                        "args": {"outputs_per_input": 1, "fields": ["audio"]},
                    },
                },
            ],
            "edges": [
                {
                    "from": "thinker",
                    "to": "talker",
                    "mode": "stream",
                    "fields": ["hidden", "token_ids"],
                },
                {
                    "from": "talker",
                    "to": "code2wav",
                    "mode": "stream",
                    "chunk_policy": {"initial_frames": 4, "frames": 25, "left_context": 25},
                },
            ],
            "outputs": {"text": "thinker", "audio": "code2wav"},
            "deadlines": {
                "admission_s": 5,
                "first_chunk_s": 30,
                "inter_chunk_s": 10,
                "total_s": 3600,
            },
        }
    )


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread, as ``omni-actors serve`` runs it (``cli/serve.py``): with its
    intra-op pool, resampling a call's 20 ms frame takes milliseconds on a busy machine,
    and the server's track falls behind real time."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
