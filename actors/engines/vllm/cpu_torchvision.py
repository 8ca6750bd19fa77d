"""Let the pure-Python part of a torchvision wheel import beside a CPU build of torch.

vLLM's Qwen3-Omni thinker imports transformers' Qwen2-VL image processor, which imports
``torchvision.transforms.v2`` (pure Python). On a CPU machine that cannot reach PyTorch's
own CPU index, the only torchvision wheel is PyPI's CUDA build: its C++ extension links
``libtorch_cuda`` and fails to load beside CPU torch, which torchvision tolerates, but two
of its fake-tensor registrations (``nms``, ``qnms``) name those C++ ops unconditionally,
so ``import torchvision`` raises ``operator torchvision::nms does not exist``, and with it
every transformers import that looks for torchvision.

:func:`install` puts a finder in front of ``sys.meta_path`` that, the first time
torchvision is imported, defines the schemas of those two ops when (and only when) the
extension cannot load. Their fake registrations then succeed; calling them still fails
(there is no kernel), which no audio or text path does. A torchvision whose extension
loads (a real CPU build) is left untouched. ``make venv`` installs it as a ``.pth`` hook
(it must run in every interpreter: vLLM starts processes of its own); with torchvision
from ``https://download.pytorch.org/whl/cpu`` none is needed.

This module imports only the standard library until torchvision is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["OPS", "define_missing_ops", "install"]

OPS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor",
)
"""The schemas torchvision's import registers fakes for whether or not its ops loaded."""

_libraries: list[Any] = []  # the torch.library fragments must outlive the call


def define_missing_ops() -> list[str]:
    """Define :data:`OPS` if torchvision is installed and its extension cannot load.

    Returns:
        The names of the ops it defined (empty when nothing was needed).
    """
    spec = importlib.machinery.PathFinder.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return []
    import torch

    for location in spec.submodule_search_locations:
        for library in Path(location).glob("_C*.so"):
            try:
                torch.ops.load_library(str(library))  # type: ignore[no-untyped-call]
            except OSError:
                continue
            return []  # a working extension defines the ops itself
    fragment = torch.library.Library("torchvision", "FRAGMENT")  # type: ignore[no-untyped-call]
    defined = []
    for schema in OPS:
        name = schema.partition("(")[0]
        if not torch._C._dispatch_has_kernel(f"torchvision::{name}") and not hasattr(
            torch.ops.torchvision, name
        ):
            fragment.define(schema)  # type: ignore[no-untyped-call]
            defined.append(name)
    _libraries.append(fragment)
    return defined


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Runs :func:`define_missing_ops` once, just before torchvision is first imported."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            define_missing_ops()
        return None  # the regular finders import it


def install() -> None:
    """Arm the hook in this interpreter (idempotent; a no-op once torchvision is imported)."""
    if "torchvision" in sys.modules:
        return
    if not any(isinstance(finder, _BeforeTorchvision) for finder in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())
