"""The supported-versions policy (docs/installing.md, "Supported versions"), checked against
the files.

The package metadata declares ranges, never exact pins: an app that embeds omni-actors
must stay free to choose its torch build and its transformers release. CI then tests
what a fresh install resolves, so the installed versions must lie in those ranges, and
the table in ``docs/installing.md`` and ``constraints.txt`` must say the same as
``pyproject.toml``.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
TOOL_EXTRAS = frozenset({"dev"})
"""Extras for working on omni-actors itself (linters pinned on purpose), not for apps."""


def _project() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        project: dict[str, Any] = tomllib.load(file)["project"]
    return project


def runtime_requirements(project: dict[str, Any]) -> list[Requirement]:
    """What an app may install: the dependencies and every extra but the tool extras."""
    extras: dict[str, list[str]] = project.get("optional-dependencies", {})
    lines = list(project["dependencies"])
    for name, requirements in extras.items():
        if name not in TOOL_EXTRAS:
            lines += requirements
    return [Requirement(line) for line in lines]


def exact_pins(requirements: list[Requirement]) -> list[str]:
    """The requirements that allow one version only (``==`` without a wildcard, ``===``)."""
    return [
        str(r)
        for r in requirements
        if any(
            s.operator == "===" or (s.operator == "==" and not s.version.endswith(".*"))
            for s in r.specifier
        )
    ]


def declared(name: str) -> SpecifierSet:
    """The range ``pyproject.toml`` declares for ``name`` (dependencies or an app extra)."""
    found = [r for r in runtime_requirements(_project()) if r.name == name]
    assert len(found) == 1, f"{name} must be declared once for apps, found {found}"
    return found[0].specifier


def test_exact_pins_are_recognised() -> None:
    requirements = [Requirement(r) for r in ("a==1.0", "b===2", "c==1.*", "d>=1,<2", "e")]
    assert exact_pins(requirements) == ["a==1.0", "b===2"]


def test_no_runtime_dependency_is_pinned_to_one_version() -> None:
    requirements = runtime_requirements(_project())
    assert {"torch", "transformers"} <= {r.name for r in requirements}
    assert exact_pins(requirements) == [], "declare a range; constraints.txt pins for CI"


def test_this_python_is_supported() -> None:
    python = ".".join(map(str, sys.version_info[:3]))
    assert python in SpecifierSet(_project()["requires-python"])


# A dev install must hold every distribution the policy names (the dev extra pulls in
# tiny-omni), so a missing one fails here instead of skipping.
@pytest.mark.parametrize(
    "name",
    [
        *("torch", "transformers", "safetensors", "numpy", "msgspec"),
        *("pipecat-ai", "livekit-agents", "livekit-plugins-openai"),
    ],
)
def test_installed_version_is_in_the_declared_range(name: str) -> None:
    installed = importlib.metadata.version(name)
    # Local labels (torch's "+cpu") name a build, not a release: ranges ignore them.
    assert declared(name).contains(installed, prereleases=True), (
        f"{name} {installed} is outside the supported range {declared(name)}"
    )


def test_constraints_pick_versions_inside_the_declared_ranges() -> None:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pins = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    assert "torch" in {p.name for p in pins}, "CI's CPU torch build is chosen there"
    for pin in pins:
        (version,) = (Version(s.version) for s in pin.specifier if s.operator == "==")
        assert declared(pin.name).contains(version, prereleases=True), pin


def test_the_installing_page_states_the_declared_ranges() -> None:
    page = (ROOT / "docs" / "installing.md").read_text()
    section = page.split("## Supported versions", 1)[1].split("\n## ", 1)[0]
    stated = {
        m.group(1): SpecifierSet(m.group(2))
        for m in re.finditer(r"^\| (\w[\w-]*) \| `([^`]+)` \|", section, re.M)
    }
    assert stated.get("Python") == SpecifierSet(_project()["requires-python"])
    for name in ("torch", "transformers", "ray", "pipecat-ai", "livekit-agents"):
        assert stated.get(name) == declared(name), f"docs/installing.md's range for {name}"
