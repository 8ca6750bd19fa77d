"""What the tests of other frameworks' realtime clients share: a server slow enough to
barge in on, and a caller's audio.

A reply of ``scripted-omni`` is written in a fraction of a second, faster than a caller
could speak over it; ``SLOW`` writes the same reply (32 text pieces, 5.12 s of audio)
over about 3 s, so speech sent once its first audio has arrived lands while the reply
is still being written, as a user's barge-in does.
"""

from __future__ import annotations

from typing import Any

from omni_actors.pipeline.spec.pipeline import PipelineSpec, load_pipeline

KEY = "test-key"
MODEL = "scripted-omni"
REPLY_AUDIO_BYTES = 245_760  # a whole reply: 5.12 s of PCM16 at 24 kHz


def _slow() -> PipelineSpec:
    spec: dict[str, Any] = load_pipeline(MODEL).model_dump(by_alias=True, exclude_unset=True)
    thinker = next(s for s in spec["stages"] if s["name"] == "thinker")
    thinker["engine"]["args"]["per_output_s"] = 0.1
    return PipelineSpec.model_validate(spec)


SLOW = _slow()
