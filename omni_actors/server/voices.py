"""``--voice-map``: the voice names a deployment adds to the pipeline's
(:mod:`omni_actors.pipeline.voices`, whose map the server and the library share)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import yaml

from omni_actors.pipeline.voices import (
    ANY_VOICE,
    OPENAI_VOICES,
    UnknownVoiceError,
    VoiceMap,
    VoiceMapError,
    pipeline_voices,
)

__all__ = [
    "ANY_VOICE",
    "OPENAI_VOICES",
    "UnknownVoiceError",
    "VoiceMap",
    "VoiceMapError",
    "parse_voice_map",
    "pipeline_voices",
]


def parse_voice_map(entries: Iterable[str]) -> dict[str, str]:
    """``--voice-map`` values: ``NAME=SPEAKER`` pairs, or paths of YAML/JSON files holding
    a mapping of names to speakers; later entries win.

    Raises:
        VoiceMapError: an entry is neither, or a file does not hold such a mapping.
    """
    found: dict[str, str] = {}
    for entry in entries:
        name, sep, speaker = entry.partition("=")
        if sep:
            if not name.strip() or not speaker.strip():
                raise VoiceMapError(f"--voice-map {entry!r}: write NAME=SPEAKER, e.g. alloy=ethan")
            found[name.strip()] = speaker.strip()
            continue
        path = Path(entry)
        if not path.is_file():
            raise VoiceMapError(
                f"--voice-map {entry!r} is neither NAME=SPEAKER nor a YAML/JSON file"
            )
        text = path.read_text()
        try:
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise VoiceMapError(f"--voice-map {entry}: cannot parse it ({exc})") from None
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in data.items()
        ):
            raise VoiceMapError(
                f"--voice-map {entry}: the file must hold a mapping of voice names to "
                "speakers, e.g. {alloy: ethan, nova: chelsie}"
            )
        found.update(data)
    return found
