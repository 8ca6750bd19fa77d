"""The README and the docs/ pages, checked against the code: their examples run, their
pipeline YAML loads, their links resolve, and the README's map of the code is the tree's.

Each fenced ``python`` block is a complete program, run as is in a fresh interpreter from
a temporary directory, unless the line before its fence is one of these markers:

- ``<!-- file: PATH -->``: a file the page's programs use (a module they import, a
  pipeline YAML they load), written to ``PATH`` in that directory before they run;
- ``<!-- pytest -->``: a test module, run under pytest there;
- ``<!-- needs-server -->``: a client of ``omni-actors serve``; it runs against the
  scripted-omni preset served on a free port, its ``127.0.0.1:8000`` pointed there;
- ``<!-- fragment -->``: an excerpt that does not run on its own (it must still parse).

Each ``yaml`` block is a pipeline and must load (``load_pipeline``) unless marked as a
fragment. Programs run on presets that need no weights; the model cache is the
temporary directory's, so a program that does want weights prepares them there.
"""

from __future__ import annotations

import ast
import asyncio
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_layering import LAYERS

from omni_actors.pipeline.spec.pipeline import load_pipeline
from omni_actors.testing import eventually

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
MARKERS = ("fragment", "pytest", "needs-server", "file")
RUN_S = 180.0  # one example, in a fresh interpreter that imports torch, on a busy machine
SERVER_ADDRESS = "127.0.0.1:8000"  # where the examples find `omni-actors serve`
SERVER_READY_S = 120.0

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
_MARKER = re.compile(r"^<!--\s*(?P<marker>[\w-]+)(?::\s*(?P<path>\S+))?\s*-->$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str | None = None
    path: str | None = None  # where a ``file:`` block is written

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def read_blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` (indented ones in lists too), with its marker.

    Raises:
        AssertionError: an HTML comment before a fence is not a known marker, or a
            ``file:`` marker names no path: a typo must not turn a check off.
    """
    lines = page.read_text().splitlines()
    found = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        indent, start = fence["indent"], i
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i].removeprefix(indent))
            i += 1
        i += 1
        before = start - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = path = None
        comment = lines[before].strip() if before >= 0 else ""
        if comment.startswith("<!--"):
            matched = _MARKER.match(comment)
            known = matched is not None and matched["marker"] in MARKERS
            assert known, f"{page.name}:{before + 1}: unknown marker {comment!r} ({MARKERS})"
            assert matched is not None
            marker, path = matched["marker"], matched["path"]
            assert (marker == "file") == (path is not None), f"{page.name}:{before + 1}"
        found.append(Block(page, start + 1, fence["lang"], "\n".join(body) + "\n", marker, path))
    return found


BLOCKS = [block for page in PAGES for block in read_blocks(page)]
PYTHON = [b for b in BLOCKS if b.lang == "python"]
PROGRAMS = [b for b in PYTHON if b.marker in (None, "pytest")]
SERVER_CLIENTS = [b for b in PYTHON if b.marker == "needs-server"]
PIPELINES = [b for b in BLOCKS if b.lang == "yaml" and b.marker != "fragment"]


def _ids(blocks: list[Block]) -> list[str]:
    return [b.where for b in blocks]


def write_files(page: Path, directory: Path) -> list[str]:
    """Write ``page``'s ``file:`` blocks under ``directory``; their top-level names."""
    names = []
    for block in read_blocks(page):
        if block.marker == "file":
            assert block.path is not None
            target = directory / block.path
            assert target.resolve().is_relative_to(directory.resolve()), block.where
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code)
            names.append(Path(block.path).parts[0].removesuffix(".py"))
    return names


def run_python(args: list[str], cwd: Path, where: str) -> str:
    """Run ``python ARGS`` in ``cwd`` with a deadline; its stdout once it exited 0."""
    env = {**os.environ, "OMNI_ACTORS_CACHE": str(cwd / "cache")}
    try:
        done = subprocess.run(
            [sys.executable, *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=RUN_S,
            check=False,
            env=env,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{where}: still running after {RUN_S:.0f} s") from exc
    assert done.returncode == 0, f"{where} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


@dataclass(frozen=True)
class Server:
    address: str  # host:port


def _ready(url_file: Path, server: subprocess.Popen[bytes]) -> str:
    """The server's URL once ``/readyz`` answers 200; "" (not yet) before."""
    assert server.poll() is None, f"omni-actors serve exited {server.returncode}"
    url = url_file.read_text().strip() if url_file.is_file() else ""
    if not url:
        return ""
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as response:
            return url if response.status == 200 else ""
    except OSError:
        return ""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``omni-actors serve --preset scripted-omni`` on a free port, with the examples' key,
    under the model name the examples use (they speak of a tiny-omni server)."""
    directory = tmp_path_factory.mktemp("server")
    url_file = directory / "url"
    log = (directory / "log").open("wb")
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "omni_actors.cli", "serve", "--preset", "scripted-omni"),
            *("--port", "0", "--api-key", "KEY", "--ready-file", str(url_file)),
            *("--served-model-name", "tiny-omni"),
            *("--cache-dir", str(directory / "cache"), "--log-level", "warning"),
        ],
        cwd=directory,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        url = asyncio.run(
            eventually(lambda: _ready(url_file, process), SERVER_READY_S, "the server to be ready")
        )
        yield Server(url.removeprefix("http://").rstrip("/"))
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.mark.parametrize("block", PROGRAMS, ids=_ids(PROGRAMS))
def test_python_example_runs(block: Block, tmp_path: Path) -> None:
    write_files(block.page, tmp_path)
    if block.marker == "pytest":
        (tmp_path / "test_example.py").write_text(block.code)
        args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto"]
        out = run_python([*args, "test_example.py"], tmp_path, block.where)
        assert " passed" in out, out
        assert " failed" not in out, out
    else:
        (tmp_path / "example.py").write_text(block.code)
        run_python(["example.py"], tmp_path, block.where)


@pytest.mark.parametrize("block", SERVER_CLIENTS, ids=_ids(SERVER_CLIENTS))
def test_server_example_runs(block: Block, server: Server, tmp_path: Path) -> None:
    assert SERVER_ADDRESS in block.code, f"{block.where}: clients talk to {SERVER_ADDRESS}"
    write_files(block.page, tmp_path)
    (tmp_path / "example.py").write_text(block.code.replace(SERVER_ADDRESS, server.address))
    run_python(["example.py"], tmp_path, block.where)


EXCERPTS = [b for b in PYTHON if b.marker in ("fragment", "file")]


@pytest.mark.parametrize("block", EXCERPTS, ids=_ids(EXCERPTS))
def test_python_fragments_and_files_parse(block: Block) -> None:
    compile(block.code, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.mark.parametrize("block", PIPELINES, ids=_ids(PIPELINES))
def test_pipeline_yaml_loads(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A pipeline may name a page's own engine (``package.module:Class``): import it from
    # the page's files, and forget it afterwards.
    names = write_files(block.page, tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in list(sys.modules):
        if name.split(".")[0] in names:
            monkeypatch.delitem(sys.modules, name)
    path = tmp_path / "pipeline.yaml"
    path.write_text(block.code)
    try:
        spec = load_pipeline(path)
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] in names]:
            del sys.modules[name]
    assert spec.stages, block.where


def test_the_pages_have_examples_to_check() -> None:
    # The parser found the blocks (a change of fence style must not skip them all).
    assert len(PROGRAMS) >= 6
    assert len(SERVER_CLIENTS) >= 2
    assert {b.page.name for b in PROGRAMS} >= {"README.md", "pipelines.md", "actors.md"}
    assert len(PIPELINES) >= 3


def test_an_unknown_marker_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- fragmnet -->\n```python\nx = 1\n```\n")
    with pytest.raises(AssertionError, match="unknown marker"):
        read_blocks(page)


def test_a_failing_example_fails_its_test(tmp_path: Path) -> None:
    (tmp_path / "example.py").write_text("1 / 0\n")
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        run_python(["example.py"], tmp_path, "example.py")


# Links ---------------------------------------------------------------------------------

_LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")


def _prose(page: Path) -> str:
    """``page`` without its fenced blocks and inline code (a link there is not a link)."""
    text = re.sub(r"^( *)```.*?^\1```\s*$", "", page.read_text(), flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives ``page``'s headings."""
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", _prose(page), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def broken_links(page: Path) -> list[str]:
    """Relative links of ``page`` whose file (or heading anchor) does not exist."""
    broken = []
    for match in _LINK.finditer(_prose(page)):
        target = match["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no such heading)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# A heading\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [ok](there.md#a-heading) [web](https://example.com) `[no](x.md)`\n"
        "[gone](missing.md) [bad anchor](there.md#nowhere)\n"
    )
    assert broken_links(page) == ["missing.md (no such file)", "there.md#nowhere (no such heading)"]


def test_the_readme_links_every_docs_page() -> None:
    linked = {m["target"].partition("#")[0] for m in _LINK.finditer(_prose(ROOT / "README.md"))}
    pages = {f"docs/{p.name}" for p in PAGES if p.parent == ROOT / "docs"}
    assert pages - linked == set()


# The README's map of the code -----------------------------------------------------------


def _map_section() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("\n## Map of the code\n", 1)[1].split("\n## ", 1)[0]


def _map_blocks() -> list[str]:
    return re.findall(r"^```\n(.*?)^```$", _map_section(), flags=re.M | re.S)


def test_the_map_draws_the_layers_in_their_order() -> None:
    (layers,) = [b for b in _map_blocks() if b.startswith("protocols ")]
    drawn = []
    for line in layers.splitlines():
        names = re.split(r" {2,}", line.removeprefix("<- "), maxsplit=1)[0]
        drawn.append(tuple(names.split(" / ")))
    stated = [tuple(name.removeprefix("omni_actors.") for name in layer) for layer in LAYERS]
    assert drawn == stated


def test_the_map_names_only_paths_that_exist() -> None:
    prose = re.sub(r"^```.*?^```$", "", _map_section(), flags=re.M | re.S)
    named = [
        token
        for token in re.findall(r"`([^`\s]+)`", prose)
        if "/" in token or token.endswith(".py")
    ]
    assert len(named) > 20
    (tree,) = [b for b in _map_blocks() if b.startswith("omni_actors/")]
    parents: list[str] = []
    for line in tree.splitlines():
        depth = (len(line) - len(line.lstrip())) // 2
        entry = re.split(r" {2,}", line.strip(), maxsplit=1)[0]
        del parents[depth:]
        for name in entry.split(", "):
            named.append("".join(parents) + name)
        parents.append(entry if entry.endswith("/") else "")
    missing = [path for path in named if not list(ROOT.glob(path.rstrip("/")))]
    assert missing == []
