"""Write a variant of a shipped preset for a GPU bench run: engine args set per stage.

    python3 benchmarks/preset_variant.py qwen3-omni-1gpu /tmp/variant.yaml \\
        --set thinker.model=/dev/shm/q3-thinker --set talker.compile_prefill=true

Each ``--set STAGE.ARG=VALUE`` sets one engine arg of one stage (the value read as YAML:
``true``, ``8``, a path). The preset is a name under ``omni_actors/presets`` or a path.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("preset")
    parser.add_argument("out", type=Path)
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="S.ARG=V")
    ns = parser.parse_args()
    source = Path(ns.preset)
    if not source.exists():
        source = Path("omni_actors/presets") / f"{ns.preset}.yaml"
    spec = yaml.safe_load(source.read_text())
    stages = {stage["name"]: stage for stage in spec["stages"]}
    for item in ns.sets:
        target, _, value = item.partition("=")
        name, _, arg = target.partition(".")
        if name not in stages or not arg or not value:
            raise SystemExit(f"--set {item!r}: want STAGE.ARG=VALUE, STAGE one of {list(stages)}")
        stages[name]["engine"].setdefault("args", {})[arg] = yaml.safe_load(value)
    ns.out.write_text(yaml.safe_dump(spec, sort_keys=False))


if __name__ == "__main__":
    main()
