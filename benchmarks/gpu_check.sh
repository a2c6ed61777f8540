#!/usr/bin/env bash
# The GPU check (issue 10), in one go and without network:
#   1. the test suite on CUDA (SPECDEC_TEST_DEVICE=cuda), the files that exercise the decode loop
#      first, under a time limit;
#   2. per-step costs, compile off and on (benchmarks/gpu_step_costs.py): the tiny test pair, then
#      a Llama-3.1-8B-shaped target with a Llama-3.2-1B-shaped draft (bf16, random weights).
# Under 8 minutes in all with the default limits. On a machine without CUDA it says so and exits 0.
#
#   benchmarks/gpu_check.sh            (from anywhere; uses .venv/bin/python when there is one)
#   TEST_LIMIT=200 BENCH_LIMIT=260 PYTHON=python3 benchmarks/gpu_check.sh
#
# Exit status: 0 when the tests passed and the benchmark finished, else 1.
set -u
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
TEST_LIMIT="${TEST_LIMIT:-200}"    # seconds for the test suite
BENCH_LIMIT="${BENCH_LIMIT:-260}"  # seconds for the benchmark

if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
    echo "gpu_check: $PYTHON cannot import torch; nothing to do"
    exit 0
fi
if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing to do"
    exit 0
fi

# no network: models are built from configs, the hub is never asked
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export SPECDEC_TEST_DEVICE=cuda

"$PYTHON" -c 'import torch, transformers; print(f"gpu_check: {torch.cuda.get_device_name()} · torch {torch.__version__} (CUDA {torch.version.cuda}) · transformers {transformers.__version__}")'

# the decode loop's own tests first, so that a time limit cuts the least telling ones
first=(tests/test_compiled.py tests/test_greedy_identity.py tests/test_sampling_exact.py tests/test_kv_cache.py
       tests/test_drafters.py tests/test_sampler.py tests/test_bench_tune.py tests/test_cli.py)
rest=()
for file in tests/test_*.py; do
    case " ${first[*]} " in *" $file "*) ;; *) rest+=("$file") ;; esac
done

echo "== 1. tests on CUDA (SPECDEC_TEST_DEVICE=cuda, limit ${TEST_LIMIT} s)"
started=$SECONDS
timeout --signal=INT --kill-after=15 "$TEST_LIMIT" "$PYTHON" -m pytest -q -p no:cacheprovider "${first[@]}" "${rest[@]}"
tests_rc=$?
case $tests_rc in
    0) tests_verdict="passed" ;;
    124|137) tests_verdict="stopped at the ${TEST_LIMIT} s limit (see the last lines above)" ;;
    *) tests_verdict="FAILED (pytest exit $tests_rc)" ;;
esac
echo "gpu_check: tests $tests_verdict in $((SECONDS - started)) s"

echo "== 2. per-step costs, compile off and on (limit ${BENCH_LIMIT} s)"
started=$SECONDS
timeout --kill-after=15 "$BENCH_LIMIT" "$PYTHON" benchmarks/gpu_step_costs.py --device cuda
bench_rc=$?
if [ $bench_rc -eq 0 ]; then
    echo "gpu_check: benchmark finished in $((SECONDS - started)) s"
else
    echo "gpu_check: benchmark stopped (exit $bench_rc) after $((SECONDS - started)) s; the rows above are complete"
fi

[ $tests_rc -eq 0 ] && [ $bench_rc -eq 0 ]
