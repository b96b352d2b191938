#!/bin/bash
# Issue 37's GPU check in one command, on a machine with a CUDA GPU: the --gpu-quick bench (JSON
# and log), the CUDA-against-CPU tests (tests/gpu) and the CUDA parts of the unit tests, bf16 and
# fp16 against fp32 per output kind (bench/precision.py), where a call's time goes
# (bench/gpu_profile.py, to explain a missed target), the host's own time per picture
# (bench/host_overhead.py) and whether the relevance passes run as captured CUDA graphs, with
# what a replay gains (bench/graph_probe.py).
#
#   bash bench/gpu_run.sh [OUT_DIR]        # OUT_DIR defaults to docs/bench
#
# With the device tool and the shared GPU kit (../shared/tools/gpu/README.md), from the project
# root, after the last code change: `bash ../shared/tools/gpu/pack.sh` (the device imports the
# packed wheel, not the checkout; its image has pytest), then the tool's `run` with carry
# [".gpu"], timeout_s 360 (three H100 runs ran 183-231 s before the graph probe's step) and the command
#   CMD='bash bench/gpu_run.sh $OUT' bash .gpu/run.sh
# and copy the files that come back (gpu-*.json) into docs/bench/ here.
#
# Environment: PYTHON (default python3), HEADSCOPE_MODELS_DIR (default models/), BENCH_S,
# TESTS_S and EXTRA_S (each step's own limit, default 270, 150 and 60 s each), TOTAL_S (the whole
# script's, default 340: keep it under the device call's timeout_s, so the script ends itself and
# prints its summary; a step gets at most what is left, less 5 s for each step after it, and a step
# with under 10 s left is skipped, saying so; the device lends 15 minutes in all), BENCH_ARGS (more bench.run arguments), DEVICE=cpu for a dry run of this script on a
# machine without a GPU (the bench smoke-sized, tests/gpu run CPU against CPU).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT_DIR=${1:-docs/bench}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
STAMP=$(date -u +%Y%m%d-%H%M)
MODELS=${HEADSCOPE_MODELS_DIR:-models}
T0=$SECONDS
TOTAL=${TOTAL_S:-340}

# limit CAP LATER: seconds for the next step, its own CAP or what TOTAL leaves (5 s kept for each
# of the LATER steps after it), whichever is less; 0 when under 10 s are left.
limit() {
  local left=$(( TOTAL - (SECONDS - T0) - 5 * $2 ))
  (( left > $1 )) && left=$1
  (( left < 10 )) && left=0
  echo "$left"
}
# step NAME SECONDS: false (and a line saying so) when the step has no time left.
step() {
  if (( $2 == 0 )); then echo "gpu_run: $1 skipped: TOTAL_S (${TOTAL} s) is spent"; return 1; fi
}

DEVICE=${DEVICE:-cuda}
[[ $DEVICE == cpu ]] || "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" || {
  echo "gpu_run: no CUDA GPU here (torch.cuda.is_available() is False); DEVICE=cpu for a dry run" >&2
  exit 2
}

lim=$(limit "${BENCH_S:-270}" 5)
echo "== bench: python -m bench.run --device $DEVICE --gpu-quick (limit $lim s)"
if step bench "$lim"; then
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
  timeout "$lim" "$PY" -m bench.run --device "$DEVICE" --gpu-quick --models-dir "$MODELS" \
    --out "$OUT_DIR/gpu-quick-$STAMP.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT_DIR/gpu-quick-$STAMP.log" | tail -60
  bench_rc=${PIPESTATUS[0]}
else
  bench_rc=124
fi

lim=$(limit "${TESTS_S:-150}" 4)
echo "== tests: tests/gpu and the CUDA unit tests (limit $lim s)"
if ! step tests "$lim"; then
  tests_rc=124
elif "$PY" -c "import pytest" 2>/dev/null; then
  HEADSCOPE_GPU_TESTS_DEVICE=$DEVICE timeout "$lim" "$PY" -m pytest -q -p no:cacheprovider -W ignore::pytest.PytestConfigWarning \
    tests/gpu tests/unit/serving/test_answer_threads.py 2>&1 | tee "$OUT_DIR/gpu-tests-$STAMP.log" | tail -40
  tests_rc=${PIPESTATUS[0]}
else
  echo "gpu_run: pytest is not installed here (see the header of this script)" | tee "$OUT_DIR/gpu-tests-$STAMP.log"
  tests_rc=3
fi

lim=$(limit "${EXTRA_S:-60}" 3)
echo "== precision: bf16 and fp16 against fp32 per output kind (limit $lim s)"
# fp16 on a CPU takes minutes (no fast fp16 matmul there): a dry run checks bf16 only.
precisions=$([[ $DEVICE == cpu ]] && echo bf16 || echo bf16,fp16)
step precision "$lim" && timeout "$lim" "$PY" -m bench.precision --device "$DEVICE" --models-dir "$MODELS" \
  --precisions "$precisions" --out "$OUT_DIR/gpu-precision-$STAMP.json" 2>&1 | tail -30
lim=$(limit "${EXTRA_S:-60}" 2)
echo "== profile: where a call's time goes (limit $lim s)"
small=$([[ $DEVICE == cpu ]] && echo --small)
# shellcheck disable=SC2086  # small is a list of arguments
step profile "$lim" && timeout "$lim" "$PY" -m bench.gpu_profile --device "$DEVICE" --models-dir "$MODELS" $small \
  --out "$OUT_DIR/gpu-profile-$STAMP.json" 2>&1 | grep -v "^USDT:" | tail -60

lim=$(limit "${EXTRA_S:-60}" 1)
echo "== host: the host's own time per picture, a 32 px ViT on the device (limit $lim s)"
step host "$lim" && timeout "$lim" "$PY" -m bench.host_overhead --device "$DEVICE" \
  --out "$OUT_DIR/gpu-host-$STAMP.json" 2>&1 | grep -v "^USDT:" | tail -12

lim=$(limit "${EXTRA_S:-60}" 0)
echo "== graphs: the relevance passes as captured CUDA graphs (limit $lim s)"
probe_size=$([[ $DEVICE == cpu ]] && echo "--batch 2 --rounds 2")
# shellcheck disable=SC2086  # probe_size is a list of arguments
step graphs "$lim" && timeout "$lim" "$PY" -m bench.graph_probe --device "$DEVICE" --models-dir "$MODELS" $probe_size \
  --out "$OUT_DIR/gpu-graphs-$STAMP.json" 2>&1 | grep -v "^USDT:" | tail -12

echo "gpu_run: $(( SECONDS - T0 )) s of TOTAL_S $TOTAL; bench exit $bench_rc, tests exit $tests_rc; results in $OUT_DIR (gpu-quick-$STAMP.json)"
[[ $bench_rc -eq 0 ]] || exit "$bench_rc"
exit "$tests_rc"
