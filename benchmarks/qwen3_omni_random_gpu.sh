#!/usr/bin/env bash
# The full-size random Qwen3-Omni release on a machine with two GPUs and no package
# registry: set up (the wheels of tests/gpu/conftest.py in .whl/), write the release
# (omni-actors prepare qwen3-omni-random), load each stage onto its GPU (bench load),
# time decode steps eager against the static slot cache (bench decode), then run one
# request through the qwen3-omni preset. Run from the repository root:
#   bash benchmarks/qwen3_omni_random_gpu.sh [setup] [prepare] [load] [boundary] [decode] [run]
# Results go to $OUT (default benchmarks/results); the release to $RELEASE (/tmp/q3).
set -euo pipefail
OUT=${OUT:-benchmarks/results}
RELEASE=${RELEASE:-/tmp/q3}
export PYTHONPATH=/tmp/site
omni() { python3 -m omni_actors.cli "$@"; }
steps=("$@")
[ $# -gt 0 ] || steps=(setup prepare load boundary decode run)
for step in "${steps[@]}"; do
  case $step in
    setup)
      python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
      python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
      nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
      df -h "$(dirname "$RELEASE")" | tail -1; free -g | head -2 ;;
    prepare)
      start=$(date +%s)
      omni prepare qwen3-omni-random --out "$RELEASE" 2>&1 | tr '\r' '\n' | tail -2
      echo "prepare_s=$(( $(date +%s) - start ))"
      du -sh "$RELEASE"; ls "$RELEASE" | tr '\n' ' '; echo ;;
    load)
      omni bench load --model "$RELEASE" --stage thinker=cuda:0 --stage talker=cuda:1 \
        --stage code2wav=cuda:1 --json --quiet > "$OUT/qwen3_omni_random_load.json"
      cat "$OUT/qwen3_omni_random_load.json" ;;
    boundary)
      omni bench boundary --model "$RELEASE" --device cuda:1 --left-context 0 4 12 25 50 72 \
        --json --quiet > "$OUT/qwen3_omni_random_boundary.json"
      cat "$OUT/qwen3_omni_random_boundary.json" ;;
    decode)
      omni bench decode --model "$RELEASE" --stage thinker=cuda:0 --stage talker=cuda:1 \
        --batch 1 8 32 --context 1024 --steps 20 --max-context 2048 --json --quiet \
        > "$OUT/qwen3_omni_random_decode.json"
      cat "$OUT/qwen3_omni_random_decode.json" ;;
    run)
      omni run --preset benchmarks/qwen3_omni_random.yaml --model "$RELEASE" --text "Hello, who are you?" \
        --out "$OUT/qwen3_omni_random_reply.wav" 2>&1 | tail -20 ;;
  esac
done
