#!/usr/bin/env bash
# Kernel A/B in one GPU call: build each variant of csrc/ in turn and time it with bench/forward.py, so that
# variants are compared on one machine in one session (gsplat's and the host's drift between calls is larger
# than most kernel changes; docs/BENCHMARKS.md, "Again at 8dcfed7 and 914860a").
#
# Here (git checkout), once per variant: copy csrc/ of a git ref into .ab/NAME/ (ignored; carried to the device):
#   bash bench/kernel_ab.sh --prepare before 914860a^ --prepare boxes main --prepare bitwalk raster-bitwalk
# On the GPU machine (device tool, carry .devcore, .data/ply and .ab):
#   source .devcore/env.sh && bash bench/kernel_ab.sh --run [--tests "tests/test_cuda_forward.py ..."] \
#       [--bench-args "--scenes 1M,donut --res 720p,4k"]
# --run builds every .ab/NAME in name order (csrc/ replaced by it; the working tree's csrc/ is put back at the
# end), runs the given GPU tests on each (pytest -m gpu) and bench/forward.py --no-gsplat --no-depth, and prints
# one table: per scene and resolution, the raster stage, the forward and forward+backward of each variant (ms).
# $OUT (default ./out) gets the table (ab.md) and one archive of the logs (ab_logs.tgz: build_NAME.log,
# tests_NAME.log, NAME/forward.md, NAME/bench.log): the device tool returns only a few files per call. A failed
# build, test run or bench prints its last lines. --ssim also runs bench/ssim.py on each variant (NAME/ssim.log;
# --ssim-args, default "--iters 50") and adds a second table to ab.md: the fused SSIM forward+backward ms per
# resolution (and the PyTorch path's, the same for every variant: a check of the machine's drift). The PLY scenes
# come from $RIGEL_SHARED_DATA (default ./.data, the carried copies, as bench/device_all.sh).
# --cmd CMD (repeatable) runs a shell command on each variant after the benches, e.g. a real capture's training
# step: --cmd "python3 bench/profile_trainer.py --data .data/real/beer --warm 2000 --modes graph --profile 20";
# its output goes to NAME/cmd_K.log, its lines starting with "## " are printed under the variant's line.
set -uo pipefail
PY=${PYTHON:-python3}
OUT=${OUT:-out}
export RIGEL_SHARED_DATA=${RIGEL_SHARED_DATA:-$PWD/.data}
prepare=() run=0 tests="" bench_args="--iters 30" ssim=0 ssim_args="--iters 50" cmds=()
while [ $# -gt 0 ]; do
  case "$1" in
    --prepare|--tests|--bench-args|--ssim-args|--cmd)
      need=2; [ "$1" = --prepare ] && need=3
      [ $# -ge "$need" ] || { echo "kernel_ab.sh: $1 needs $((need - 1)) value(s)" >&2; exit 2; } ;;
  esac
  case "$1" in
    --prepare) prepare+=("$2=$3"); shift 2 ;;
    --run) run=1 ;;
    --tests) tests=$2; shift ;;
    --bench-args) bench_args=$2; shift ;;
    --ssim) ssim=1 ;;
    --ssim-args) ssim_args=$2; shift ;;
    --cmd) cmds+=("$2"); shift ;;
    *) echo "kernel_ab.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

for pair in "${prepare[@]}"; do
  name=${pair%%=*} ref=${pair#*=}
  case "$name" in *[!A-Za-z0-9_-]*|"") echo "kernel_ab.sh: variant name '$name': letters, digits, - and _ only" >&2; exit 2 ;; esac
  git rev-parse --verify -q "$ref^{commit}" >/dev/null || { echo "kernel_ab.sh: $ref is not a commit" >&2; exit 2; }
  rm -rf ".ab/$name" && mkdir -p ".ab/$name" || exit 1
  git archive "$ref" csrc | tar -x -C ".ab/$name" || exit 1
  echo "$ref ($(git rev-parse --short "$ref"))" >".ab/$name/REF"
  echo ".ab/$name: csrc/ of $(cat ".ab/$name/REF")"
done
[ "$run" = 1 ] || exit 0

[ -d .ab ] && [ -n "$(ls -A .ab)" ] || { echo "kernel_ab.sh: no variants in .ab/ (--prepare them first)" >&2; exit 2; }
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
RESULT=$OUT OUT=$(mktemp -d)  # logs gathered here, archived into $RESULT at the end
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
keep=$(mktemp -d) && cp -a csrc "$keep/"
# Put the tree's csrc/ back, newer than every object built here, so that the next build compiles it again (until
# then rigel_core/_C is the last variant's).
last_built=""
finish() {
  rm -rf csrc && cp -a "$keep/csrc" csrc && find csrc -type f -exec touch {} + && rm -rf "$keep"
  tar -czf "$RESULT/ab_logs.tgz" -C "$OUT" . && rm -rf "$OUT"
  if [ -n "$last_built" ]; then
    echo "kernel_ab.sh: csrc/ restored; rigel_core/_C is variant $last_built's until the next build"
  else
    echo "kernel_ab.sh: csrc/ restored; no variant built (rigel_core/_C as before; the next build recompiles csrc/)"
  fi
}
trap finish EXIT
# logged VARIANT WHAT LOG TIMEOUT CMD...: run CMD under the time limit into LOG; on failure one line and LOG's tail
logged() {
  local name=$1 what=$2 log=$3 limit=$4
  shift 4
  timeout "$limit" "$@" >"$log" 2>&1 && return 0
  local rc=$?
  echo "$name: $what failed (rc $rc; 124: its time limit, $limit s):"
  tail -4 "$log"
  return "$rc"
}
names=() prev=""
for dir in .ab/*/; do
  name=$(basename "$dir")
  [ -d "$dir/csrc" ] || continue
  names+=("$name")
  rm -rf csrc && cp -a "$dir/csrc" csrc
  # The extracted files carry their commit's time, possibly older than the objects of the previous build: touch
  # what differs from the previous variant (everything for the first), or the build would keep stale objects.
  if [ -z "$prev" ]; then
    find csrc -type f -exec touch {} +
  else
    (cd csrc && find . -type f) | while read -r f; do cmp -s "csrc/$f" "$prev/csrc/$f" || touch "csrc/$f"; done
  fi
  prev=$dir
  t0=$(date +%s)
  if ! $PY setup.py build_ext --inplace >"$OUT/build_$name.log" 2>&1; then
    echo "$name ($(cat "$dir/REF")): build failed, see build_$name.log"; tail -5 "$OUT/build_$name.log"; continue
  fi
  last_built=$name
  line="$name ($(cat "$dir/REF")): build $(( $(date +%s) - t0 ))s"
  if [ -n "$tests" ]; then
    # shellcheck disable=SC2086
    timeout "${TEST_TIMEOUT:-240}" $PY -m pytest -m gpu -q -p no:cacheprovider $tests >"$OUT/tests_$name.log" 2>&1
    line+=", tests: $(grep -E '(passed|failed|error)' "$OUT/tests_$name.log" | tail -1)"
  fi
  echo "$line"
  [ -n "$tests" ] && grep -qE '[0-9]+ (failed|error)' "$OUT/tests_$name.log" &&
    grep -E '^(FAILED|ERROR|E  )|RIGEL_SEED' "$OUT/tests_$name.log" | cut -c1-300 | head -20
  mkdir -p "$OUT/$name"
  # shellcheck disable=SC2086
  logged "$name" bench/forward.py "$OUT/$name/bench.log" "${BENCH_TIMEOUT:-200}" \
    env OUT="$OUT/$name" $PY bench/forward.py --no-gsplat --no-depth $bench_args
  # shellcheck disable=SC2086
  [ "$ssim" = 1 ] && logged "$name" bench/ssim.py "$OUT/$name/ssim.log" "${BENCH_TIMEOUT:-200}" $PY bench/ssim.py $ssim_args
  k=0
  for c in "${cmds[@]}"; do
    k=$((k + 1))
    logged "$name" "--cmd $k" "$OUT/$name/cmd_$k.log" "${CMD_TIMEOUT:-200}" bash -c "$c"
    grep -E '^## ' "$OUT/$name/cmd_$k.log" | cut -c1-300 | sed "s/^/  $name cmd $k: /"
  done
done
SSIM_TABLE=$ssim $PY - "$OUT" "${names[@]}" <<'PYEOF' | tee "$RESULT/ab.md"
import os
import re
import sys
from pathlib import Path
out, names = Path(sys.argv[1]), sys.argv[2:]
ssim = {}  # name -> {resolution: (torch ms, fused ms)}, lines "WxH: torch T ms, fused F ms ..." of bench/ssim.py
for name in names if os.environ.get("SSIM_TABLE") == "1" else []:
    log = out / name / "ssim.log"
    found = re.findall(r"^(\d+x\d+): torch ([\d.]+) ms, fused ([\d.]+) ms", log.read_text() if log.exists() else "",
                       re.M)
    if found:
        ssim[name] = {res: (t, f) for res, t, f in found}
cols = {}  # name -> {(scene, res): (raster, total, fwd+bwd)}
for name in names:
    md = out / name / "forward.md"
    if not md.exists():
        continue
    rows = [l.split("|")[1:-1] for l in md.read_text().splitlines() if l.startswith("| ") and "---" not in l]
    head = [c.strip() for c in rows[0]]
    idx = [head.index(k) for k in ("raster", "total", "fwd+bwd")]
    cols[name] = {(r[0].strip(), r[2].strip()): tuple(r[i].strip() for i in idx) for r in rows[1:]}
if not cols and not ssim:
    sys.exit("kernel_ab.sh: no forward.md came out")
if cols:
    keys = list(next(iter(cols.values())))
    fnames = list(cols)
    hdr = ["scene", "resolution"] + [f"{k} {n}" for k in ("raster", "fwd", "fwd+bwd") for n in fnames]
    print("| " + " | ".join(hdr) + " |\n|" + "---|" * len(hdr))
    for key in keys:
        vals = [cols[n].get(key, ("-",) * 3)[i] for i in range(3) for n in fnames]
        print("| " + " | ".join(list(key) + vals) + " |")
else:
    print("(no forward.md came out)")
if ssim:
    snames = list(ssim)
    print("\nSSIM forward+backward (bench/ssim.py, ms per call; torch = the PyTorch path, machine drift check)\n")
    hdr = ["resolution"] + [f"fused {n}" for n in snames] + [f"torch {n}" for n in snames]
    print("| " + " | ".join(hdr) + " |\n|" + "---|" * len(hdr))
    for res in ssim[snames[0]]:
        vals = [ssim[n].get(res, ("-", "-"))[1] for n in snames] + [ssim[n].get(res, ("-", "-"))[0] for n in snames]
        print("| " + " | ".join([res] + vals) + " |")
PYEOF
