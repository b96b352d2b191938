#!/bin/bash
# Issue 37's GPU check in one command, on a machine with a CUDA GPU: the --gpu-quick bench (JSON
# and log), then the CUDA-against-CPU tests (tests/gpu) and the CUDA parts of the unit tests.
#
#   bash bench/gpu_run.sh [OUT_DIR]        # OUT_DIR defaults to docs/bench
#
# With the device tool and the shared GPU kit (../shared/tools/gpu/README.md), from the project
# root, after the last code change: `bash ../shared/tools/gpu/pack.sh` (the device imports the
# packed wheel, not the checkout), pytest's wheels beside the others (the device has no pytest):
#   python3 -m pip download -q --no-deps --only-binary=:all: -d .gpu/whl pytest pluggy iniconfig
# then the tool's `run` with carry [".gpu"], timeout_s 540 and the command
#   CMD='bash bench/gpu_run.sh $OUT' bash .gpu/run.sh
# and copy the files that come back (gpu-quick-*.json) into docs/bench/ here.
#
# Environment: PYTHON (default python3), HEADSCOPE_MODELS_DIR (default models/), BENCH_S and
# TESTS_S (time limits, default 300 and 180 s: the device lends 15 minutes in all),
# BENCH_ARGS (more bench.run arguments), DEVICE=cpu for a dry run of this script on a machine
# without a GPU (the bench smoke-sized, tests/gpu skipped).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT_DIR=${1:-docs/bench}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
STAMP=$(date -u +%Y%m%d-%H%M)
MODELS=${HEADSCOPE_MODELS_DIR:-models}

DEVICE=${DEVICE:-cuda}
[[ $DEVICE == cpu ]] || "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" || {
  echo "gpu_run: no CUDA GPU here (torch.cuda.is_available() is False); DEVICE=cpu for a dry run" >&2
  exit 2
}

echo "== bench: python -m bench.run --device $DEVICE --gpu-quick (limit ${BENCH_S:-300} s)"
# shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
timeout "${BENCH_S:-300}" "$PY" -m bench.run --device "$DEVICE" --gpu-quick --models-dir "$MODELS" \
  --out "$OUT_DIR/gpu-quick-$STAMP.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT_DIR/gpu-quick-$STAMP.log" | tail -60
bench_rc=${PIPESTATUS[0]}

echo "== tests: tests/gpu and the CUDA unit tests (limit ${TESTS_S:-180} s)"
if "$PY" -c "import pytest" 2>/dev/null; then
  timeout "${TESTS_S:-180}" "$PY" -m pytest -q -p no:cacheprovider -W ignore::pytest.PytestConfigWarning \
    tests/gpu tests/unit/serving/test_answer_threads.py 2>&1 | tee "$OUT_DIR/gpu-tests-$STAMP.log" | tail -40
  tests_rc=${PIPESTATUS[0]}
else
  echo "gpu_run: pytest is not installed here (see the header of this script)" | tee "$OUT_DIR/gpu-tests-$STAMP.log"
  tests_rc=3
fi

echo "gpu_run: bench exit $bench_rc, tests exit $tests_rc; results in $OUT_DIR (gpu-quick-$STAMP.json)"
[[ $bench_rc -eq 0 ]] || exit "$bench_rc"
exit "$tests_rc"
