"""The layers import one way: protocols <- kernel <- transport, stages <- serving.

Read from the source with ``ast`` (nothing is imported), so a type-only import or an
import inside a function counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "omni_actors"

KERNEL = sorted(
    [
        # ``__init__`` is not kernel: it is where the layers are put together.
        *(path for path in PACKAGE.glob("_*.py") if path.name != "__init__.py"),
        *(
            PACKAGE / name
            for name in ("signals.py", "supervision.py", "clock.py", "errors.py", "remoting.py")
        ),
    ]
)
KERNEL_MODULES = {f"omni_actors.{path.stem}" for path in KERNEL}
ORCHESTRATION = (
    "omni_actors.serving",
    "omni_actors.orchestrator",
    "omni_actors.session",
    "omni_actors.omni",
    "omni_actors.caller",
    "omni_actors.pipeline",
)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _module_name(path: Path) -> str:
    """The dotted name ``path`` is imported as (``actors/`` is ``omni_actors.actors``)."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] in ("actors", "protocols"):
        parts.insert(0, "omni_actors")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of every import in ``path``, ``from x import y`` as ``x.y``.

    ``import_module("name")`` with a literal name counts too: a string must not hide
    an import the layering forbids.
    """
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = _module_name(path).split(".")
                # A module's own package is one level up, a package's own is itself.
                anchor = anchor[: len(anchor) - node.level + (path.name == "__init__.py")]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def _under(module: str, prefixes: tuple[str, ...] | set[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _violations(paths: list[Path], forbidden: object) -> list[str]:
    assert callable(forbidden)
    found = []
    for path in paths:
        for line, module in imports(path):
            if forbidden(module):
                found.append(f"{_rel(path)}:{line} imports {module}")
    return found


def test_the_kernel_imports_only_itself_and_protocols() -> None:
    assert len(KERNEL) > 10  # the glob found the kernel

    def forbidden(module: str) -> bool:
        if not _under(module, ("omni_actors",)):
            return False
        # ``from omni_actors import _system_messages`` names a kernel module too.
        return not (_under(module, KERNEL_MODULES) or _under(module, ("omni_actors.protocols",)))

    assert _violations(KERNEL, forbidden) == []


def test_protocols_import_only_msgspec_numpy_torch_and_the_standard_library() -> None:
    allowed = {"msgspec", "numpy", "torch", "__future__", *sys.stdlib_module_names}

    def forbidden(module: str) -> bool:
        if _under(module, ("omni_actors.protocols",)):
            return False
        return module.split(".")[0] not in allowed

    paths = sorted((ROOT / "protocols").rglob("*.py"))
    assert paths
    assert _violations(paths, forbidden) == []


def test_stages_import_no_orchestration() -> None:
    paths = sorted((ROOT / "actors").rglob("*.py"))
    assert paths
    assert _violations(paths, lambda m: _under(m, ORCHESTRATION)) == []


def test_the_cluster_adapter_imports_no_orchestration() -> None:
    # omni_actors.cluster sits on the transport (it hosts workers); serving uses it.
    paths = sorted((PACKAGE / "cluster").rglob("*.py"))
    assert paths
    upper = (*ORCHESTRATION, "omni_actors.bench", "omni_actors.cli", "omni_actors.server")
    assert _violations(paths, lambda m: _under(m, upper)) == []


def test_only_the_cluster_adapter_imports_ray() -> None:
    # Ray pickles its own calls: that stays inside omni_actors/cluster.
    adapter = PACKAGE / "cluster"
    paths = sorted(
        path
        for top in ("omni_actors", "actors", "protocols")
        for path in (ROOT / top).rglob("*.py")
        if not path.is_relative_to(adapter)
    )
    assert _violations(paths, lambda m: _under(m, ("ray",))) == []


def _private_reaches(path: Path) -> Iterator[str]:
    """Private attributes read on anything but ``self``/``cls`` (dunders are public)."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        yield f"{_rel(path)}:{node.lineno} reads .{name} of {ast.unparse(owner)}"


TRANSPORT = sorted((PACKAGE / "transport").rglob("*.py"))


def test_the_transport_imports_no_private_kernel_module() -> None:
    assert TRANSPORT

    def forbidden(module: str) -> bool:
        parts = module.split(".")
        return parts[0] == "omni_actors" and any(p.startswith("_") for p in parts[1:])

    assert _violations(TRANSPORT, forbidden) == []


def test_the_transport_reads_no_private_attribute_of_another_object() -> None:
    assert [reach for path in TRANSPORT for reach in _private_reaches(path)] == []


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ("from omni_actors import _system_messages as sm\n", True),
        ("from omni_actors._ref import ActorRef\n", True),
        ("from omni_actors import ActorRef, remoting\n", False),
    ],
)
def test_the_private_import_rule_sees_every_spelling(
    tmp_path: Path, source: str, caught: bool
) -> None:
    path = tmp_path / "probe.py"
    path.write_text(source)
    found = [m for _, m in imports(path) if any(p.startswith("_") for p in m.split(".")[1:])]
    assert bool(found) is caught


def test_the_private_attribute_rule_spares_self_and_dunders(tmp_path: Path) -> None:
    path = tmp_path / "probe.py"
    path.write_text("self._a\ncls._b\nx.__name__\nref._cell.mailbox\nsystem._registry\n")
    reaches = [r.split(" reads ")[1] for r in _private_reaches(path)]
    assert sorted(reaches) == ["._cell of ref", "._registry of system"]
