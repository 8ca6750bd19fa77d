"""The container image installs with the Makefile's own command, so the two cannot
drift: the Dockerfile and the Makefile are parsed here (no docker needed)."""

from __future__ import annotations

import fnmatch
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _instructions(path: Path) -> list[tuple[str, str]]:
    """The Dockerfile's (instruction, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def _recipes(path: Path) -> dict[str, list[str]]:
    """The Makefile's targets and their recipe lines."""
    recipes: dict[str, list[str]] = {}
    target = None
    for line in path.read_text().splitlines():
        if line.startswith("\t") and target is not None:
            recipes[target].append(line.strip())
        elif re.match(r"^[^\s#=]+:(?!=)", line):
            target = line.split(":", 1)[0]
            recipes[target] = []
        elif not line.startswith("\t"):
            target = None
    return recipes


def test_the_image_runs_the_makefiles_install_target() -> None:
    steps = _instructions(ROOT / "Dockerfile")
    assert steps[0][0] in ("ARG", "FROM")
    base = next(args for word, args in steps if word == "FROM")
    image = next(args.split("=", 1)[1] for w, args in steps if w == "ARG" and "CUDA_IMAGE" in args)
    assert base == "${CUDA_IMAGE}"
    assert image.startswith("nvidia/cuda:"), image
    runs = [shlex.split(args) for word, args in steps if word == "RUN"]
    make = [argv for argv in runs if argv[:2] == ["make", "install"]]
    assert len(make) == 1, runs
    settings = dict(arg.split("=", 1) for arg in make[0][2:])
    assert settings["EXTRAS"] == "${EXTRAS}"
    declared = {args.split("=", 1)[0] for word, args in steps if word == "ARG"}
    assert "EXTRAS" in declared
    assert not any("pip" in argv for argv in runs), "pip runs only through make install"
    venv = next(argv for argv in runs if "venv" in argv)
    assert settings["INSTALL_PYTHON"].startswith(venv[venv.index("venv") + 1])


def test_the_venv_installs_through_the_same_target() -> None:
    recipes = _recipes(ROOT / "Makefile")
    install = recipes["install"]
    assert len(install) == 1
    assert install[0].startswith("$(INSTALL_PYTHON) -m pip install")
    assert "-c constraints.txt" in install[0]
    assert "'.[$(EXTRAS)]'" in install[0]
    stamp = recipes["$(STAMP)"]
    assert "$(MAKE) --no-print-directory install" in stamp
    assert not any("pip install" in line and "-e" in line for line in stamp), stamp


def test_the_image_gets_what_the_install_reads() -> None:
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for needed in ("Makefile", "pyproject.toml", "constraints.txt", "omni_actors", "actors"):
        assert (ROOT / needed).exists()
        assert not any(fnmatch.fnmatch(needed, pattern) for pattern in ignored), needed
    assert ".venv" in ignored
