"""``protocols`` stands alone: any process can decode the wire without the runtime."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from source_syntax import parse

import omni_actors.protocols

ALLOWED = {"msgspec", "numpy", "torch", "__future__"}
PROTOCOLS = Path(next(iter(omni_actors.protocols.__path__)))


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_protocols_import_only_msgspec_numpy_torch_and_each_other() -> None:
    modules = sorted(PROTOCOLS.glob("*.py"))
    assert len(modules) > 5
    for path in modules:
        for name in _imports(path):
            top = name.partition(".")[0]
            ours = name.startswith("omni_actors.protocols.")
            assert ours or top in ALLOWED or top in sys.stdlib_module_names, (path.name, name)


def test_the_kernel_loads_its_protocol_bases_without_torch() -> None:
    code = (
        "import sys, omni_actors;"
        "from omni_actors import ActorRef, ControlMessage, Request, OmniError;"
        "from omni_actors.protocols.address import ActorAddress;"
        "assert issubclass(ActorRef, ActorAddress);"
        "assert OmniError.code == 'internal';"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
