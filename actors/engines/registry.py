"""Engines by kind: the one place a pipeline's ``engine.kind`` becomes a class.

A kind is found, in order, among:

- engines registered under the entry point group ``omni_actors.engines`` (``scripted``
  is registered so by this package; a third-party package adds its own the same way);
- the engines of the installed model families (``omni_actors.families``, see
  :mod:`omni_actors.models.family`): ``qwen3-omni.thinker``, …;
- an import path, ``package.module:Class``: a voice-agent developer's own engine,
  used without registering anything.

The class is read for its declaration (see :mod:`omni_actors.actors.engines.contract`): its
``Args`` model validates a stage's ``engine.args``, its ports say what it takes and
yields. Nothing is imported until a pipeline names the kind.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from omni_actors.actors.engines.contract import RULES, Engine, Ports
from omni_actors.errors import MissingExtraError, OmniError
from omni_actors.models.family import model_families

__all__ = [
    "ENGINE_ENTRY_POINTS",
    "EngineArgsError",
    "EngineType",
    "EngineUnavailableError",
    "NoArgs",
    "build_engine",
    "describe_args_error",
    "engine_kinds",
    "engine_type",
    "protocol_problems",
]

ENGINE_ENTRY_POINTS = "omni_actors.engines"


class EngineUnavailableError(OmniError):
    """A pipeline names an engine kind this installation cannot run: unknown, not
    available yet, not importable, or a class whose declaration is malformed."""


class EngineArgsError(OmniError, ValueError):
    """An engine rejected a stage's ``engine.args``; the message names each field."""


class NoArgs(BaseModel):
    """The ``Args`` of an engine that declares none: it takes no arguments."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True, slots=True)
class EngineType:
    """An engine class found by kind, with its declaration read and checked.

    Attributes:
        kind: the kind it was found by (a registered name or an import path).
        cls: the engine class.
        args_model: its ``Args`` (:class:`NoArgs` when it declares none).
    """

    kind: str
    cls: type[Any]
    args_model: type[BaseModel]

    def args(self, raw: Mapping[str, Any]) -> BaseModel:
        """``raw`` (a stage's ``engine.args``) validated by the engine's ``Args``.

        Raises:
            pydantic.ValidationError: each rejected field (see :func:`describe_args_error`).
        """
        return self.args_model.model_validate(dict(raw))

    def ports(self, args: BaseModel) -> Ports:
        """What the engine takes and yields with these arguments.

        Raises:
            EngineUnavailableError: the class declares its ports wrongly.
            ValueError: the arguments make no sense together (the engine says why).
        """
        declare = getattr(self.cls, "ports", None)
        if callable(declare):
            ports = declare(args)
            if not isinstance(ports, Ports):
                raise self._malformed(f"ports() returned {type(ports).__name__}, not Ports")
        else:
            ports = Ports(
                inputs=self._rules("inputs"),
                outputs=self._rules("outputs"),
                streams_input=getattr(self.cls, "streams_input", True),
                audio_rate=getattr(self.cls, "audio_rate", None),
                host_inputs=frozenset(getattr(self.cls, "host_inputs", ())),
            )
        for side in (ports.inputs, ports.outputs):
            bad = {f: r for f, r in side.items() if r not in RULES or not isinstance(f, str)}
            if bad:
                raise self._malformed(f"fields {bad} need a rule of {' or '.join(RULES)}")
        if not ports.host_inputs <= ports.inputs.keys():
            apart = sorted(ports.host_inputs - ports.inputs.keys())
            raise self._malformed(f"host_inputs {apart} are not among its inputs")
        if not isinstance(ports.streams_input, bool):
            raise self._malformed("streams_input must be True or False")
        rate = ports.audio_rate
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or rate < 1):
            raise self._malformed(f"audio_rate must be a positive int (Hz) or None, got {rate!r}")
        return ports

    def check_protocol(self) -> None:
        """Refuse a class that cannot serve as an engine (:func:`protocol_problems`).

        Raises:
            EngineUnavailableError: every method it lacks or that does not fit, named.
        """
        problems = protocol_problems(self.cls)
        if problems:
            raise self._malformed(f"not an engine: {'; '.join(problems)}")

    def build(self, args: BaseModel) -> Engine:
        """A new engine with these (validated) arguments."""
        engine: Engine = self.cls(args)
        return engine

    def _rules(self, name: str) -> Mapping[str, Any]:
        rules = getattr(self.cls, name, None)
        if not isinstance(rules, Mapping):
            raise self._malformed(
                f"declare {name} = {{field: 'concat' | 'replace', ...}}, or a ports() classmethod"
            )
        return rules

    def _malformed(self, problem: str) -> EngineUnavailableError:
        where = f"{self.cls.__module__}.{self.cls.__qualname__}"
        return EngineUnavailableError(
            f"engine {self.kind!r} ({where}): {problem} (see omni_actors.actors.engines.contract)"
        )


@functools.cache
def engine_kinds() -> dict[str, str]:
    """Every registered kind -> the ``package.module:Class`` it names."""
    kinds = {point.name: point.value for point in entry_points(group=ENGINE_ENTRY_POINTS)}
    for family in model_families().values():
        kinds.update(family.engines)
    return kinds


@functools.cache
def engine_type(kind: str) -> EngineType:
    """The engine class of ``kind``, its declaration checked.

    Raises:
        EngineUnavailableError: unknown kind (the message lists the known ones), a kind
            not available yet, a class that cannot be imported or declares itself wrongly.
    """
    path = engine_kinds().get(kind)
    if path is None:
        if ":" not in kind:
            known = ", ".join(sorted(engine_kinds()))
            raise EngineUnavailableError(
                f"unknown engine kind {kind!r}; known: {known}. Name your own engine class "
                "as package.module:Class, or register it under the entry point group "
                f"{ENGINE_ENTRY_POINTS} (and reinstall the package that declares it)"
            )
        path = kind
    cls = _import(kind, path)
    declared = getattr(cls, "kind", None)
    if path != kind and declared != kind:
        raise EngineUnavailableError(
            f"engine kind {kind!r} is registered as {path}, whose class declares "
            f"kind = {declared!r}; make them the same"
        )
    args_model = getattr(cls, "Args", NoArgs)
    if not (isinstance(args_model, type) and issubclass(args_model, BaseModel)):
        raise EngineUnavailableError(
            f"engine {kind!r} ({path}): Args must be a pydantic BaseModel subclass, "
            f"got {args_model!r}"
        )
    return EngineType(kind, cls, _strict(args_model))


def _strict(model: type[BaseModel]) -> type[BaseModel]:
    """``model``, refusing keys it does not declare unless it says otherwise.

    pydantic ignores unknown keys by default, so a typo in a stage's ``engine.args``
    (``gian: 0.8``) would run with the default silently; the built-in engines forbid
    extra keys, and a user's ``Args`` that leaves ``extra`` unset gets the same. The
    engine gets an instance of a subclass of its model, named as it is.
    """
    if model.model_config.get("extra") is not None:
        return model  # the engine chose (``allow`` takes free-form arguments)
    namespace = {
        "__module__": model.__module__,
        "__qualname__": model.__qualname__,
        "__doc__": model.__doc__,
        "model_config": ConfigDict(extra="forbid"),
    }
    strict: type[BaseModel] = type(model.__name__, (model,), namespace)
    return strict


_LIFECYCLE = {
    "start": "async def start(self) -> None",
    "abort": "async def abort(self, session: str) -> None",
    "release": "async def release(self, session: str) -> None",
    "stop": "async def stop(self) -> None",
}
_GENERATE = (
    "async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]"
)


def protocol_problems(cls: type[Any]) -> list[str]:
    """What keeps ``cls`` from serving as an engine (``contract.Engine``): each method it
    lacks, a ``generate`` that does not yield outputs as they come, a lifecycle method
    the stage cannot await. Checked when a stage builds its engine, as the pipeline
    starts: any of them would otherwise fail only once a session reaches it.
    """
    problems = []
    generate = getattr(cls, "generate", None)
    if not callable(generate):
        problems.append(f"it has no generate() method: define {_GENERATE}, yielding outputs")
    else:
        plain = inspect.unwrap(generate)
        if inspect.isgeneratorfunction(plain):
            problems.append(
                "generate() is a plain generator (def ... yield): the stage reads it "
                f"while its input still arrives; make it {_GENERATE}"
            )
        elif inspect.iscoroutinefunction(plain):
            problems.append(
                "generate() is async but never yields: it returns one result, not "
                "outputs as they come; yield each output (async def generate(...): "
                "... yield {field: value})"
            )
    for name, signature in _LIFECYCLE.items():
        method = getattr(cls, name, None)
        if not callable(method):
            problems.append(f"it has no {name}() method: define {signature}")
            continue
        plain = inspect.unwrap(method)
        if inspect.isfunction(plain) and not inspect.iscoroutinefunction(plain):
            problems.append(f"{name}() is not async: the stage awaits it; make it {signature}")
    return problems


def _import(kind: str, path: str) -> type[Any]:
    module_name, _, qualname = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except MissingExtraError as exc:  # installed, but without the extra it needs
        raise EngineUnavailableError(f"engine {kind!r}: {exc}") from None
    except (ImportError, AttributeError) as exc:
        raise EngineUnavailableError(
            f"engine {kind!r}: cannot import {path} ({type(exc).__name__}: {exc}); "
            "check that its module is installed or on the Python path"
        ) from None
    if not isinstance(obj, type):
        raise EngineUnavailableError(f"engine {kind!r}: {path} is not a class")
    return obj


def describe_args_error(
    where: str, exc: ValidationError, found: EngineType | None = None
) -> list[str]:
    """One line per rejected argument: ``stages[talker].engine.args.frames_per_token: ...``;
    an unknown one says which ``found`` takes."""
    lines = []
    for error in exc.errors():
        loc = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in error["loc"])
        line = f"{where}.args{loc}: {error['msg']}"
        if found is not None and error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
            names = ", ".join(sorted(found.args_model.model_fields))
            line += f" ({found.kind} takes {names or 'no arguments'})"
        lines.append(line)
    return lines


def build_engine(kind: str, args: Mapping[str, Any], *, where: str = "engine") -> Engine:
    """Construct the engine of ``kind`` from a stage's ``engine.args``.

    Args:
        kind: a registered kind or ``package.module:Class``.
        args: the stage's ``engine.args``.
        where: how errors name the stage (``stages[talker].engine``).

    Raises:
        EngineUnavailableError: see :func:`engine_type`; or the class lacks a method of
            the engine protocol, or has one that does not fit it
            (:meth:`EngineType.check_protocol`); or its ports are malformed.
        EngineArgsError: the engine's ``Args`` reject ``args`` (one line per field), or
            its ports do not accept them.
    """
    found = engine_type(kind)
    found.check_protocol()  # at load: a missing method would fail only once a session ran
    try:
        validated = found.args(args)
    except ValidationError as exc:
        raise EngineArgsError("; ".join(describe_args_error(where, exc, found))) from None
    try:
        found.ports(validated)  # the declaration is checked where the engine runs, too
    except EngineUnavailableError:
        raise
    except ValueError as exc:
        raise EngineArgsError(f"{where}.args: {exc}") from None
    return found.build(validated)
