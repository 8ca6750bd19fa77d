"""How a pipeline's stages connect, read from their engines' declarations.

Every stage's engine kind is found (:mod:`omni_actors.actors.engines.registry`) and its
arguments validated by the engine's ``Args``; every edge is checked against the two
engines' ports: each field it carries must be one the source yields and the receiver
takes, under the same accumulate rule, and a ``stream`` edge needs a receiver that takes
streamed input. An edge that names no ``fields`` carries every field both ends declare.
A stage in a worker process imports its engine class there by name, so the class must
live in an importable module, not in the script being run (``__main__``).
Problems are collected, not raised one by one, and each names the pipeline field to fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import ValidationError

from omni_actors.actors.engines.contract import Ports, Rule
from omni_actors.actors.engines.registry import (
    EngineUnavailableError,
    describe_args_error,
    engine_type,
)

if TYPE_CHECKING:
    from omni_actors.pipeline.spec.pipeline import EdgeSpec
    from omni_actors.pipeline.spec.stage import StageSpec

__all__ = ["Wiring", "WiringError", "wire"]


class WiringError(ValueError):
    """The stages' engines do not fit the pipeline; one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class Wiring:
    """What the declarations say about a valid pipeline.

    Attributes:
        ports: each stage's ports, by stage name.
        fields: the fields each edge carries, by ``(source, to)``.
    """

    ports: Mapping[str, Ports]
    fields: Mapping[tuple[str, str], tuple[str, ...]]

    def accumulate(self, stage: str) -> dict[str, Rule]:
        """``stage``'s input rules: how a ``full`` edge merges a payload for it."""
        return dict(self.ports[stage].inputs)


def wire(stages: Sequence[StageSpec], edges: Sequence[EdgeSpec]) -> Wiring:
    """Resolve every stage's engine and check every edge; see the module docstring.

    Raises:
        WiringError: every problem found, each naming its field
            (``stages[talker].engine.args.frames_per_token: ...``).
    """
    problems: list[str] = []
    ports: dict[str, Ports] = {}
    for stage in stages:
        where = f"stages[{stage.name}].engine"
        try:
            found = engine_type(stage.engine.kind)
        except EngineUnavailableError as exc:
            problems.append(f"{where}.kind: {exc}")
            continue
        if stage.process and found.cls.__module__ == "__main__":
            problems.append(
                f"{where}.kind: engine class {found.cls.__qualname__} is defined in __main__ "
                "(the script being run), and a worker process cannot import it from there; "
                "move it into a module of its own (name it module:Class), or run the stage "
                "in this process (process: false)"
            )
            continue
        placed = stage.device is not None or stage.devices is not None
        if placed and "device" not in found.args_model.model_fields:
            field = "device" if stage.devices is None else "devices"
            problems.append(
                f"stages[{stage.name}].{field}: engine {stage.engine.kind!r} takes no device "
                f"(it places itself); remove the stage's {field}"
            )
            continue
        try:
            args = found.args(stage.engine.args)
        except ValidationError as exc:
            problems.extend(describe_args_error(where, exc, found))
            continue
        try:
            ports[stage.name] = found.ports(args)
        except EngineUnavailableError as exc:
            problems.append(f"{where}.kind: {exc}")
        except ValueError as exc:
            problems.append(f"{where}.args: {exc}")
    kinds = {s.name: s.engine.kind for s in stages}
    fields: dict[tuple[str, str], tuple[str, ...]] = {}
    for edge in edges:
        if edge.source in ports and edge.to in ports:
            carried = _check_edge(edge, ports[edge.source], ports[edge.to], kinds, problems)
            fields[(edge.source, edge.to)] = carried
    if problems:
        raise WiringError(problems)
    return Wiring(ports, fields)


def _check_edge(
    edge: EdgeSpec, up: Ports, down: Ports, kinds: Mapping[str, str], problems: list[str]
) -> tuple[str, ...]:
    """The fields ``edge`` carries; what is wrong with it goes to ``problems``."""
    where = f"edges[{edge.source}->{edge.to}]"
    source = f"{edge.source} ({kinds[edge.source]})"
    to = f"{edge.to} ({kinds[edge.to]})"
    if edge.fields is None:
        carried = tuple(f for f in up.outputs if f in down.inputs)
        if not carried:
            problems.append(
                f"{where}.fields: {source} yields nothing {to} takes "
                f"({edge.source} yields {_names(up.outputs)}; {edge.to} takes "
                f"{_names(down.inputs)})"
            )
    else:
        carried = edge.fields
    for name in carried:
        if name not in up.outputs:
            problems.append(
                f"{where}.fields: {source} does not yield {name!r} (it yields {_names(up.outputs)})"
            )
        elif name not in down.inputs:
            problems.append(
                f"{where}.fields: {to} does not take {name!r} (it takes {_names(down.inputs)})"
            )
        elif up.outputs[name] != down.inputs[name]:
            problems.append(
                f"{where}.fields: {name!r} is {up.outputs[name]} as {edge.source}'s output "
                f"but {down.inputs[name]} as {edge.to}'s input; the engines must declare "
                "one accumulate rule"
            )
    if edge.mode == "stream" and not down.streams_input:
        problems.append(
            f"{where}.mode: {to} cannot take streamed input; use mode: full on this edge"
        )
    if edge.chunk_policy is not None and len(carried) != 1:
        problems.append(
            f"{where}.chunk_policy: windows one field of codec frames, but the edge carries "
            f"{list(carried)}; name that one field in fields"
        )
    return carried


def _names(fields: Mapping[str, Rule]) -> str:
    return ", ".join(fields) or "nothing"
