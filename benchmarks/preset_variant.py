"""Write a variant of a shipped preset for a GPU bench run: engine args set per stage.

    python3 benchmarks/preset_variant.py qwen3-omni-1gpu /tmp/variant.yaml \\
        --set thinker.model=/dev/shm/q3-thinker --set talker.compile_prefill=true

Each ``--set STAGE.ARG=VALUE`` sets one engine arg of one stage (the value read as YAML:
``true``, ``8``, a path), or the stage's own field where ``ARG`` names one (``device``,
``devices``, ``replicas``, ``process``): ``--set "thinker.devices=[cuda:0, cuda:1]"``
runs a thinker replica on each GPU (the stage's ``device`` goes). The preset is a name
under ``omni_actors/presets`` or a path.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from omni_actors.pipeline.spec.stage import StageSpec


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
        if arg in ("name", "engine"):
            raise SystemExit(f"--set {item!r}: a stage's {arg} is not set here")
        if arg not in StageSpec.model_fields:
            stages[name]["engine"].setdefault("args", {})[arg] = yaml.safe_load(value)
            continue
        stages[name][arg] = yaml.safe_load(value)
        if arg == "devices":
            stages[name].pop("device", None)
    ns.out.write_text(yaml.safe_dump(spec, sort_keys=False))


if __name__ == "__main__":
    main()
