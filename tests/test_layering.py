"""The layers import one way, lowest first, as the README's map of the code draws them
(``tests/test_readme.py`` checks the drawing against ``LAYERS``).

Read from the source with ``ast`` (nothing is imported), so a type-only import or an
import inside a function counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from source_syntax import parse

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

# Every package of the tree, in layers, lowest first: a module imports only from its own
# layer and the layers below it. ``omni_actors/__init__`` (where the layers are put
# together for the public API) stands above them all.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("omni_actors.protocols",),  # messages: msgspec structs, nothing of ours
    ("kernel",),  # actors, refs, mailboxes, supervision: the root modules
    ("omni_actors.audio", "omni_actors.models", "omni_actors.cuda"),  # files, devices
    ("omni_actors.transport",),  # processes, ZeroMQ, shared memory
    ("omni_actors.cluster",),  # Ray: where a worker starts
    ("omni_actors.actors.engines",),  # the models a stage hosts
    ("omni_actors.actors.stage",),  # the stage runtime
    ("omni_actors.pipeline.spec",),  # a pipeline's definition
    ("omni_actors.pipeline",),  # orchestration, sessions, the caller's API
    ("omni_actors.server", "omni_actors.testing"),  # the HTTP API; the test harness
    ("omni_actors.bench", "omni_actors.cli"),  # programs
)
ORCHESTRATION = ("omni_actors.pipeline",)
# Packages that only hold others (their ``__init__`` is a docstring): in no layer.
CONTAINERS = ("omni_actors", "omni_actors.actors")


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
    tree = parse(path)
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


def _layer_of(module: str) -> int | None:
    """The index in ``LAYERS`` of ``module``'s package; ``None`` outside ours."""
    if _under(module, KERNEL_MODULES) or module == "omni_actors.run":
        return LAYERS.index(("kernel",))
    best: tuple[int, int] | None = None  # (length of the matched name, layer)
    for index, layer in enumerate(LAYERS):
        for name in layer:
            if _under(module, (name,)) and (best is None or len(name) > best[0]):
                best = (len(name), index)
    return None if best is None else best[1]


def _public_api() -> dict[str, str]:
    """``omni_actors.X`` -> the module ``omni_actors/__init__`` imports ``X`` from."""
    names = {}
    for _, module in imports(PACKAGE / "__init__.py"):
        if not _under(module, ("omni_actors",)) or "." not in module:
            continue
        names[f"omni_actors.{module.rsplit('.', 1)[1]}"] = module
    return names


PUBLIC_API = _public_api()


def _package_modules() -> Iterator[Path]:
    for top in ("omni_actors", "actors", "protocols"):
        for path in sorted((ROOT / top).rglob("*.py")):
            # omni_actors/actors and omni_actors/protocols link to the top-level folders
            if top == "omni_actors" and path.relative_to(PACKAGE).parts[0] in (
                "actors",
                "protocols",
            ):
                continue
            yield path


def test_every_package_is_in_a_layer_and_every_layer_exists() -> None:
    unplaced = []
    for path in _package_modules():
        name = _module_name(path)
        if name in CONTAINERS:
            continue
        if _layer_of(name) is None:
            unplaced.append(name)
    assert unplaced == [], "modules in no layer: add their package to LAYERS"
    for layer in LAYERS:
        for name in layer:
            if name == "kernel":
                continue
            folder = PACKAGE.joinpath(*name.split(".")[1:])
            assert (folder / "__init__.py").is_file(), f"LAYERS names {name}, which does not exist"


def test_every_import_points_down_the_layers() -> None:
    upward = []
    for path in _package_modules():
        name = _module_name(path)
        if name in CONTAINERS:
            continue  # omni_actors/__init__ puts the layers together for the public API
        own = _layer_of(name)
        assert own is not None, name
        for line, module in imports(path):
            if module == "omni_actors" or module.startswith("omni_actors.__"):
                continue
            # ``from omni_actors import X`` reaches wherever the public API took X from
            module = PUBLIC_API.get(module, module)
            target = _layer_of(module)
            if target is None:
                continue  # not ours
            if target > own:
                upward.append(f"{_rel(path)}:{line} imports {module} ({LAYERS[target]})")
    assert upward == []


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
    tree = parse(path)
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


@pytest.mark.parametrize("package", ["pipeline", "server"])
def test_the_pipeline_and_server_read_no_private_attribute_of_another_object(
    package: str,
) -> None:
    # A session's response, admission and channel go through each other's public
    # methods: no helper object writes another's private state.
    paths = sorted((PACKAGE / package).rglob("*.py"))
    assert paths
    assert [reach for path in paths for reach in _private_reaches(path)] == []


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
