"""``VoiceMap``: the voice names a caller may send, and the model speaker each one means.

One map serves the library and the server alike: ``OmniPipeline.voices()`` builds it
(``Session.respond(voice=...)`` checks a voice there before anything is sent), and the
server's routes read the same one.

Apps written for OpenAI name OpenAI's voices (``alloy``, ``nova`` …); a model speaks
with its own speakers (Qwen3-Omni's talker: the release's ``speaker_id`` names). The
server learns the speakers from the pipeline — each stage reports the voices its engine
speaks with (``OmniPipeline.health()``), so nothing here knows a model's names — and
takes a voice name to a speaker:

- a speaker's own name (any case) is that speaker;
- a name of the map (``OmniPipeline(voice_map=...)``, ``omni-actors serve --voice-map
  alloy=ethan``) is its speaker;
- by default every OpenAI voice name (:data:`OPENAI_VOICES`) is mapped, spread over the
  speakers in turn (sorted names; the first OpenAI voice to the first speaker), so each
  works and two voices an app tells apart are told apart where the model can;
- any other name is refused where it is set, with the names accepted.

A pipeline whose stages declare no voices (text only, or a talker without speakers)
takes a voice name as it comes, as it always has: there is nothing to check it against.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from omni_actors.errors import InvalidRequestError, OmniError
from omni_actors.protocols.control import PipelineHealth

__all__ = [
    "ANY_VOICE",
    "OPENAI_VOICES",
    "UnknownVoiceError",
    "VoiceMap",
    "VoiceMapError",
    "pipeline_voices",
]

OPENAI_VOICES: Final = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "onyx",
    "nova",
    "sage",
    "shimmer",
    "verse",
    "marin",
    "cedar",
)
"""Every voice name of OpenAI's realtime and speech APIs, in the order OpenAI lists them."""


class UnknownVoiceError(InvalidRequestError):
    """A voice name that is neither a speaker nor mapped to one; nothing was changed."""


class VoiceMapError(OmniError, ValueError):
    """A voice map the server cannot use (a name mapped to no speaker of the model)."""


@dataclass(frozen=True, slots=True)
class VoiceMap:
    """The voice names a server takes (see the module docstring).

    Attributes:
        speakers: the model's speakers, sorted; empty when the pipeline declares none
            (any voice name then goes to the pipeline as sent).
        aliases: other names (lower case) and the speaker each one means.
        default: the speaker a reply naming no voice speaks with, when a stage tells.
    """

    speakers: tuple[str, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=dict)
    default: str | None = None

    @classmethod
    def of(
        cls,
        speakers: Iterable[str],
        configured: Mapping[str, str] | None = None,
        default: str | None = None,
    ) -> VoiceMap:
        """The map of a model with ``speakers``: OpenAI's voice names spread over them,
        then the ``configured`` names (which win); ``default``: the speaker a reply
        naming no voice speaks with.

        Raises:
            VoiceMapError: a configured name maps to no speaker, or there are no
                speakers to map to.
        """
        names = tuple(sorted(set(speakers)))
        configured = configured or {}
        if not names:
            if configured:
                raise VoiceMapError(
                    f"the voice map names {', '.join(sorted(configured))}, but the pipeline "
                    "has no stage that speaks with voices; drop --voice-map"
                )
            return cls()
        by_name = {name.lower(): name for name in names}
        aliases = {
            voice: names[i % len(names)]
            for i, voice in enumerate(OPENAI_VOICES)
            if voice not in by_name
        }
        for alias, speaker in configured.items():
            target = by_name.get(speaker.lower())
            if target is None:
                raise VoiceMapError(
                    f"the voice map takes {alias!r} to {speaker!r}, which is not one of the "
                    f"model's voices ({', '.join(names)})"
                )
            aliases[alias.lower()] = target
        return cls(speakers=names, aliases=aliases, default=default)

    @property
    def accepted(self) -> list[str]:
        """Every name taken: the speakers, then the other names, each sorted."""
        return [*self.speakers, *sorted(set(self.aliases) - {s.lower() for s in self.speakers})]

    def speaker(self, voice: str) -> str:
        """The speaker ``voice`` names (``voice`` itself when no speakers are declared).

        Raises:
            UnknownVoiceError: the model has speakers and ``voice`` names none of them.
        """
        if not self.speakers:
            return voice
        key = voice.lower()
        for name in self.speakers:
            if name.lower() == key:
                return name
        speaker = self.aliases.get(key)
        if speaker is None:
            raise UnknownVoiceError(
                f"unknown voice {voice!r}: use one of {', '.join(self.accepted)}"
            )
        return speaker


ANY_VOICE: Final = VoiceMap()
"""The map of a pipeline without voices: every name goes to the pipeline as sent."""


def pipeline_voices(health: PipelineHealth) -> tuple[list[str], str | None, bool]:
    """The voices the pipeline's stages speak with, the one they speak with by default
    (None: no stage tells), and whether every stage answered (when one did not, its
    voices may be missing)."""
    voices: set[str] = set()
    default = None
    complete = True
    for stage in health.stages.values():
        if stage.state != "running" or stage.queued is None:
            complete = False
        voices.update(stage.voices or ())
        default = default or stage.voice
    return sorted(voices), default, complete
