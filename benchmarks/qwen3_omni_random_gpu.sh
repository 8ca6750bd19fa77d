#!/usr/bin/env bash
# The full-size random Qwen3-Omni release on a machine with two GPUs and no package
# registry: set up (the wheels of tests/gpu/conftest.py in .whl/), write the release
# (omni-actors prepare qwen3-omni-random), load each stage onto its GPU (bench load),
# time decode steps eager against the static slot cache (bench decode), then run one
# request through the qwen3-omni preset; `pipeline` (not run by default) measures the
# qwen3-omni preset per concurrency level on random 2500-token prompts, beside
# vllm-omni's published 2x H100 figures. Run from the repository root:
#   bash benchmarks/qwen3_omni_random_gpu.sh [setup] [prepare] [load] [boundary] [decode] [run] [pipeline]
# On a machine with one GPU (and a 64 GiB disk, too small for the 66 GiB release):
#   bash benchmarks/qwen3_omni_random_gpu.sh setup prepare-talker decode-talker
# writes the release's talker alone and times its frame, compiled as the engine compiles
# it (the code predictor's projections fused), not, and with those projections apart
# ($COMPILE, default "off all apart"), its rows' attention as $DECODE_ATTENTION below says;
#   bash benchmarks/qwen3_omni_random_gpu.sh setup experts
# times the MoE experts alone (no release; `experts` below).
#   bash benchmarks/qwen3_omni_random_gpu.sh setup prepare-short
# writes every stage with an 8-layer thinker ($THINKER_LAYERS), for `bench pipeline
# --preset qwen3-omni-1gpu` on one GPU ($STAGES: the stages written, default all three);
#   STAGES=thinker bash benchmarks/qwen3_omni_random_gpu.sh setup prepare-short prefill
# times and profiles the thinker's prefill against transformers' (thinker_prefill_profile.py;
# $PREFILL_MOE, default "lean compiled": the engine's forward, then its layers compiled);
# `timeline` prints where each request's first text and audio go (ttft_timeline.py);
# `pipeline-1gpu` runs `bench pipeline --preset qwen3-omni-1gpu` on that release
# ($LEVELS_1GPU, default 1 8: two levels take about five minutes; COMPILE_PREFILL=0, as
# `pipeline` takes it too, without the thinker's and talker's prefill layers compiled, which
# they are by default on a GPU; ROWS_AHEAD=0 with a one-shot prompt's talker rows sent with
# its first token, not before its forward; PREFILL_GRAPHS=0 without the thinker's fresh
# prefill graphs, on by default); `decode-thinker` times
# its thinker's decode step with its layers compiled as the engine compiles them, and not
# ($THINKER_COMPILE, default "default off"), its rows' attention gathered or in place
# ($DECODE_ATTENTION, default triton, the engines'; "gather triton" both), at $DECODE_CONTEXT positions
# (1024) of slots of $DECODE_MAX_CONTEXT (2048); after `prepare-talker`, `profile-talker`
# lists the kernels of a talker frame per batch size (talker_frame_profile.py;
# $PROFILE_COMPILE: all, the engine's, by default, or apart or off; $PROFILE_SDPA: the
# attention kernel, default flash efficient math or cudnn; TORCHINDUCTOR_MAX_AUTOTUNE=1
# compiles with inductor's autotuned matmuls; each run appends its lines).
# Results go to $OUT (default benchmarks/results); the release to $RELEASE (/tmp/q3).
# On one GPU at full size, when its memory filesystem holds the thinker:
#   bash benchmarks/qwen3_omni_random_gpu.sh setup prepare-split pipeline-split
# writes the thinker to $SHM_RELEASE and the rest to $RELEASE, and runs `bench pipeline
# --preset qwen3-omni-1gpu` with each stage on its own release ($LEVELS_1GPU); with
# THINKER_RELEASE=/dev/shm/q3-thinker, `decode-thinker` and `prefill` time the full-size
# thinker; `prepare-thinker` writes the thinker alone there, and `step-profile` times and
# profiles its steps of first prompts as the pipeline replays them (one H200 is enough:
#   bash benchmarks/qwen3_omni_random_gpu.sh setup prepare-thinker step-profile).
# pipeline: $LEVELS (default 1 4 8 16 32), $REQUESTS_PER_LEVEL (default 4: each level
# runs 4 x c requests, a closed loop as vllm-omni's CI runs it) or $REQUESTS per level,
# $FRAMES_PER_TOKEN (default 2: random weights never pick codec EOS, so the audio of each
# 256-token reply is set to 512 frames, 41 s, as benchmarks/qwen3_omni_random.yaml sets it).
# SETS="thinker.max_tokens_per_step=4096 ..." sets more engine args of the preset, or
# stage fields ("thinker.devices=[cuda:0,cuda:1]": a thinker replica on each GPU)
# (benchmarks/preset_variant.py); TAG names the run in its result file; TRACE=1 writes
# every stage's steps to $OUT/steps (OMNI_ACTORS_STEP_TRACE) and prints where each
# session's first audio waited, which stage paced the replies and the slowest steps
# (benchmarks/step_timeline.py); with SPY=1 too, py-spy samples each traced worker for
# $SPY_S seconds once the thinker has run $SPY_AFTER steps (benchmarks/spy_steps.sh:
# $OUT/spy_summary.txt; its wheel in .whl/, e.g. py_spy-0.4.3 manylinux); SPY_TIMELINE=1
# keeps the samples in order instead (benchmarks/spy_timeline.py; SPY_AFTER=250 SPY_S=5
# covers a level's first wave: its warm-up runs about 257 thinker steps).
set -euo pipefail
OUT=${OUT:-benchmarks/results}
RELEASE=${RELEASE:-/tmp/q3}
SHM_RELEASE=${SHM_RELEASE:-/dev/shm/q3-thinker}
# The release the thinker-only steps (prefill, decode-thinker) load.
THINKER_RELEASE=${THINKER_RELEASE:-$RELEASE}
LEVELS=${LEVELS:-1 4 8 16 32}
COMPILE=${COMPILE:-off all apart}
FRAMES_PER_TOKEN=${FRAMES_PER_TOKEN:-2}
REQUESTS_PER_LEVEL=${REQUESTS_PER_LEVEL:-4}
export PYTHONPATH=/tmp/site
omni() { python3 -m omni_actors.cli "$@"; }
# write_stages STAGE... DIR: those stages of the full-size random release into DIR.
write_stages() {
  python3 -c 'import sys; from pathlib import Path
from omni_actors.actors.engines.qwen3_omni.random_release import real_config, write_random_release
write_random_release(Path(sys.argv[-1]), real_config(), stages=tuple(sys.argv[1:-1]))' "$@"
}
shm_room() {  # the thinker's 59 GiB need 62 GiB free where $SHM_RELEASE goes
  avail=$(df --output=avail -BG "$(dirname "$SHM_RELEASE")" | tail -1 | tr -dc 0-9)
  echo "$(dirname "$SHM_RELEASE"): ${avail}G free"
  [ "$avail" -ge 62 ] || { echo "too small for the thinker (62G)"; exit 1; }
}
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
    prepare-talker)
      start=$(date +%s)
      write_stages talker "$RELEASE"
      echo "prepare_s=$(( $(date +%s) - start ))"; du -sh "$RELEASE" ;;
    prepare-short)
      # The whole release with a thinker of $THINKER_LAYERS layers (default 8; the talker
      # reads the middle one): 20 GiB, so every stage fits one GPU machine's disk. Its
      # step costs are not the full model's; what it measures is the pipeline around them.
      start=$(date +%s)
      python3 -c 'import sys; from pathlib import Path
from omni_actors.actors.engines.qwen3_omni.random_release import real_config, write_random_release
config = real_config(); layers = int(sys.argv[2])
config["thinker_config"]["text_config"]["num_hidden_layers"] = layers
config["talker_config"]["accept_hidden_layer"] = layers // 2
write_random_release(Path(sys.argv[1]), config, stages=tuple(sys.argv[3].split()))' \
        "$RELEASE" "${THINKER_LAYERS:-8}" "${STAGES:-thinker talker code2wav}"
      echo "prepare_s=$(( $(date +%s) - start ))"; du -sh "$RELEASE" ;;
    experts)
      # The MoE experts alone at the thinker's and talker's widths (random weights, no
      # release): eager, from a graph, compiled, ending in moe_combine's Triton kernel,
      # as moe_fused_triton's two kernels per block config ($FUSED_BLOCKS), and the
      # graphs' kernels.
      python3 benchmarks/moe_experts.py --tokens 1 32 2500 7500 --shapes thinker talker \
        --compiled inductor --triton-combine --profile \
        --triton-fused ${FUSED_BLOCKS:-16x128x64x4x3 64x128x64x4x3 128x128x64x8x3 64x64x64x4x4} \
        | tee "$OUT/moe_experts.jsonl" | cut -c1-400 ;;
    prefill)
      python3 benchmarks/thinker_prefill_profile.py "$THINKER_RELEASE" --tokens ${PREFILL_TOKENS:-256 2500} \
        --moe ${PREFILL_MOE:-lean compiled} | tee "$OUT/qwen3_omni_random_prefill_profile.jsonl" | grep -v '"top"' ;;
    timeline)
      # Where the first text and first audio go, stage by stage, one request at a time
      # (16- and 2500-token prompts): the stages in this process, then each in a worker
      # process of its own. $PRESET: qwen3-omni-1gpu (default) or qwen3-omni.
      for place in inprocess process; do
        PROCESS=$([ $place = process ] && echo 1 || echo 0) python3 benchmarks/ttft_timeline.py \
          "${PRESET:-qwen3-omni-1gpu}" "$RELEASE" 16 2500 \
          > "$OUT/qwen3_omni_random_timeline_$place.jsonl"
        cut -c1-200 "$OUT/qwen3_omni_random_timeline_$place.jsonl"
      done ;;
    decode-talker)
      for compile in $COMPILE; do
        for attention in ${DECODE_ATTENTION:-triton}; do
          name=$compile; [ "$attention" = triton ] || name=${compile}_$attention
          omni bench decode --model "$RELEASE" --stage talker=cuda:0 --batch 1 8 32 --context 1024 \
            --steps 20 --max-context 2048 --talker-compile "$compile" --warm --json --quiet \
            --decode-attention "$attention" > "$OUT/qwen3_omni_random_decode_talker_$name.json"
          cat "$OUT/qwen3_omni_random_decode_talker_$name.json"; echo
        done
      done ;;
    decode-thinker)
      for compile in ${THINKER_COMPILE:-default off}; do
        for attention in ${DECODE_ATTENTION:-triton}; do
          name=$compile; [ "$attention" = triton ] || name=${compile}_$attention
          omni bench decode --model "$THINKER_RELEASE" --stage thinker=cuda:0 --batch 1 8 32 \
            --context ${DECODE_CONTEXT:-1024} --steps 20 --max-context ${DECODE_MAX_CONTEXT:-2048} \
            --thinker-compile "$compile" --decode-attention "$attention" --json --quiet \
            > "$OUT/qwen3_omni_random_decode_thinker_$name.json"
          cat "$OUT/qwen3_omni_random_decode_thinker_$name.json"; echo
        done
      done ;;
    profile-talker)
      # $FUSED_MIN_BLOCKS as for decode (DECODE_FUSED_MIN_BLOCKS of the script).
      DECODE_FUSED_MIN_BLOCKS=${FUSED_MIN_BLOCKS:-} COMPILE=${PROFILE_COMPILE:-all} SDPA=${PROFILE_SDPA:-default} RELEASE=$RELEASE \
        python3 benchmarks/talker_frame_profile.py 1 8 32 \
        | tee -a "$OUT/qwen3_omni_random_talker_frame_profile.jsonl" | cut -c1-400 ;;
    load)
      omni bench load --model "$RELEASE" --stage thinker=cuda:0 --stage talker=cuda:1 \
        --stage code2wav=cuda:1 --json --quiet > "$OUT/qwen3_omni_random_load.json"
      cat "$OUT/qwen3_omni_random_load.json" ;;
    boundary)
      omni bench boundary --model "$RELEASE" --device cuda:1 --left-context 0 4 12 25 50 72 \
        --json --quiet > "$OUT/qwen3_omni_random_boundary.json"
      cat "$OUT/qwen3_omni_random_boundary.json" ;;
    decode)
      # $FUSED_MIN_BLOCKS: the decode attention's fused-kernel threshold (0: always fused).
      omni bench decode --model "$RELEASE" --stage thinker=cuda:0 --stage talker=cuda:1 \
        --batch 1 8 32 --context 1024 --steps 20 --max-context 2048 --json --quiet \
        ${FUSED_MIN_BLOCKS:+--fused-min-blocks "$FUSED_MIN_BLOCKS"} \
        > "$OUT/qwen3_omni_random_decode${FUSED_MIN_BLOCKS:+_fused_min_$FUSED_MIN_BLOCKS}.json"
      cat "$OUT/qwen3_omni_random_decode${FUSED_MIN_BLOCKS:+_fused_min_$FUSED_MIN_BLOCKS}.json" ;;
    run)
      omni run --preset benchmarks/qwen3_omni_random.yaml --model "$RELEASE" --text "Hello, who are you?" \
        --out "$OUT/qwen3_omni_random_reply.wav" 2>&1 | tail -20 ;;
    prepare-split)
      # The whole full-size release on a machine whose disk cannot hold it (one H200's
      # 64 GiB): the thinker's 59 GiB in memory ($SHM_RELEASE, default /dev/shm/q3-thinker;
      # its filesystem needs 62 GiB free), the talker and code2wav on disk ($RELEASE).
      shm_room
      start=$(date +%s)
      write_stages thinker "$SHM_RELEASE"
      write_stages talker code2wav "$RELEASE"
      echo "prepare_s=$(( $(date +%s) - start ))"; du -sh "$SHM_RELEASE" "$RELEASE"; free -g | head -2 ;;
    prepare-thinker)
      # The full-size thinker alone, in memory ($SHM_RELEASE), for `step-profile`.
      shm_room
      start=$(date +%s)
      write_stages thinker "$SHM_RELEASE"
      echo "prepare_s=$(( $(date +%s) - start ))"; du -sh "$SHM_RELEASE" ;;
    step-profile)
      # Steps of 1, 2 and 3 first prompts ($STEP_PROMPTS) of 2508 positions, replayed
      # from the fresh prefill graphs as the engine builds them: wall and device time,
      # kernel time by kind (thinker_step_profile.py), on $SHM_RELEASE's thinker.
      python3 benchmarks/thinker_step_profile.py "$SHM_RELEASE" \
        --prompts ${STEP_PROMPTS:-1 2 3} | tee "$OUT/qwen3_omni_random_thinker_step_profile.jsonl" \
        | cut -c1-1500 ;;
    pipeline|pipeline-1gpu|pipeline-split)
      # $REQUESTS, when set, replaces the K x c requests of each level.
      if [ -n "${REQUESTS:-}" ]; then counts=(--requests "$REQUESTS")
      else counts=(--requests-per-level "$REQUESTS_PER_LEVEL"); fi
      preset=qwen3-omni levels=$LEVELS sets=() model=(--model "$RELEASE")
      if [ "$step" != pipeline ]; then preset=qwen3-omni-1gpu levels=${LEVELS_1GPU:-1 8}; fi
      if [ "$step" = pipeline-split ]; then
        # Each stage its own release (prepare-split): no --model for them all.
        sets+=(--set "thinker.model=$SHM_RELEASE" --set "talker.model=$RELEASE")
        sets+=(--set "code2wav.model=$RELEASE") model=()
      fi
      if [ "${COMPILE_PREFILL:-}" = 0 ]; then
        # The thinker's and talker's prefill layers not compiled (on a GPU they are).
        sets+=(--set thinker.compile_prefill=false --set talker.compile_prefill=false)
      fi
      if [ -n "${PREFILL_GRAPHS:-}" ]; then
        # 0: a session's first prompt runs the thinker's prefill forward, not the prefill
        # graph of its length (which it replays by default on a GPU).
        graphs=false; [ "$PREFILL_GRAPHS" = 1 ] && graphs=true
        sets+=(--set "thinker.prefill_graphs=$graphs")
      fi
      if [ "${ROWS_AHEAD:-}" = 0 ]; then
        # A one-shot prompt's talker rows with its first token, not before its forward.
        sets+=(--set thinker.rows_ahead=false)
      fi
      # $SETS: more engine args, "stage.arg=value ..." (named in the result by $TAG).
      for set in ${SETS:-}; do sets+=(--set "$set"); done
      python3 benchmarks/preset_variant.py "$preset" /tmp/variant.yaml "${sets[@]}"
      result="$OUT/qwen3_omni_random_$step${COMPILE_PREFILL:+_compile_prefill_$COMPILE_PREFILL}"
      result="$result${ROWS_AHEAD:+_rows_ahead_$ROWS_AHEAD}${PREFILL_GRAPHS:+_prefill_graphs_$PREFILL_GRAPHS}"
      result="$result${TAG:+_$TAG}.json"
      if [ "${TRACE:-}" = 1 ]; then export OMNI_ACTORS_STEP_TRACE="$OUT/steps"; fi
      if [ "${TRACE:-}" = 1 ] && [ "${SPY:-}" = 1 ]; then
        # py-spy samples every traced worker once the level is under way (spy_steps.sh).
        SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy) bash benchmarks/spy_steps.sh \
          "$OUT/steps" "$OUT" "${SPY_S:-6}" "${SPY_AFTER:-300}" &
        spy=$!
      fi
      # shellcheck disable=SC2086  # levels is a list of words on purpose
      omni bench pipeline --preset /tmp/variant.yaml "${model[@]}" --input-tokens 2500 \
        --output-tokens 256 --frames-per-token "$FRAMES_PER_TOKEN" --streaming-only \
        --no-input-length --concurrency $levels "${counts[@]}" --json > "$result"
      python3 -c 'import json, sys; from omni_actors.bench.models import model_table
print("\n".join(model_table(json.load(open(sys.argv[1])))))' "$result"
      if [ "${TRACE:-}" = 1 ]; then
        if [ -n "${spy:-}" ]; then  # a level shorter than its wait: the spy gives up
          for _ in $(seq 1 $(( ${SPY_S:-6} + 20 ))); do kill -0 "$spy" 2>/dev/null || break; sleep 1; done
          kill "$spy" 2>/dev/null; wait "$spy" 2>/dev/null || true
        fi
        python3 benchmarks/step_timeline.py "$OUT/steps" > "$OUT/step_timeline.txt"
        sed -n '/^median/,$p' "$OUT/step_timeline.txt" | head -16 | cut -c1-240
      fi ;;
  esac
done
