"""What a stage takes from its engine: mappings of the fields the engine declares.

Each outlet sends only the fields its edge carries, so a field an engine yields but
never declared would be dropped without a word (a typo, or a declaration forgotten),
and an output that is not a mapping, or a value that is not a tensor or a text, would
fail deep in the routing (or in the caller's events) with an error that names neither
the engine nor the mistake; audio that is not mono float32 samples would reach the
caller as it is. The stage checks every output against the engine's declared outputs
before routing it, and fails the reply at the first one that does not fit, with an
error that says what to change.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import torch

from omni_actors.errors import EngineError

__all__ = ["AUDIO_FIELD", "EngineOutputError", "output_error", "values_fit"]

AUDIO_FIELD = "audio"
"""The field of audio samples: a 1-D float32 tensor of mono samples in [-1, 1]."""


class EngineOutputError(EngineError, TypeError):
    """An engine yielded an output its declaration does not allow (see the module
    docstring); it fails the reply it was part of, with code ``engine_error``."""


def values_fit(output: Mapping[str, object]) -> bool:
    """Whether every value of ``output`` is one a stage sends: a tensor or a str, and
    audio as mono float32 samples (run on every output: :func:`output_error` says why
    one does not fit)."""
    for value in output.values():
        if type(value) is not str and not isinstance(value, torch.Tensor):
            return False
    audio = output.get(AUDIO_FIELD)
    return audio is None or (
        isinstance(audio, torch.Tensor) and audio.dtype == torch.float32 and audio.dim() == 1
    )


def output_error(
    engine: object, output: object, declared: Collection[str]
) -> EngineOutputError | None:
    """What is wrong with ``output`` of ``engine``, which declares ``declared``; None if
    nothing is."""
    cls = type(engine)
    name = f"{cls.__module__}:{cls.__qualname__}"
    if not isinstance(output, Mapping):
        example = next(iter(declared), "text")
        return EngineOutputError(
            f"engine {name} yielded a {type(output).__name__}; generate() must yield dicts "
            f"of declared fields, e.g. {{{example!r}: ...}}"
        )
    extra = [field for field in output if field not in declared]
    if extra:
        fields = ", ".join(repr(field) for field in extra)
        return EngineOutputError(
            f"engine {name} yielded field{'s' if len(extra) > 1 else ''} {fields}, which it "
            f"does not declare (it declares outputs {sorted(declared)}); declare it in "
            "outputs = {field: rule, ...} (or in the Ports its ports() returns) or stop "
            "yielding it"
        )
    for field, value in output.items():
        problem = _value_problem(field, value)
        if problem is not None:
            return EngineOutputError(f"engine {name} yielded field {field!r} as {problem}")
    return None


def _value_problem(field: object, value: object) -> str | None:
    """What is wrong with ``value`` of ``field`` (the rest of a sentence), or None."""
    audio = "audio is mono samples in [-1, 1], a 1-D torch.float32 tensor"
    if isinstance(value, torch.Tensor):
        mono, float32 = value.dim() == 1, value.dtype == torch.float32
        if field != AUDIO_FIELD or (mono and float32):
            return None
        if not mono:
            fix = "one channel of it (audio[0], or audio.mean(0) to mix its channels)"
            if not float32:
                fix += " as float32: audio.mean(0).to(torch.float32)"
        else:
            fix = "audio.to(torch.float32)"
        got = f"a {value.dim()}-D {value.dtype} tensor of shape {tuple(value.shape)}"
        return f"{got}; {audio}: yield {fix}"
    if isinstance(value, str):
        return None if field != AUDIO_FIELD else f"a str; {audio}"
    if value is None:
        return "None; a field's value is a torch.Tensor or a str: leave the field out instead"
    kind = type(value)
    shown = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    if shown == "numpy.ndarray":
        fix = "yield torch.from_numpy(value) (numpy arrays do not travel between stages)"
    elif kind.__module__ == "numpy" or isinstance(value, list | tuple | int | float | bool):
        fix = "yield torch.tensor(value)"
    else:
        fix = "convert it to one"
    article = "an" if shown[:1].lower() in "aeio" else "a"
    return f"{article} {shown}; a field's value is a torch.Tensor or a str: {fix}"
