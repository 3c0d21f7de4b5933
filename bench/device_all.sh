#!/usr/bin/env bash
# The one-call GPU session: build once, then run named jobs in one or two lanes (one lane per GPU when the
# machine has two; the lanes run one after the other on a one-GPU machine). Timings inside a lane are not
# disturbed by the other lane (different GPUs); each job's log and results go to $OUT/logs.tgz, a short table
# is printed last and written to $OUT/summary.txt.
#
# On the GPU machine (device tool; carry .device and .data = copies of ../shared/data, see ../shared/docs/PLATFORM.md):
#   source .device/env.sh && bash bench/device_all.sh --lane0 "tests fwdbench" --lane1 "train:lego:1:sh:30000"
# Jobs:
#   tests                     every GPU test (bench/device_run.sh --all-gpu-tests), pytest summary in the table
#   uitests                   the GPU tests of the Vulkan ring and the viewer only (needs the --ui packages)
#   sanitizer                 compute-sanitizer memcheck of a small forward+backward scene
#   fwdbench                  bench/forward.py, procedural 160k/1M/3M + real PLYs, 720p/1080p/4K, vs gsplat
#   stepbench                 bench/train_step.py (rigel vs gsplat training iteration) and its --profile
#   appbench                  bench/appearance.py (MLP kernel vs SH kernel)
#   ringbench                 bench/ring_overhead.py $RING_ARGS (render + Vulkan ring + passes vs render alone; --ui)
#   multigpu:RUNS:VIEWS[:TIMEOUT]  bench/multi_gpu.py --runs RUNS (jobs joined by +, @ for :, e.g.
#                             lego@1+lego@2+allreduce@2) --views VIEWS; needs every GPU: alone in lane 0; $MG_ARGS passed on
#   train:DATA:DS:APP:ITERS[:TIMEOUT]  rigel-train on $RIGEL_SHARED_DATA/DATA (or $RIGEL_SHARED_DATA/real/DATA: fern,
#                             bonsai, beer; or "orbit": the procedural orbit dataset, generated here; white background
#                             for Blender sets only) at --downscale DS with --appearance APP for ITERS iterations;
#                             $TRAIN_ARGS is passed on (e.g. "--set coarse_to_fine=4")
#   viewer:DATA:DS:ITERS[:TIMEOUT]     rigel-viewer --offscreen training live on the same data (needs --ui)
#   studiogallery             the studio screenshots offscreen on the CUDA renderer (docs/gallery/make_studio_gallery.py
#                             --offscreen --device cuda): $OUT/gallery/h200_offscreen_viewer_*.png (needs --ui)
#   real:SCENES:ITERS[:TIMEOUT[:METHODS]]  bench/real.py (rigel vs a plain gsplat loop: held-out PSNR/SSIM, time,
#                             memory) on SCENES (folders of $RIGEL_SHARED_DATA/real separated by "," or, so that the
#                             job's logs come back, "." — likewise in ITERS and METHODS; or "all") with
#                             checkpoints ITERS (e.g. 7000,30000), METHODS rigel,gsplat (default both; "rigel" in one
#                             lane and "gsplat" in the other halves the wall time: join them afterwards with
#                             bench/real.py --merge DIR DIR --out DIR); $REAL_ARGS is passed on (e.g. "--downscale 2
#                             --rigel-config k=v"); one summary line per scene; outputs in logs/real_*/
#   mip:ITERS[:TIMEOUT[:MODES[:DATA]]]  bench/mip.py (issue 17): train DATA (default lego, white background) at half
#                             resolution in MODES (default "default,mip"; give "default" in one lane and "mip" in the
#                             other to halve the wall time) for ITERS iterations, evaluate held-out PSNR/SSIM at ¼, ½,
#                             1 and 2× the training resolution (2× = the 800×800 originals); table in logs/mip_*/mip.md
#   mcmc:SCENES:ITERS[:TIMEOUT]  bench/real.py --methods rigel,rigel-mcmc (issue 17): rigel's default densification, then
#                             the MCMC budget (--strategy mcmc) capped at the default run's final Gaussian count; SCENES
#                             "lego" / "lego_half" (Blender, white background) or real captures as for real: (comma-
#                             separated, or "all"); $MCMC_ARGS is passed on (e.g. "--mcmc-config densify_until=25000");
#                             real.md's second table is MCMC vs default; outputs in logs/mcmc_*/
#   sweep:SCENES:ITERS:SEEDS[:TIMEOUT]  bench/real_sweep.py (issue 12: several seeds x rigel settings on the real
#                             captures, seed-paired deltas) with "." separating list items (bonsai.fern.beer, 0.1);
#                             $SWEEP_ARGS (shell words) gives the variants and parallelism, e.g. "--parallel 6
#                             --variant default --variant 'mcmc500k=strategy=mcmc;max_gaussians=500000'" (quote a
#                             variant with ';'); table in logs/sweep_*/sweep.md
#   vtp[:DATA[:ITERS[:TIMEOUT]]]  bench/viewer_throughput.py (issue 15; needs --ui): rigel-train, then the offscreen
#                             viewer training DATA (default lego_half, white background; "orbit": black) for ITERS
#                             (default 7000) iterations while presenting at 60 Hz; $VTP_ARGS is passed on (e.g.
#                             "--repeat 2", then give TIMEOUT ~560); table in logs/vtp_*/viewer_throughput.md
#   lens:DATA:ITERS:SEEDS[:TIMEOUT]  bench/lens_ab.py (issue 12): rigel on DATA (as for train:; a transforms.json
#                             capture with a lens) with the lens modelled and zeroed, both scored on the same
#                             undistorted pixels, per seed (SEEDS with "." for ","); table in logs/lens_*/lens.md
#   profile:DATA[:WARM[:TIMEOUT]]  bench/profile_trainer.py: Trainer.step() on DATA (as for train:) after WARM
#                             (default 2000) steps, graph and eager: ms and host ms per step, torch.profiler's
#                             top ops; $PROFILE_ARGS is passed on (e.g. "--modes graph --set grad_threshold=1.5e-4")
#   roofline[:SIZES[:TIMEOUT]]  bench/roofline.py --ncu (issue 39.3): Nsight Compute (ncu --clock-control none) on one
#                             marked render forward, backward and Trainer step per size (SIZES with "." for ",", default
#                             300k.1M.3M) at 800x800 and 1920x1080; the script's budget is TIMEOUT (default 180 s) less
#                             20 s; $ROOFLINE_ARGS is passed on (e.g. "--kernels all --res 1080p"); needs the GPU
#                             alone; table in logs/roofline_*/roofline.md, one summary line
# A lane entry "JOB+JOB" runs those jobs at the same time on the lane's GPU (their timings then share it).
# Per-job time limits: TIMEOUT in the spec, else JOB_TIMEOUT (default 330 s; training gets SIGINT, which saves
# the run and its last evaluation).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/logs"
LOGS=$(cd "$OUT/logs" && pwd)
export RIGEL_SHARED_DATA=${RIGEL_SHARED_DATA:-$PWD/.data} PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
# the commit the figures belong to: the GPU machine's copy carries a stale .git, so the benches' `git rev-parse`
# names an old HEAD there; .data/commit (written before the call: git rev-parse --short HEAD > .data/commit) wins
if [ -z "${RIGEL_COMMIT:-}" ] && [ -s .data/commit ]; then
  c=$(head -n 1 .data/commit | tr -d '[:space:]')
  if [[ $c =~ ^[0-9a-f]{7,40}$ ]]; then export RIGEL_COMMIT=$c
  else echo "device_all.sh: .data/commit holds '$c', not a commit hash: ignored" >&2; fi
fi
echo "commit: ${RIGEL_COMMIT:-not given (carry .data/commit; the benches then ask git, whose copy here may be stale)}"
PY=${PYTHON:-python3}
lane0="" lane1=""
while [ $# -gt 0 ]; do
  case "$1" in
    --lane0|--lane1) [ $# -ge 2 ] || { echo "device_all.sh: $1 needs a list of jobs" >&2; exit 2; } ;;
  esac
  case "$1" in
    --lane0) lane0=$2; shift ;;
    --lane1) lane1=$2; shift ;;
    *) echo "device_all.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
t_start=$(date +%s)

[ "${NO_BUILD:-0}" = 1 ] || $PY setup.py build_ext --inplace >"$LOGS/build.log" 2>&1 || { tail -40 "$LOGS/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t_start ))s"
ngpu=$($PY -c "import torch; print(torch.cuda.device_count())")
$PY -c "import torch, rigel_core as rc; print(torch.cuda.get_device_name(), 'x', torch.cuda.device_count(), 'torch', torch.__version__, 'kernels:', rc.cuda_available())"

orbit_dataset() {  # the procedural orbit dataset: 160k Gaussians, 100 random + 24 orbit views, 400x400
  local d=/tmp/rigel_orbit
  ( flock 9
    [ -f "$d/transforms_test.json" ] || $PY -c "
from rigel_core.data.procedural import make_dataset
make_dataset('$d', 160_000, 400, 400, n_train=100, n_test=24, seed=0, progress=False)" >"$LOGS/orbit_dataset.log" 2>&1
  ) 9>/tmp/rigel_orbit.lock
  echo "$d"
}

data_dir() {  # orbit (generated), a folder of $RIGEL_SHARED_DATA, else one of $RIGEL_SHARED_DATA/real (fern, beer …)
  if [ "$1" = orbit ]; then orbit_dataset
  elif [ ! -e "$RIGEL_SHARED_DATA/$1" ] && [ -e "$RIGEL_SHARED_DATA/real/$1" ]; then echo "$RIGEL_SHARED_DATA/real/$1"
  else echo "$RIGEL_SHARED_DATA/$1"; fi
}

run_metrics() {  # one line from a run's metrics.json / summary.json
  $PY - "$1" <<'PYEOF'
import json, sys
try:
    m = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"no metrics ({e.__class__.__name__})"); sys.exit()
ev = (m.get("eval") or [{}])[-1]
t = m.get("timings", {})
mem = m.get("peak_gpu_memory_bytes")
print(f"it {ev.get('iteration')} psnr {ev.get('psnr', float('nan')):.2f} ssim {ev.get('ssim', float('nan')):.4f} "
      f"N {ev.get('num_gaussians')} train {t.get('train_s', float('nan')):.1f}s "
      f"total {t.get('total_s', float('nan')):.1f}s peak {mem / 2**30 if mem else float('nan'):.2f} GiB")
PYEOF
}

result_line() {  # result_line RC DIR TABLE -> "rc=RC (TABLE)" + DIR/summary.txt's lines (or the log's last line)
  local line="rc=$1"
  if [ -s "$2/summary.txt" ]; then
    line+=" ($3)"
    while IFS= read -r l; do line+=$'\n'"$spec | $l"; done <"$2/summary.txt"
  else
    line+=" $(tail -1 "$LOGS/$name.log")"
  fi
  echo "$line"
}

job() {  # job NAME -> one summary line on stdout; everything else into $LOGS
  local spec=$1 t0; t0=$(date +%s)
  local name=${spec//:/_}
  IFS=: read -r kind a b c d e <<<"$spec"
  local line
  case "$kind" in
    tests)
      OUT=$LOGS TEST_TIMEOUT=${TEST_TIMEOUT:-450} bash bench/device_run.sh --no-build --all-gpu-tests --no-sanitizer \
        --no-bench >"$LOGS/tests_run.log" 2>&1
      line=$(grep -E '(passed|failed|error)' "$LOGS/gpu_tests.log" | tail -1) ;;
    uitests)
      timeout ${TEST_TIMEOUT:-300} $PY -m pytest -m gpu tests/test_vulkan.py tests/test_viewer.py tests/test_viewer_app.py \
        -q -rs -p no:cacheprovider >"$LOGS/ui_tests.log" 2>&1
      line=$(grep -E '(passed|failed|error)' "$LOGS/ui_tests.log" | tail -1) ;;
    sanitizer)
      OUT=$LOGS bash bench/device_run.sh --no-build --no-tests --no-bench >"$LOGS/sanitizer_run.log" 2>&1
      line=$(grep -E 'ERROR SUMMARY' "$LOGS/sanitizer.log" | tail -1) ;;
    fwdbench)
      OUT=$LOGS timeout ${JOB_TIMEOUT:-330} $PY bench/forward.py --scenes 160k,1M,3M,donut,fruit \
        --res 720p,1080p,4k --iters 50 >"$LOGS/forward.log" 2>&1
      line="rc=$? (forward.md)" ;;
    stepbench)
      OUT=$LOGS timeout ${JOB_TIMEOUT:-330} $PY bench/train_step.py >"$LOGS/train_step.log" 2>&1
      line="rc=$? (train_step.md)"
      env -u OUT timeout 120 $PY bench/train_step.py --profile --no-gsplat >"$LOGS/train_step_profile.log" 2>&1 ;;
    appbench)
      timeout ${JOB_TIMEOUT:-330} $PY bench/appearance.py --n 160000 1000000 --sizes 8x32 >"$LOGS/appearance.log" 2>&1
      line="rc=$? (appearance.log)" ;;
    ringbench)
      OUT=$LOGS timeout ${JOB_TIMEOUT:-330} $PY bench/ring_overhead.py ${RING_ARGS:-} >"$LOGS/ring_overhead.log" 2>&1
      line="rc=$? $(grep -E '^\|' "$LOGS/ring_overhead.log" | tail -1)" ;;
    multigpu)  # multigpu:RUNS:VIEWS[:TIMEOUT]  bench/multi_gpu.py (RUNS: jobs joined by +, @ for :, e.g. lego@1+lego@2+allreduce@2;
      # uses every GPU of the host: run it alone, in lane 0 with lane 1 empty); $MG_ARGS is passed on
      local mout=$LOGS/multigpu runs=${a:-lego@1+lego@2+bonsai@1+bonsai@2+allreduce@2}
      runs=${runs//+/,}; runs=${runs//@/:}
      OUT=$LOGS timeout -s INT ${c:-${JOB_TIMEOUT:-330}} $PY bench/multi_gpu.py --runs "$runs" --views "${b:-30000}" \
        --out "$mout" ${MG_ARGS:-} >"$LOGS/$name.log" 2>&1
      local rc=$?
      line="rc=$rc $(grep -cE '^\| ' "$mout/multi_gpu.md" 2>/dev/null) table rows (multigpu/multi_gpu.md)" ;;
    train)  # train:DATA:DS:APP:ITERS[:TIMEOUT]
      local data run=/tmp/run_$name wb=""; data=$(data_dir "$a")
      [ -f "$data/transforms_train.json" ] && wb="--white-bg"  # Blender sets (lego): white; captures: black
      rm -rf "$run"
      timeout -s INT ${e:-${JOB_TIMEOUT:-330}} $PY -m rigel_core.cli.train --data "$data" --out "$run" $wb --iters "$d" \
        --downscale "$b" --appearance "$c" --eval-every 7000 --checkpoint-every 0 --n-renders 2 --quiet ${TRAIN_ARGS:-} \
        >"$LOGS/$name.log" 2>&1
      local rc=$?
      cp "$run/metrics.json" "$LOGS/$name.metrics.json" 2>/dev/null
      cp "$run/log.txt" "$LOGS/$name.log.txt" 2>/dev/null
      mkdir -p "$LOGS/$name.renders"; cp $(find "$run/renders" -name "*.png" 2>/dev/null | sort | tail -4) "$LOGS/$name.renders/" 2>/dev/null
      line="rc=$rc $(run_metrics "$run/metrics.json")" ;;
    viewer)  # viewer:DATA:DS:ITERS[:TIMEOUT]
      local data run=/tmp/viewer_$name wb=""; data=$(data_dir "$a")
      [ "$a" != orbit ] && wb="--white-bg"
      [ "$b" != 1 ] && { line="viewer: downscale must be 1 (give a pre-scaled copy)"; echo "$spec | $line"; return; }
      rm -rf "$run"
      timeout -s INT ${d:-${JOB_TIMEOUT:-330}} $PY -m viewer --data "$data" $wb --offscreen --iters "$c" \
        --eval-every 7000 --frames 4 --size 1280x720 --out "$run" >"$LOGS/$name.log" 2>&1
      local rc=$?
      mkdir -p "$LOGS/$name.out"; cp "$run"/*.json "$run"/*.png "$LOGS/$name.out/" 2>/dev/null
      line="rc=$rc $($PY -c "
import json,sys
s=json.load(open('$run/summary.json'))
print({k: s.get(k) for k in ('frame_ring','vulkan_device','iterations','psnr','fps','ms_per_iter','seconds') if k in s})" 2>&1 | tail -1)" ;;
    studiogallery)  # PNGs outside logs.tgz so that they come back as files
      local gal; gal=$(dirname "$LOGS")/gallery; mkdir -p "$gal"
      timeout ${JOB_TIMEOUT:-330} $PY docs/gallery/make_studio_gallery.py --offscreen --device cuda \
        --data "$RIGEL_SHARED_DATA" --out "$gal" --prefix h200_offscreen_ >"$LOGS/studiogallery.log" 2>&1
      line="rc=$? $(cd "$gal" && ls *.png 2>/dev/null | tr '\n' ' ')" ;;
    real)  # real:SCENES:ITERS[:TIMEOUT[:METHODS]]
      local rout=$LOGS/$name scenes="" iters=${b:-7000,30000} methods=${d:-rigel,gsplat}
      [ "${a:-all}" != all ] && scenes="--scenes ${a//./,}"   # "." for "," (a comma stops a job's logs coming back)
      OUT=$rout timeout -s INT ${c:-${JOB_TIMEOUT:-330}} $PY bench/real.py $scenes --iters "${iters//./,}" \
        --methods "${methods//./,}" --out "$rout" ${REAL_ARGS:-} >"$LOGS/$name.log" 2>&1
      line=$(result_line $? "$rout" real.md) ;;
    mip)  # mip:ITERS[:TIMEOUT[:MODES[:DATA]]]
      local mout=$LOGS/$name
      OUT=$mout timeout -s INT ${b:-${JOB_TIMEOUT:-330}} $PY bench/mip.py --data "$(data_dir "${d:-lego}")" \
        --iters "${a:-30000}" --modes "${c:-default,mip}" --out "$mout" >"$LOGS/$name.log" 2>&1
      line=$(result_line $? "$mout" mip.md) ;;
    mcmc)  # mcmc:SCENES:ITERS[:TIMEOUT]
      local rout=$LOGS/$name scenes="" wb=""
      case "${a:-all}" in
        all) ;;
        lego|lego_half) scenes="--scenes $RIGEL_SHARED_DATA/$a"; wb="--white-bg" ;;
        *) scenes="--scenes $a" ;;
      esac
      OUT=$rout timeout -s INT ${c:-${JOB_TIMEOUT:-330}} $PY bench/real.py $scenes $wb --iters "${b:-7000,30000}" \
        --methods rigel,rigel-mcmc --out "$rout" ${MCMC_ARGS:-} >"$LOGS/$name.log" 2>&1
      line=$(result_line $? "$rout" real.md) ;;
    sweep)  # sweep:SCENES:ITERS:SEEDS[:TIMEOUT]  (lists with "." for ",": a comma in a job name stops its logs coming back)
      local sout=$LOGS/$name; local -a sargs
      eval "sargs=(${SWEEP_ARGS:---variant default})"  # shell words: a quoted --extra "..." stays one argument
      timeout -s INT ${d:-${JOB_TIMEOUT:-330}} $PY bench/real_sweep.py --scenes "${a//./,}" --iters "${b//./,}" \
        --seeds "${c//./,}" --out "$sout" "${sargs[@]}" >"$LOGS/$name.log" 2>&1
      line="rc=$? (sweep.md; $(tail -1 "$LOGS/$name.log"))"
      [ -s "$sout/sweep.md" ] && line+=$'\n'"$(cat "$sout/sweep.md")" ;;
    lens)  # lens:DATA:ITERS:SEEDS[:TIMEOUT]
      local lout=$LOGS/$name
      timeout -s INT ${d:-${JOB_TIMEOUT:-330}} $PY bench/lens_ab.py --data "$(data_dir "$a")" --iters "${b:-7000}" \
        --seeds "${c//./,}" --out "$lout" >"$LOGS/$name.log" 2>&1
      line="rc=$? $(tail -1 "$LOGS/$name.log" | cut -c1-200)"
      [ -s "$lout/lens.md" ] && line+=$'\n'"$(cat "$lout/lens.md")" ;;
    profile)  # profile:DATA[:WARM[:TIMEOUT]]
      local pout=$LOGS/$name
      timeout -s INT ${c:-${JOB_TIMEOUT:-330}} $PY bench/profile_trainer.py --data "$(data_dir "$a")" \
        --warm "${b:-2000}" --out "$pout" ${PROFILE_ARGS:-} >"$LOGS/$name.log" 2>&1
      local rc=$? found; found=$(grep -h '^## ' "$LOGS/$name.log" | cut -c1-230 | tr '\n' ' ')
      line="rc=$rc ${found:-$(tail -1 "$LOGS/$name.log" | cut -c1-230)}" ;;
    vtp)  # vtp[:DATA[:ITERS[:TIMEOUT]]]
      local vout=$LOGS/$name vdata=${a:-lego_half} wb=""
      [ "$vdata" = orbit ] && wb="--no-white-bg"
      OUT=$vout timeout -s INT ${c:-${JOB_TIMEOUT:-330}} $PY bench/viewer_throughput.py --data "$(data_dir "$vdata")" $wb \
        --iters "${b:-7000}" --out "$vout" ${VTP_ARGS:-} >"$LOGS/$name.log" 2>&1
      local rc=$?
      line="rc=$rc $(cat "$vout/summary.txt" 2>/dev/null || tail -1 "$LOGS/$name.log")" ;;
    roofline)  # roofline[:SIZES[:TIMEOUT]]
      local rout=$LOGS/$name sizes=${a:-300k.1M.3M} limit=${b:-180}
      OUT=$rout timeout -s INT -k 30 "$limit" $PY bench/roofline.py --ncu --sizes "${sizes//./,}" \
        --budget $(( limit > 40 ? limit - 20 : limit / 2 )) ${ROOFLINE_ARGS:-} >"$LOGS/$name.log" 2>&1
      line=$(result_line $? "$rout" roofline.md) ;;
    *) line="unknown job" ;;
  esac
  echo "$spec | $(( $(date +%s) - t0 ))s | $line"
}

lane() {  # lane GPU "jobs..." -> summary lines into $LOGS/lane$GPU.txt; "a+b" runs a and b at once on that GPU
  local gpu=$1; shift
  : >"$LOGS/lane$gpu.txt"
  for j in $1; do
    local pids=()
    for part in ${j//+/ }; do
      CUDA_VISIBLE_DEVICES=$gpu job "$part" | tee -a "$LOGS/lane$gpu.txt" & pids+=($!)
    done
    wait "${pids[@]}"
  done
}

# DEADLINE (seconds from the start, default 0 = none): the lanes get SIGINT then (training saves its run), so the
# tarball is still written inside the device call's limit.
export LOGS PY
export -f job lane run_metrics result_line data_dir orbit_dataset
run_lane() {
  local rem=0
  [ "${DEADLINE:-0}" -gt 0 ] && rem=$(( DEADLINE - ($(date +%s) - t_start) ))
  if [ "$rem" -gt 0 ]; then timeout -s INT -k 20 "$rem" bash -c 'lane "$0" "$1"' "$1" "$2"; else lane "$1" "$2"; fi
}
if [ "$ngpu" -ge 2 ]; then
  # two lanes share the CPU cores: cap torch's threads per process (oversubscribed, torch's CPU ops slow 10-50x)
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / 4 ))}
  run_lane 0 "$lane0" & p0=$!
  run_lane 1 "$lane1" & p1=$!
  wait $p0 $p1
else
  run_lane 0 "$lane0 $lane1"
fi
cat "$LOGS"/lane*.txt >"$OUT/summary.txt"
for f in forward.md train_step.md ring_overhead.md; do [ -f "$LOGS/$f" ] && cat "$LOGS/$f" >>"$OUT/summary.txt"; done
for f in "$LOGS"/real_*/real.md "$LOGS"/mip_*/mip.md "$LOGS"/mcmc_*/real.md "$LOGS"/vtp*/viewer_throughput.md \
    "$LOGS"/roofline*/roofline.md; do [ -f "$f" ] && cat "$f" >>"$OUT/summary.txt"; done
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "== device_all: $ngpu GPU(s), $(( $(date +%s) - t_start ))s =="
cat "$OUT/summary.txt"
# Exit status: 1 when a job's line reports a non-zero rc or failed tests (the table is still complete above).
if grep -qE '^[^|]+\| [0-9]+s \| (rc=[1-9]|(.*[^0-9])?[1-9][0-9]* (failed|errors?)\b)' "$OUT/summary.txt"; then
  echo "device_all: some jobs failed (lines above with rc != 0 or failed tests)"
  exit 1
fi
