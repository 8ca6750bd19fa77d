"""Pipeline definitions: a DAG of stages in YAML, validated by pydantic.

A pipeline file names its stages (engine kind and arguments, process placement,
replicas, restart type), the edges between them (``stream``: chunks flow as they are
produced; ``full``: one payload after the upstream finishes), which stage yields text and
which yields audio, how failed stages are restarted, the deadlines of every wait and the
flow control of every stream.
Fields and accumulate rules are not repeated here: each engine declares them, and
validation checks every edge against the declarations of its two ends
(:mod:`omni_actors.pipeline.spec.wiring`). Errors name the file, the field and what is
allowed. Presets ship inside the package and load by name.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, PrivateAttr, ValidationError, model_validator

from omni_actors.actors.engines.contract import REPLY_FIELD, Ports, Rule
from omni_actors.actors.engines.registry import engine_type
from omni_actors.actors.engines.torch_engine import DEVICE_PATTERN
from omni_actors.actors.stage.chunk_policy import ChunkPolicy
from omni_actors.errors import OmniError
from omni_actors.models.family import ModelFamily, family_of_engine
from omni_actors.pipeline.spec.base import Spec
from omni_actors.pipeline.spec.cluster import (
    ClusterSpec,
    RayClusterSpec,
)
from omni_actors.pipeline.spec.graph import StageGraph, few
from omni_actors.pipeline.spec.stage import NAME_PATTERN, StageSpec
from omni_actors.pipeline.spec.wiring import Wiring, wire
from omni_actors.pipeline.spec.yaml_reader import YamlLimitError, parse_yaml, read_limited
from omni_actors.protocols.control import DEFAULT_WINDOW, EdgeMode

__all__ = [
    "ChunkPolicySpec",
    "DeadlinesSpec",
    "EdgeSpec",
    "FlowSpec",
    "OutputsSpec",
    "PipelineConfigError",
    "PipelineSpec",
    "SupervisionSpec",
    "load_pipeline",
    "preset_names",
]


class PipelineConfigError(OmniError, ValueError):
    """A pipeline definition is invalid; the message lists every problem found."""


class SupervisionSpec(Spec):
    """How the pipeline restarts failed stages: one restart intensity for all of them.

    Intensity belongs to the supervisor (as in OTP, where it is a supervisor flag and a
    child spec has only its restart type): the orchestrator supervises every stage, so
    more than ``max_restarts`` restarts of any stages within ``period_s`` stop the
    pipeline. Each restart waits an exponential backoff between the two bounds.
    """

    max_restarts: int = Field(3, ge=0)
    period_s: float = Field(5.0, gt=0)
    backoff_min_s: float = Field(0.05, ge=0)
    backoff_max_s: float = Field(5.0, ge=0)

    @model_validator(mode="after")
    def _check_backoff(self) -> SupervisionSpec:
        if self.backoff_max_s < self.backoff_min_s:
            raise ValueError("backoff_max_s must be >= backoff_min_s")
        return self


class ChunkPolicySpec(Spec):
    """Codec-frame windowing on an edge (see ``omni_actors.actors.stage.chunk_policy``):
    ``initial_frames`` new frames in the first chunk, then one chunk of each size in
    ``ramp``, then ``frames`` per chunk; each carries ``left_context`` frames before it."""

    initial_frames: int = Field(4, ge=1)
    frames: int = Field(25, ge=1)
    left_context: int = Field(25, ge=0)
    ramp: tuple[Annotated[int, Field(ge=1)], ...] = Field((), max_length=16)

    def policy(self) -> ChunkPolicy:
        """The policy itself."""
        return ChunkPolicy(self.initial_frames, self.frames, self.left_context, self.ramp)

    def window(self) -> tuple[int, int, int, tuple[int, ...]]:
        """The policy as a stage target carries it (``Target.window``)."""
        return (self.initial_frames, self.frames, self.left_context, self.ramp)


class EdgeSpec(Spec):
    """Data flowing from one stage to another.

    ``fields`` (default: every field the source yields and the receiver takes) narrows
    what travels on the edge. ``path`` (``auto``: chosen from the two stages' placement;
    ``host``; ``device``) is how its tensors travel (``omni_actors.pipeline.spec.edge_paths``).
    """

    source: str = Field(alias="from")
    to: str
    mode: EdgeMode = "stream"
    fields: tuple[str, ...] | None = Field(None, min_length=1)
    chunk_policy: ChunkPolicySpec | None = None
    path: Literal["auto", "host", "device"] = "auto"

    @model_validator(mode="after")
    def _check_window(self) -> EdgeSpec:
        if self.chunk_policy is not None and self.mode != "stream":
            raise ValueError("chunk_policy windows a stream edge; remove it or use mode stream")
        return self


class InputsSpec(Spec):
    """What the entry stage takes from the caller.

    ``sample_rate``: the audio rate it takes, 16000 by default (Qwen3-Omni's audio
    encoder's); audio sent at another rate (``Session.send(audio=..., sample_rate=...)``,
    ``OmniPipeline.generate(audio=..., sample_rate=...)``) is resampled to it.
    ``max_send_bytes``: the most one ``send`` may carry (its tensors' bytes plus its
    text's characters); more is refused before anything is queued, so one caller cannot
    make the pipeline hold an unbounded chunk. Send a long input in pieces.
    ``max_history_bytes``: the most of a conversation a session keeps to replay it onto
    a stage that restarted (what the caller sent, and the replies' token ids); a
    conversation past it is not replayed, and a stage failure ends it. 0 keeps nothing.
    """

    sample_rate: int = Field(16000, gt=0)
    max_send_bytes: int = Field(64 << 20, gt=0)
    max_history_bytes: int = Field(64 << 20, ge=0)


class OutputsSpec(Spec):
    """Which stage's output the caller receives as text, which as audio, and which as
    the transcript of what the caller said.

    ``transcript`` names a stage whose engine declares the transcriber's ports
    (:mod:`omni_actors.actors.engines.transcriber_ports`): one fed by the caller's input
    beside the entry stage (a fan-out: it has no edges, and the reply never waits for
    it), or the entry stage itself when it transcribes the caller for the stages after
    it (a cascade's recognizer). A session that asks for transcripts
    (``Session.transcribe``) gets one event per user turn from it.

    ``sample_rate``: the rate of the audio the caller receives (``AudioDelta.sample_rate``),
    24000 by default, as Qwen3-Omni's code2wav writes it; when the engine of the
    ``audio`` stage declares the rate it yields (``audio_rate``), that rate is the
    default, and a different value here is refused.
    """

    text: str | None = None
    audio: str | None = None
    transcript: str | None = None
    sample_rate: int = Field(24000, gt=0)


class DeadlinesSpec(Spec):
    """Seconds each wait may last before the session ends with a timeout error.

    ``admission_s`` covers waiting for a free session slot plus prewarm of every stage;
    ``first_chunk_s`` a stage's wait for a segment's first input (one-shot sessions), and
    for its engine's first output of each reply, from the last input the engine took (a
    reply that misses it fails alone, code ``timeout``; a one-shot session ends);
    ``inter_chunk_s`` the wait between two inputs, and a sender's wait for a credit
    (:class:`FlowSpec`); ``idle_s`` a resumable session's wait
    for its caller's next segment; ``total_s`` the session's whole life. ``start_s``
    is not a session's: it bounds a stage's start (its engine loading its model, a
    worker process importing torch) and a restarted stage's; a busy machine needs more.
    """

    admission_s: float = Field(5.0, gt=0)
    first_chunk_s: float = Field(30.0, gt=0)
    inter_chunk_s: float = Field(10.0, gt=0)
    idle_s: float = Field(300.0, gt=0)
    total_s: float = Field(600.0, gt=0)
    start_s: float = Field(120.0, gt=0)


class FlowSpec(Spec):
    """Flow control: how many chunks each (session, edge) stream has in flight.

    Every stream of a session — the caller's input into the entry stage, each edge, each
    output stage to the caller's events — has its own window of ``window`` chunks: a
    sender waits once that many are unconsumed (``Session.send`` too), so a slow stage,
    or a caller that stops reading, slows that session's producers and nobody else.
    A sender waits for its receiver's credit at most ``deadlines.inter_chunk_s``, then
    the session fails with code ``backpressure``.

    The bound this sets: per session, a stage holds at most ``window`` chunks of each
    stream into it (mailbox and session queue together), and the caller's event queue
    ``window`` chunks per output stage; memory is ``window`` x the chunk size of each
    edge. An engine that cannot be slowed per request keeps producing while its
    stage's outlet waits, into its own buffers: a vLLM thinker (``AsyncLLM`` decodes each
    request to its end) is bounded by the reply's ``max_tokens`` instead.
    """

    window: int = Field(DEFAULT_WINDOW, ge=1, le=65536)


class PipelineSpec(Spec):
    """A validated pipeline: stages form a DAG reachable from ``entry``, and every edge
    fits the declarations of the engines at its two ends."""

    name: str = Field(pattern=NAME_PATTERN)
    entry: str | None = None
    stages: tuple[StageSpec, ...] = Field(min_length=1)
    edges: tuple[EdgeSpec, ...] = ()
    inputs: InputsSpec = InputsSpec()
    outputs: OutputsSpec
    supervision: SupervisionSpec = SupervisionSpec()
    deadlines: DeadlinesSpec = DeadlinesSpec()
    flow: FlowSpec = FlowSpec()
    cluster: ClusterSpec | None = None
    _wiring: Wiring = PrivateAttr()

    @model_validator(mode="after")
    def _check_graph(self) -> PipelineSpec:
        names = [s.name for s in self.stages]
        duplicates = sorted(n for n, count in Counter(names).items() if count > 1)
        if duplicates:
            raise ValueError(f"stage names must be unique; repeated: {few(duplicates)}")
        known = set(names)
        entry = self.entry or names[0]
        if entry not in known:
            raise ValueError(f"entry {entry!r} is not a stage; stages: {few(names)}")
        seen_edges = set()
        for edge in self.edges:
            for end in (edge.source, edge.to):
                if end not in known:
                    raise ValueError(f"edge {edge.source}->{edge.to}: no stage {end!r}")
            if edge.source == edge.to:
                raise ValueError(f"edge {edge.source}->{edge.to} loops onto itself")
            if (edge.source, edge.to) in seen_edges:
                raise ValueError(f"edge {edge.source}->{edge.to} is declared twice")
            seen_edges.add((edge.source, edge.to))
        transcriber = self.outputs.transcript
        if transcriber is not None:
            _check_transcriber(transcriber, entry, self.edges, names)
            if transcriber in (self.outputs.text, self.outputs.audio):
                # The caller takes a stage's chunks as transcripts or as a reply, not both.
                raise ValueError(
                    f"outputs.transcript: stage {transcriber!r} is an output of the reply "
                    "too; name a stage that yields the transcript alone"
                )
        graph = self._graph()
        order = graph.order()
        reachable = graph.downstream(entry) | {entry, *([transcriber] if transcriber else [])}
        unreachable = [n for n in order if n not in reachable]
        if unreachable:
            raise ValueError(f"stages not reachable from entry {entry!r}: {few(unreachable)}")
        for kind in ("text", "audio"):
            stage = getattr(self.outputs, kind)
            if stage is not None and stage not in known:
                raise ValueError(f"outputs.{kind}: no stage {stage!r}; stages: {few(names)}")
        if self.outputs.text is None and self.outputs.audio is None:
            raise ValueError("outputs: name the stage that yields text, audio, or both")
        placed = [s.name for s in self.stages if s.placement is not None]
        if placed and self.cluster is None:
            raise ValueError(f"stages {few(placed)} have a placement: declare the cluster")
        self._wiring = wire(self.stages, self.edges)
        if transcriber is not None:
            _check_transcriber_ports(transcriber, self._wiring.ports[transcriber], self.stages)
        self._take_audio_rate()
        from omni_actors.pipeline.spec.edge_paths import edge_paths  # it reads these specs

        edge_paths(self)  # an edge that insists on a path it cannot have is refused here
        return self

    def _take_audio_rate(self) -> None:
        """``outputs.sample_rate`` from the audio stage's engine, when it declares one."""
        stage = self.outputs.audio
        rate = None if stage is None else self._wiring.ports[stage].audio_rate
        if rate is None or rate == self.outputs.sample_rate:
            return
        if "sample_rate" in self.outputs.model_fields_set:
            raise ValueError(
                f"outputs.sample_rate is {self.outputs.sample_rate} but the engine of stage "
                f"{stage!r} yields audio at {rate} Hz: remove outputs.sample_rate (it follows "
                "the engine) or make the two agree"
            )
        # Frozen, and still being validated: the one place the default gives way.
        object.__setattr__(self, "outputs", self.outputs.model_copy(update={"sample_rate": rate}))

    def _graph(self) -> StageGraph:
        return StageGraph([s.name for s in self.stages], ((e.source, e.to) for e in self.edges))

    def edge_fields(self, source: str, to: str) -> tuple[str, ...]:
        """The fields the edge ``source -> to`` carries (declared, or named in YAML)."""
        return self._wiring.fields[(source, to)]

    def ports(self, stage: str) -> Ports:
        """What ``stage``'s engine takes and yields, as it declares."""
        return self._wiring.ports[stage]

    def accumulate(self, stage: str) -> dict[str, Rule]:
        """``stage``'s per-field accumulate rules (its engine's input declaration)."""
        return self._wiring.accumulate(stage)

    def model_families(self) -> dict[str, ModelFamily]:
        """The model families whose engines this pipeline runs, by name."""
        found = (family_of_engine(stage.engine.kind, stage.engine.args) for stage in self.stages)
        return {family.name: family for family in found if family is not None}

    def with_weights(self, *, cache_dir: Path | None = None, seed: int = 0) -> PipelineSpec:
        """A copy whose model-family stages load the weights prepared in ``cache_dir``
        with ``seed`` (the CLI points every model stage at one cache this way)."""
        weights: dict[str, Any] = {"seed": seed}
        if cache_dir is not None:
            weights["cache_dir"] = str(cache_dir)  # a string: args cross to worker processes
        data = self.model_dump(by_alias=True)
        for stage in data["stages"]:
            engine = stage["engine"]
            if family_of_engine(engine["kind"], engine["args"]) is not None:
                engine["args"] = {**engine["args"], **weights}
        return PipelineSpec.model_validate(data)

    def with_full_edges(self) -> PipelineSpec:
        """A copy whose every edge is ``full`` (chunk policies dropped): the non-streaming
        baseline of this pipeline, named ``<name>-full``."""
        edges = tuple(
            edge.model_copy(update={"mode": "full", "chunk_policy": None}) for edge in self.edges
        )
        return self.model_copy(update={"name": f"{self.name}-full", "edges": edges})

    def with_process_stages(self, process: bool = True) -> PipelineSpec:
        """A copy whose every stage runs in a worker process (``process=False``: in the
        caller's), so one pipeline can be measured with and without the wire between
        its stages."""
        stages = tuple(stage.model_copy(update={"process": process}) for stage in self.stages)
        return self.model_copy(update={"stages": stages})

    def on_cluster(self, address: str) -> PipelineSpec:
        """A copy whose cluster is the Ray cluster at ``address`` (its other cluster
        settings kept); placed stages go there (``serve --cluster``).

        Raises:
            PipelineConfigError: no stage has a placement (the cluster would go unused).
        """
        if not any(stage.placement is not None for stage in self.stages):
            raise PipelineConfigError(
                f"pipeline {self.name} places no stage on a cluster; give the stages to "
                "run there a 'placement: {ray: ...}' (docs/scaling-out.md)"
            )
        cluster = self.cluster or ClusterSpec()
        ray = RayClusterSpec.model_validate({**cluster.ray.model_dump(), "address": address})
        return self.model_copy(update={"cluster": ClusterSpec(ray=ray)})

    def off_cluster(self) -> PipelineSpec:
        """A copy with no cluster: its placed stages in worker processes on this machine
        (the same processes, linked over IPC instead)."""
        stages = tuple(stage.model_copy(update={"placement": None}) for stage in self.stages)
        return self.model_copy(update={"stages": stages, "cluster": None})

    def with_model(self, model: str) -> PipelineSpec:
        """A copy whose every stage with an engine that loads a model loads ``model``: a
        release directory, a Hugging Face repo id, or a family that prepares a release.
        A transcriber beside the entry stage (``outputs.transcript``) keeps its own model.

        Raises:
            PipelineConfigError: no stage's engine loads a model.
        """
        data = self.model_dump(by_alias=True)
        placed = 0
        for stage in data["stages"]:
            if stage["name"] == self.side_transcriber:
                continue
            if "model" in engine_type(stage["engine"]["kind"]).args_model.model_fields:
                stage["engine"]["args"] = {**stage["engine"]["args"], "model": model}
                placed += 1
        if not placed:
            raise PipelineConfigError(f"pipeline {self.name}: no stage's engine loads a model")
        return PipelineSpec.model_validate(data)

    def without_transcriber(self) -> PipelineSpec:
        """A copy without the transcriber (``outputs.transcript``): for a use that never
        transcribes (one request at a time, a benchmark of replies), which then neither
        prepares nor loads the model of a transcriber beside the entry stage (an entry
        stage that transcribes stays, as the reply's). The same pipeline if it has none."""
        if self.outputs.transcript is None:
            return self
        data = self.model_dump(by_alias=True)
        data["stages"] = [s for s in data["stages"] if s["name"] != self.side_transcriber]
        data["outputs"]["transcript"] = None
        return PipelineSpec.model_validate(data)

    def on_device(self, device: str) -> PipelineSpec:
        """A copy whose every stage with an engine that takes a device computes on
        ``device`` (``cpu``, ``cuda``, ``cuda:N``, ``auto``); the others are unchanged.

        Raises:
            PipelineConfigError: no stage's engine takes a device, or ``device`` is invalid.
        """
        if re.match(DEVICE_PATTERN, device) is None:
            raise PipelineConfigError(f"device {device!r}: expected cpu, cuda, cuda:N or auto")
        data = self.model_dump(by_alias=True)
        placed = 0
        for stage in data["stages"]:
            if "device" in engine_type(stage["engine"]["kind"]).args_model.model_fields:
                stage["device"] = device
                stage["devices"] = None  # one device for every replica now
                stage["engine"]["args"].pop("device", None)
                placed += 1
        if not placed:
            raise PipelineConfigError(f"pipeline {self.name}: no stage's engine takes a device")
        try:
            return PipelineSpec.model_validate(data)
        except ValidationError as exc:
            raise PipelineConfigError(f"device {device!r}: {exc}") from None

    def stages_order(self) -> list[str]:
        """Every stage in topological order (entry first)."""
        return self._graph().order()

    @property
    def entry_stage(self) -> str:
        """The stage that receives the request's input."""
        return self.entry or self.stages[0].name

    @property
    def side_transcriber(self) -> str | None:
        """The transcriber fed by the caller's input beside the entry stage; None when
        there is none, or when the entry stage transcribes (``outputs.transcript``)."""
        name = self.outputs.transcript
        return None if name == self.entry_stage else name

    @property
    def reply_stage(self) -> str:
        """The stage that writes the conversation's replies, whose replies a session
        keeps to replay (``omni_actors.pipeline.conversation_log``): the text output
        stage when its engine takes replies back (``REPLY_FIELD``; a cascade's LLM, after
        a recognizer that passes the conversation on), else the entry stage."""
        text = self.outputs.text
        if text is not None and REPLY_FIELD in self.ports(text).inputs:
            return text
        return self.entry_stage

    def entry_inputs(self) -> frozenset[str]:
        """The fields the entry stage's engine takes from the caller: a caller checks
        here before sending an optional field (``INSTRUCTIONS_FIELD``) it may not take."""
        return frozenset(self.ports(self.entry_stage).inputs)

    def stage(self, name: str) -> StageSpec:
        """The stage called ``name``."""
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    def downstream(self, name: str) -> set[str]:
        """Every stage reachable from ``name`` (excluding it)."""
        return self._graph().downstream(name)

    def stages_for(self, *, text: bool, audio: bool, transcript: bool = False) -> list[str]:
        """Stages a request needs, in topological order: a text-only request skips audio,
        and only a session that may ask for transcripts has the transcriber."""
        targets = [
            stage
            for stage, wanted in ((self.outputs.text, text), (self.outputs.audio, audio))
            if wanted and stage is not None
        ]
        graph = self._graph()
        needed = {self.entry_stage, *targets} | graph.upstream(targets)
        if transcript and self.outputs.transcript is not None:
            needed.add(self.outputs.transcript)
        return [n for n in graph.order() if n in needed]


def _check_transcriber(
    transcriber: str, entry: str, edges: tuple[EdgeSpec, ...], names: list[str]
) -> None:
    """``outputs.transcript`` names the entry stage, or a stage the caller's input can
    fan out to."""
    if transcriber not in names:
        raise ValueError(f"outputs.transcript: no stage {transcriber!r}; stages: {few(names)}")
    if transcriber == entry:
        return  # the entry stage transcribes what it takes for the stages after it
    wired = [f"{e.source}->{e.to}" for e in edges if transcriber in (e.source, e.to)]
    if wired:
        raise ValueError(
            f"outputs.transcript: stage {transcriber!r} takes the caller's input and "
            f"gives the caller its transcript, so it has no edges; remove {few(wired)}"
        )


def _check_transcriber_ports(transcriber: str, ports: Ports, stages: tuple[StageSpec, ...]) -> None:
    """The transcriber's engine declares the transcriber's ports."""
    from omni_actors.actors.engines.transcriber_ports import (  # the contract it must meet
        TRANSCRIBER_INPUTS,
        TRANSCRIBER_OUTPUTS,
    )

    kind = next(s.engine.kind for s in stages if s.name == transcriber)
    if not ports.streams_input:
        raise ValueError(
            f"outputs.transcript: stage {transcriber!r} ({kind}) cannot take streamed "
            "input, and the caller's input streams into it"
        )
    for what, declared, contract in (
        ("take", ports.inputs, TRANSCRIBER_INPUTS),
        ("yield", ports.outputs, TRANSCRIBER_OUTPUTS),
    ):
        wrong = [
            f"{name} ({rule})" for name, rule in contract.items() if declared.get(name) != rule
        ]
        if wrong:
            raise ValueError(
                f"outputs.transcript: stage {transcriber!r} ({kind}) must {what} "
                f"{', '.join(wrong)} as a transcriber does "
                "(omni_actors.actors.engines.transcriber_ports); use a transcriber engine "
                "such as transformers.asr"
            )


def preset_names() -> list[str]:
    """Names of the presets shipped with omni-actors."""
    files = resources.files("omni_actors").joinpath("presets").iterdir()
    return sorted(f.name.removesuffix(".yaml") for f in files if f.name.endswith(".yaml"))


def load_pipeline(source: str | Path | Mapping[str, Any] | PipelineSpec) -> PipelineSpec:
    """Load a pipeline from a YAML file path, a preset name, or a mapping of what a
    YAML file would hold (a :class:`PipelineSpec` is returned as it is).

    The file is read within the bounds of :mod:`omni_actors.pipeline.spec.yaml_reader` (its
    size, nesting, aliases and values), so a hostile file costs no more than they allow.

    Raises:
        PipelineConfigError: unreadable file, bad YAML, a file past those bounds, or an
            invalid definition; the message names the file and each offending field.
    """
    if isinstance(source, PipelineSpec):
        return source
    if isinstance(source, Mapping):
        return _validate("pipeline", dict(source))
    path = Path(source)
    if isinstance(source, str) and re.fullmatch(NAME_PATTERN, source) and not path.exists():
        preset = resources.files("omni_actors").joinpath("presets", f"{source}.yaml")
        if not preset.is_file():
            raise PipelineConfigError(
                f"no preset named {source!r}; presets: {', '.join(preset_names())}"
            )
        label, read = f"preset {source}", preset.read_bytes
    else:
        label, read = str(path), lambda: read_limited(path)
    try:
        data = parse_yaml(read())
    except OSError as exc:
        raise PipelineConfigError(f"cannot read pipeline file {path}: {exc}") from None
    except YamlLimitError as exc:
        raise PipelineConfigError(f"{label}: refused: {exc}") from None
    except yaml.YAMLError as exc:
        raise PipelineConfigError(f"{label}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise PipelineConfigError(f"{label}: expected a mapping at the top level")
    return _validate(label, data)


def _validate(label: str, data: dict[str, Any]) -> PipelineSpec:
    try:
        return PipelineSpec.model_validate(data)
    except ValidationError as exc:
        raise PipelineConfigError(_describe(label, data, exc)) from None


def _describe(label: str, data: dict[str, Any], exc: ValidationError) -> str:
    """One line per problem: ``file: stages[talker].engine.kind: Input should be ...``."""
    lines: list[str] = []
    errors = exc.errors()
    # A tuple whose items failed also reports itself too short (it counts the failed ones
    # out): that line is no problem of its own.
    parents = {error["loc"][:i] for error in errors for i in range(1, len(error["loc"]))}
    for error in errors:
        if error["type"] == "too_short" and error["loc"] in parents:
            continue
        if not error["loc"] and error["type"] == "value_error":
            # Whole-pipeline checks (graph, wiring) name their fields themselves.
            cause = error.get("ctx", {}).get("error")
            text = str(cause) if cause is not None else error["msg"]
            lines.extend(f"  {line}" for line in text.splitlines())
            continue
        parts: list[str] = []
        node: Any = data
        for key in error["loc"]:
            if isinstance(key, int) and isinstance(node, list):
                item = node[key] if key < len(node) else None
                name = item.get("name") if isinstance(item, dict) else None
                parts[-1] += f"[{name or key}]"
                node = item
            else:
                parts.append(str(key))
                node = node.get(key) if isinstance(node, dict) else None
        where = ".".join(parts) or "(top level)"
        lines.append(f"  {where}: {error['msg']}")
    return "\n".join([f"{label}: invalid pipeline ({len(lines)} problem(s))", *lines])
