"""How each edge's tensors travel, chosen from where its two stages run.

- ``object``: both stages in one process: chunks are handed over as objects, device
  tensors untouched;
- ``device``: both stages compute on GPUs, in different processes: a device link (CUDA
  IPC on one GPU, a peer copy between two GPUs of the host), set up when the first
  session sends on the edge; until the receiver has mapped it, or if it refuses, the
  host path serves;
- ``host``: anything else: device tensors are copied to page-locked host memory on the
  sender's stream, then the transport carries them.

An edge's ``path: host`` in the YAML forces the host path (a GPU pair, measured against
it); ``path: device`` insists on a device link and is refused where none can exist.
"""

from __future__ import annotations

from typing import Literal

from omni_actors.pipeline.spec.pipeline import EdgeSpec, PipelineConfigError, PipelineSpec
from omni_actors.pipeline.spec.stage import StageSpec

__all__ = ["EdgePath", "edge_path", "edge_paths"]

EdgePath = Literal["object", "device", "host"]


def _where(stage: StageSpec) -> str:
    if stage.devices is not None:
        return ", ".join(stage.devices)
    return stage.device or "cpu"


def edge_path(source: StageSpec, target: StageSpec, edge: EdgeSpec) -> tuple[EdgePath, str]:
    """The path of ``edge`` (``source -> target``) and why.

    Raises:
        PipelineConfigError: the edge asks for ``device`` where no device link can exist.
    """
    where = f"{source.name} ({_where(source)}) -> {target.name} ({_where(target)})"
    same_process = not source.process and not target.process
    both_gpu = source.computes_on_gpu() and target.computes_on_gpu()
    if edge.path == "device" and (same_process or not both_gpu):
        why = "they share a process" if same_process else "not both stages are on GPUs"
        raise PipelineConfigError(f"edge {edge.source}->{edge.to}: path device, but {why}")
    if edge.path == "host":
        return "host", f"{where}: host, as the pipeline says"
    if same_process:
        return "object", f"{where}: one process, chunks handed over as they are"
    if both_gpu:
        return "device", f"{where}: a device link, GPU to GPU"
    return "host", f"{where}: through host memory"


def edge_paths(spec: PipelineSpec) -> dict[tuple[str, str], tuple[EdgePath, str]]:
    """Every edge's path and why, by ``(source, to)``."""
    stages = {stage.name: stage for stage in spec.stages}  # one look-up per end, not a scan
    return {
        (edge.source, edge.to): edge_path(stages[edge.source], stages[edge.to], edge)
        for edge in spec.edges
    }
