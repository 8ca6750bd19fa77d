#!/bin/bash
# Sample where each traced stage worker's threads spend a run, with py-spy:
#   bash benchmarks/spy_steps.sh STEPS_DIR OUT [SECONDS] [AFTER_STEPS]
# waits until the thinker's step trace in STEPS_DIR (OMNI_ACTORS_STEP_TRACE) holds
# AFTER_STEPS steps (default 300: past a level's warm-up), then records every traced
# worker (its pid is in its trace's file name) for SECONDS (default 6) at 250 Hz, idle
# samples included, as raw stacks: OUT/spy_<loop>-<pid>.txt, then summarized by
# benchmarks/spy_summary.py into OUT/spy_summary.txt. $SPY names py-spy (default:
# py-spy on PATH; the GPU script installs its wheel from .whl/ when there is one).
# SPY_TIMELINE=1 records speedscope files instead (OUT/spy_<loop>-<pid>.json: samples in
# order, for benchmarks/spy_timeline.py) and OUT/spy_start.txt (when sampling started, in
# the step traces' clock), to see what a thread did at a given step, a wave's first say.
set -u
trap 'kill $(jobs -p) 2>/dev/null; exit 143' TERM
steps=$1 out=$2 secs=${3:-6} after=${4:-300}
spy=${SPY:-py-spy}
here=$(dirname "$0")
for _ in $(seq 1 1200); do  # 10 minutes at most
  n=$(cat "$steps"/thinker*.jsonl 2>/dev/null | wc -l)
  [ "$n" -ge "$after" ] && break
  sleep 0.5
done
format=raw ext=txt rate=250
if [ "${SPY_TIMELINE:-}" = 1 ]; then format=speedscope ext=json rate=500; fi
date +%s.%N > "$out/spy_start.txt"
for trace in "$steps"/*.jsonl; do
  [ -e "$trace" ] || continue
  name=$(basename "$trace" .jsonl)
  "$spy" record -p "${name##*-}" -d "$secs" -r "$rate" --threads --idle --nonblocking \
    --format "$format" -o "$out/spy_$name.$ext" > "$out/spy_$name.log" 2>&1 &
done
wait
[ "$format" = raw ] || exit 0
for raw in "$out"/spy_*.txt; do
  [ -e "$raw" ] && [ "$raw" != "$out/spy_summary.txt" ] || continue
  echo "#### $(basename "$raw" .txt)"
  python3 "$here/spy_summary.py" "$raw" 30
done > "$out/spy_summary.txt"
