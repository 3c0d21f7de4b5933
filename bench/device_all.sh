#!/usr/bin/env bash
# The lead's one-call GPU session: build, every GPU test, lego training, forward + appearance benchmarks.
# On the GPU machine (device tool, carry .device and .data = a copy of ../shared/data):
#   source .device/env.sh && bash bench/device_all.sh [--train-iters N] [--train-timeout S] [--no-tests] [--no-bench]
# Logs and small results go to $OUT (at most 8 files come back); a short table is printed last.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export RIGEL_SHARED_DATA=${RIGEL_SHARED_DATA:-$PWD/.data} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
iters=30000 ttimeout=300 tests=1 bench=1 downscale=1 lego=lego viewer_iters=0
while [ $# -gt 0 ]; do
  case "$1" in
    --train-iters) iters=$2; shift ;;
    --train-timeout) ttimeout=$2; shift ;;
    --downscale) downscale=$2; shift ;;
    --lego) lego=$2; shift ;;
    --viewer-iters) viewer_iters=$2; shift ;;
    --no-tests) tests=0 ;;
    --no-bench) bench=0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
t_start=$(date +%s)
summary=()
# build + all GPU tests (no sanitizer, no forward bench here)
if [ $tests = 1 ]; then
  TEST_TIMEOUT=${TEST_TIMEOUT:-240} bash bench/device_run.sh --all-gpu-tests --no-sanitizer --no-bench
  summary+=("gpu tests: $(grep -E '(passed|failed|error)' "$OUT/gpu_tests.log" | tail -1)")
else
  $PY setup.py build_ext --inplace >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
# lego, white background, 100 train views, the 25 test images present; SIGINT at the timeout saves the run
if [ -d "$RIGEL_SHARED_DATA/$lego" ] && [ "$iters" != 0 ]; then
  t0=$(date +%s)
  rm -rf /tmp/lego_run
  timeout -s INT "$ttimeout" $PY -m rigel_core.cli.train --data "$RIGEL_SHARED_DATA/$lego" --out /tmp/lego_run \
    --white-bg --iters "$iters" --downscale "$downscale" --eval-every 7000 --checkpoint-every 0 --quiet \
    >"$OUT/lego_train.log" 2>&1
  rc=$?
  cp /tmp/lego_run/metrics.json "$OUT/lego_metrics.json" 2>/dev/null
  tail -c 20000 /tmp/lego_run/log.txt >"$OUT/lego_log.txt" 2>/dev/null
  r=$(ls /tmp/lego_run/renders/*.png 2>/dev/null | tail -1); [ -n "$r" ] && cp "$r" "$OUT/lego_render.png"
  tail -15 "$OUT/lego_train.log"
  summary+=("lego train: rc=$rc, $(( $(date +%s) - t0 ))s wall (log lego_train.log)")
fi
# the viewer, offscreen, training live on the same data (CUDA frames into the Vulkan ring)
if [ "$viewer_iters" != 0 ] && [ -d "$RIGEL_SHARED_DATA/$lego" ]; then
  t0=$(date +%s)
  rm -rf /tmp/viewer_run
  timeout -s INT ${VIEWER_TIMEOUT:-240} $PY -m viewer.app --data "$RIGEL_SHARED_DATA/$lego" --white-bg --offscreen \
    --iters "$viewer_iters" --eval-every "$viewer_iters" --frames 4 --size 1280x720 --out /tmp/viewer_run \
    >"$OUT/viewer_train.log" 2>&1
  rc=$?
  cp /tmp/viewer_run/summary.json "$OUT/viewer_summary.json" 2>/dev/null
  f=$(ls /tmp/viewer_run/*.png 2>/dev/null | tail -1); [ -n "$f" ] && cp "$f" "$OUT/viewer_frame.png"
  tail -8 "$OUT/viewer_train.log"
  summary+=("viewer offscreen training: rc=$rc, $(( $(date +%s) - t0 ))s; $(head -c 600 "$OUT/viewer_summary.json" 2>/dev/null)")
fi
if [ $bench = 1 ]; then
  timeout ${BENCH_TIMEOUT:-200} $PY bench/forward.py --scenes 160k,1M,3M,donut,fruit --res 1080p,4k --iters 50 \
    2>&1 | tee "$OUT/bench.log" | tail -25
  timeout ${APP_TIMEOUT:-60} $PY bench/appearance.py --n 160000 1000000 --sizes 8x32 2>&1 | tee -a "$OUT/bench.log" | tail -12
fi
echo "== device_all ($(( $(date +%s) - t_start ))s) =="
printf '%s\n' "${summary[@]}"
