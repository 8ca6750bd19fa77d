"""No pickle anywhere: not on the wire, not in the files a model is loaded from.

The wire is msgspec only, so no pickle-family module may be imported by the package. Model
weights load from safetensors only (``omni_actors.models.files``), so no pickle-based
loader may be called (``torch.load``, ``numpy.load``), and every Hugging Face
``from_pretrained`` of a model must pass ``use_safetensors=True``, without which
transformers falls back to a ``pytorch_model.bin`` it finds. Configs and tokenizers are
JSON: their ``from_pretrained`` reads no weights.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from source_syntax import parse

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = ("omni_actors", "actors", "protocols")
BANNED = {"pickle", "cloudpickle", "dill", "_pickle", "copyreg"}
PICKLE_LOADERS = {
    "torch.load",
    "torch.jit.load",
    "torch.serialization.load",
    "np.load",
    "numpy.load",
}
PICKLE_KEYWORDS = {"weights_only", "allow_pickle"}  # only pickle-based loaders take them
READS_NO_WEIGHTS = re.compile(r"config|tokenizer|processor|extractor", re.IGNORECASE)


def _imports(path: Path) -> set[str]:
    tree = parse(path)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.add(str(node.args[0].value).split(".")[0])
    return found


SOURCES = sorted(p for d in PACKAGE_DIRS for p in (ROOT / d).rglob("*.py"))


def test_package_sources_found() -> None:
    assert len(SOURCES) > 5


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_pickle_import(path: Path) -> None:
    banned = _imports(path) & BANNED
    assert not banned, f"{path.relative_to(ROOT)} imports {sorted(banned)}"


def test_detector_catches_pickle(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom pickle import dumps\nimportlib.import_module('dill')\n")
    assert _imports(bad) >= {"pickle", "dill"}


def _safetensors_only(call: ast.Call) -> bool:
    return any(
        k.arg == "use_safetensors" and isinstance(k.value, ast.Constant) and k.value.value is True
        for k in call.keywords
    )


def _pickle_loaders(path: Path) -> list[str]:
    """Every call (or reference) in ``path`` that could load weights from a pickle."""
    tree = parse(path)
    calls = {id(node.func): node for node in ast.walk(tree) if isinstance(node, ast.Call)}
    found = []
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [
                f"{where} imports {node.module}.{a.name}"
                for a in node.names
                if f"{node.module}.{a.name}" in PICKLE_LOADERS
            ]
        elif isinstance(node, ast.Call):
            found += [f"{where} passes {k.arg}" for k in node.keywords if k.arg in PICKLE_KEYWORDS]
        elif isinstance(node, ast.Attribute):
            name = f"{ast.unparse(node.value)}.{node.attr}"
            if name in PICKLE_LOADERS:
                found.append(f"{where} uses {name}")
            elif node.attr == "from_pretrained" and not READS_NO_WEIGHTS.search(name):
                # A model's from_pretrained, called without use_safetensors=True or handed
                # to another function (which would call it without).
                call = calls.get(id(node))
                if call is None or not _safetensors_only(call):
                    found.append(f"{where} calls {name} without use_safetensors=True")
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_pickle_based_weights_loader(path: Path) -> None:
    assert _pickle_loaders(path) == []


def test_detector_catches_pickle_loaders(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from torch import load\n"
        "torch.load(f, weights_only=True)\n"
        "numpy.load(f, allow_pickle=True)\n"
        "Model.from_pretrained(d, local_files_only=True)\n"
        "_CLASSES[stage].from_pretrained(d, use_safetensors=False)\n"
        "asyncio.to_thread(Model.from_pretrained, d)\n"
    )
    caught = {finding.split()[0] for finding in _pickle_loaders(bad)}
    assert caught == {f"bad.py:{line}" for line in range(1, 7)}  # every line
    good = tmp_path / "good.py"
    good.write_text(
        "Model.from_pretrained(d, use_safetensors=True)\n"
        "_CONFIGS[stage].from_pretrained(d)\n"
        "AutoTokenizer.from_pretrained(d)\n"
        "json.load(f)\n"
        "safetensors.torch.load_file(f)\n"
    )
    assert _pickle_loaders(good) == []
