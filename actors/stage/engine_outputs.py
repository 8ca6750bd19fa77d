"""What a stage takes from its engine: mappings of the fields the engine declares.

Each outlet sends only the fields its edge carries, so a field an engine yields but
never declared would be dropped without a word (a typo, or a declaration forgotten),
and an output that is not a mapping would fail deep in the routing with an error that
names neither the engine nor the mistake. The stage checks every output against the
engine's declared outputs before routing it, and fails the reply at the first one that
does not fit, with an error that says what to change.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from omni_actors.errors import EngineError

__all__ = ["EngineOutputError", "output_error"]


class EngineOutputError(EngineError, TypeError):
    """An engine yielded an output its declaration does not allow (see the module
    docstring); it fails the reply it was part of, with code ``engine_error``."""


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
    if not extra:
        return None
    fields = ", ".join(repr(field) for field in extra)
    return EngineOutputError(
        f"engine {name} yielded field{'s' if len(extra) > 1 else ''} {fields}, which it "
        f"does not declare (it declares outputs {sorted(declared)}); declare it in "
        "outputs = {field: rule, ...} (or in the Ports its ports() returns) or stop "
        "yielding it"
    )
