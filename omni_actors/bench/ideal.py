"""The ideal latency of a scripted pipeline, from its declared numbers alone.

A pipeline of :class:`~omni_actors.actors.engines.scripted.ScriptedEngine` stages declares how
long each engine computes; everything the framework adds (messages, tasks, windows,
accounting) comes on top. Simulating the engines and the edges with zero-cost hops gives
the floor a measurement is compared against, so ``bench pipeline`` can report overhead
in milliseconds per hop instead of a bare latency nobody can judge.

The simulation is exact for the rules the engines and outlets follow:

- the entry stage gets the request's one input (text: one row) at ``t = 0``;
- an entry-mode engine (no ``outputs_per_input``) waits for the end of its input, then
  yields ``outputs`` outputs, the first ``first_output_s`` later, each next one
  ``per_output_s`` after the previous;
- a streaming engine (``outputs_per_input``) takes inputs in arrival order, each at the
  later of its arrival and the end of the previous input's outputs, and yields
  ``outputs_per_input`` outputs per new row; the session's first output waits
  ``first_output_s``, every other ``per_output_s``;
- a ``stream`` edge delivers each output when produced (one row per output, or
  ``audio_samples`` rows for audio); a windowed one delivers ``initial_frames`` rows,
  then ``frames`` rows at a time, and the partial rest when the upstream finishes;
- a ``full`` edge delivers one input holding every output's rows (merged by the
  receiver's accumulate rules) when the upstream finishes;
- a stage finishes at the later of its last output and the end of its inputs.

Stages are visited in topological order: a DAG has no feedback, so one pass is exact.
Each time also carries how many engine sleeps its critical path holds: a scripted
engine sleeps each latency relative to when it woke, so a timer's overshoot (a fraction
of a millisecond) is paid once per sleep on that path, not once per hop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from omni_actors.actors.engines.scripted import ScriptedArgs
from omni_actors.errors import OmniError
from omni_actors.pipeline.spec.pipeline import EdgeSpec, PipelineSpec

__all__ = ["IdealTimes", "IdealUnavailableError", "ideal_times", "path_hops"]

_When = tuple[float, int]  # (seconds, engine sleeps on its critical path)
_Arrival = tuple[_When, int]  # (when, new rows)


class IdealUnavailableError(OmniError, ValueError):
    """The pipeline's ideal latency cannot be derived (e.g. a stage is not scripted)."""


@dataclass(frozen=True, slots=True)
class IdealTimes:
    """What a pipeline would achieve if every hop were free, in seconds from the request.

    Attributes:
        ttfa_s: the audio stage's first output (time to first audio).
        e2e_s: the audio stage's last output.
        audio_s: seconds of audio produced.
        hops: hops on the path to the first audio (see :func:`path_hops`).
        ttfa_sleeps: engine sleeps on the critical path to the first audio.
        outputs: per stage, the time of each of its outputs.
    """

    ttfa_s: float
    e2e_s: float
    audio_s: float
    hops: int
    ttfa_sleeps: int
    outputs: dict[str, list[float]]

    @property
    def rtf(self) -> float:
        """Real-time factor of the ideal run (time to the last audio / audio seconds)."""
        return self.e2e_s / self.audio_s


@dataclass(slots=True)
class _Stage:
    """One stage's simulated timeline: inputs received, outputs produced."""

    engine: ScriptedArgs
    inputs: list[_Arrival]
    inputs_end: _When = (0.0, 0)
    outputs: tuple[_When, ...] = ()
    finish: _When = (0.0, 0)


def _engines(spec: PipelineSpec, names: list[str]) -> dict[str, ScriptedArgs]:
    engines: dict[str, ScriptedArgs] = {}
    for name in names:
        engine = spec.stage(name).engine
        if engine.kind != "scripted":
            raise IdealUnavailableError(
                f"pipeline {spec.name}: stage {name} runs a {engine.kind!r} engine; the ideal "
                "latency is only known for stages whose engine kind is 'scripted'"
            )
        engines[name] = ScriptedArgs.model_validate(engine.args)  # checked by the spec
    return engines


def _rows(engine: ScriptedArgs, field: str) -> int:
    """Rows (dim 0) of one output's ``field``: 1, or the samples of an audio output."""
    return engine.audio_samples if field == "audio" else 1


def _produce(stage: _Stage) -> None:
    """Fill in the stage's output times and finish from its inputs."""
    engine = stage.engine
    first, per = engine.first_output_s, engine.per_output_s
    times: list[_When] = []
    if engine.outputs_per_input is None:
        t, sleeps = stage.inputs_end
        for k in range(engine.outputs):
            t, sleeps = t + (first if k == 0 else per), sleeps + 1
            times.append((t, sleeps))
    else:
        free: _When = (0.0, 0)
        for arrival, rows in sorted(stage.inputs, key=lambda a: a[0][0]):
            # Later of the two; on a tie, the longer chain (its overshoot makes it later).
            t, sleeps = max(arrival, free)
            for _ in range(engine.outputs_per_input * rows):
                t, sleeps = t + (first if not times else per), sleeps + 1
                times.append((t, sleeps))
            free = (t, sleeps)
    stage.outputs = tuple(times)
    stage.finish = max([stage.inputs_end, *times])


def _deliver(
    edge: EdgeSpec, fields: tuple[str, ...], up: _Stage, accumulate: Mapping[str, str]
) -> list[_Arrival]:
    """The inputs ``edge`` (carrying ``fields``) hands its receiver, given the upstream's
    outputs."""
    carried = set(fields) & set(up.engine.fields)
    if not carried or not up.outputs:
        return []
    tensors = carried - {"text"}  # text alone counts one row (see ``input_rows``)
    rows = max((_rows(up.engine, f) for f in tensors), default=1)
    if edge.mode == "full":
        merged = max(
            (
                _rows(up.engine, f) * (1 if accumulate.get(f) == "replace" else len(up.outputs))
                for f in tensors
            ),
            default=1,
        )
        return [(up.finish, merged)]
    policy = edge.chunk_policy
    if policy is None:
        return [(t, rows) for t in up.outputs]
    if not tensors:
        raise IdealUnavailableError(
            f"edge {edge.source}->{edge.to}: a chunk_policy windows tensor frames, not text"
        )
    arrivals: list[_Arrival] = []
    sizes = policy.policy()
    pending, chunks = 0, 0
    for when in up.outputs:
        pending += rows
        while True:
            size = sizes.size(chunks)
            if pending < size:
                break
            arrivals.append((when, size))
            pending -= size
            chunks += 1
    if pending:
        arrivals.append((up.finish, pending))
    return arrivals


def path_hops(spec: PipelineSpec) -> int:
    """Hops a request's data crosses before its first audio reaches the caller.

    The caller's input into the entry stage, every edge of the longest path from the
    entry to the audio stage, and the audio stage's delta to the session's owner: 4 for
    thinker -> talker -> code2wav.
    """
    audio = spec.outputs.audio
    if audio is None:
        raise IdealUnavailableError(f"pipeline {spec.name} names no audio stage")
    order = spec.stages_for(text=True, audio=True)
    depth = {name: 0 for name in order}
    for name in order:
        for edge in spec.edges:
            if edge.source == name and edge.to in depth:
                depth[edge.to] = max(depth[edge.to], depth[name] + 1)
    return depth[audio] + 2


def ideal_times(spec: PipelineSpec) -> IdealTimes:
    """Simulate a text request through ``spec`` with free hops; see the module docstring.

    Raises:
        IdealUnavailableError: a stage on the request's path is not scripted, or the
            pipeline yields no audio.
    """
    audio = spec.outputs.audio
    if audio is None:
        raise IdealUnavailableError(f"pipeline {spec.name} names no audio stage")
    order = spec.stages_for(text=True, audio=True)
    on_path = set(order)
    engines = _engines(spec, order)
    if "audio" not in engines[audio].fields:
        raise IdealUnavailableError(
            f"pipeline {spec.name}: audio stage {audio} yields no 'audio' field "
            f"(fields {list(engines[audio].fields)})"
        )
    stages = {name: _Stage(engines[name], []) for name in order}
    stages[spec.entry_stage].inputs.append(((0.0, 0), 1))
    for name in order:
        stage = stages[name]
        _produce(stage)
        for edge in spec.edges:
            if edge.source != name or edge.to not in on_path:
                continue
            down = stages[edge.to]
            fields = spec.edge_fields(edge.source, edge.to)
            down.inputs.extend(_deliver(edge, fields, stage, spec.accumulate(edge.to)))
            down.inputs_end = max(down.inputs_end, stage.finish)
    produced = stages[audio].outputs
    if not produced:
        raise IdealUnavailableError(f"pipeline {spec.name}: audio stage {audio} yields nothing")
    engine = engines[audio]
    audio_s = len(produced) * engine.audio_samples / spec.outputs.sample_rate
    return IdealTimes(
        ttfa_s=produced[0][0],
        e2e_s=produced[-1][0],
        audio_s=audio_s,
        hops=path_hops(spec),
        ttfa_sleeps=produced[0][1],
        outputs={name: [t for t, _ in s.outputs] for name, s in stages.items()},
    )
