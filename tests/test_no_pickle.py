"""The wire is msgspec only: no pickle-family module may be imported by the package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = ("omni_actors", "actors", "protocols")
BANNED = {"pickle", "cloudpickle", "dill", "_pickle", "copyreg"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
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
