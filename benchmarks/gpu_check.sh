#!/usr/bin/env bash
# The GPU check, in one go and without network:
#   0. wheels from .whl/ (benchmarks/gpu_wheels.sh made them where pip works) installed into
#      /tmp/gpu_check_site, then a check that this Python holds what pyproject.toml asks for: a
#      wrong environment stops here in seconds (transformers < 5.24 ignores `cache=` and would
#      decode without a KV cache);
#   1. per-step costs, compile off and on (benchmarks/gpu_step_costs.py): the tiny test pair, in
#      float32 and int8 (a quick check that compiling and CUDA graphs work), then a
#      Llama-3.1-8B-shaped target with a Llama-3.2-1B-shaped draft (bf16, random weights), then the
#      same pair int4 (the last rows: the limit may cut them);
#   2. the tests that exercise models on CUDA (SPECDEC_TEST_DEVICE=cuda), four pytest workers
#      where there are 8+ cores (else the suite's default, a worker per core), under a time limit.
# Under 9 minutes with the default limits. Everything it prints also goes to $OUT/gpu_check.log
# (/tmp without $OUT). On a machine without CUDA it says so and exits 0.
#
#   bash benchmarks/gpu_wheels.sh                     (here, once: the wheels a bare GPU image lacks)
#   bash benchmarks/gpu_check.sh                      (there; uses .venv/bin/python when there is one)
#   TEST_LIMIT=180 BENCH_LIMIT=300 PYTHON=python3 bash benchmarks/gpu_check.sh
#   GPU_CHECK_DEVICE=cpu bash benchmarks/gpu_check.sh (a dry run of every stage on the CPU, tiny pair only)
# On a lent machine whose files come back from $OUT: carry `.whl`, command `bash benchmarks/gpu_check.sh`,
# a time limit of about 560 s (the stages' limits, plus start-up), then put the table in BENCHMARKS.md.
#
# Exit status: 0 when the benchmark and the tests passed, else 1.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
LOG="${OUT:-/tmp}/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1

PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
TEST_LIMIT="${TEST_LIMIT:-180}"    # seconds for the tests
BENCH_LIMIT="${BENCH_LIMIT:-300}"  # seconds for the benchmark
DEVICE="${GPU_CHECK_DEVICE:-cuda}"

echo "== 0. environment"
if compgen -G ".whl/*.whl" >/dev/null; then
    site=/tmp/gpu_check_site
    if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl; then
        echo "gpu_check: installing the wheels in .whl/ failed"
        exit 1
    fi
    export PYTHONPATH="$site"
    echo "gpu_check: $(ls .whl/*.whl | wc -l) wheels from .whl/ installed into $site"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's specdec_cli, in child processes too

if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
    echo "gpu_check: $PYTHON cannot import torch; nothing to do"
    exit 0
fi
if [ "$DEVICE" = cuda ] && ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing to do"
    exit 0
fi
if ! "$PYTHON" benchmarks/check_requirements.py --extra dev; then
    echo "gpu_check: this Python lacks what specdec needs (above); make wheels with benchmarks/gpu_wheels.sh and carry .whl/"
    exit 1
fi

# no network: models are built from configs, the hub is never asked
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export SPECDEC_TEST_DEVICE="$DEVICE"
"$PYTHON" -c 'import sys, torch; d = sys.argv[1]; name = torch.cuda.get_device_name() if d == "cuda" else "CPU"; print(f"gpu_check: {name} · torch {torch.__version__} (CUDA {torch.version.cuda})")' "$DEVICE"

echo "== 1. per-step costs, compile off and on (limit ${BENCH_LIMIT} s)"
started=$SECONDS
pairs=()
[ "$DEVICE" = cuda ] || pairs=(--tiny)
timeout --kill-after=15 "$BENCH_LIMIT" "$PYTHON" benchmarks/gpu_step_costs.py --device "$DEVICE" "${pairs[@]}"
bench_rc=$?
case $bench_rc in
    0) echo "gpu_check: benchmark finished in $((SECONDS - started)) s" ;;
    124|137) echo "gpu_check: benchmark stopped at the ${BENCH_LIMIT} s limit; the rows above are complete" ;;
    *) echo "gpu_check: benchmark ended with exit $bench_rc after $((SECONDS - started)) s (FAILED rows above)" ;;
esac

# the files whose tests run models on the device under test; the others (profiles, export,
# endpoint, terminal, hostile input) test nothing a GPU changes
files=(tests/runtime/test_compiled.py tests/decoding/test_greedy_identity.py tests/decoding/test_sampling_exact.py tests/decoding/test_kv_cache.py
       tests/decoding/test_trees.py tests/drafters/test_drafters.py tests/bench/test_selfcheck.py tests/bench/test_bench_tune.py
       tests/drafters/test_heads_greedy.py tests/drafters/test_heads_sampling.py)
for file in "${files[@]}"; do  # a renamed test file must fail here, not leave the GPU untested
    [ -f "$file" ] || { echo "gpu_check: $file is not in this checkout; update the list in $0"; exit 1; }
done
parallel=()
cores=$(nproc)
# four pytest workers where there are cores for them (a GPU machine's 16); each takes its share of
# the CPU threads (tests/conftest.py)
if [ "$cores" -ge 8 ]; then
    parallel=(-n 4)
fi
echo "== 2. tests on $DEVICE (SPECDEC_TEST_DEVICE=$DEVICE, ${parallel[*]:-a worker per core}, limit ${TEST_LIMIT} s)"
started=$SECONDS
timeout --signal=INT --kill-after=15 "$TEST_LIMIT" "$PYTHON" -m pytest -q -p no:cacheprovider --tb=short -rfE \
    "${parallel[@]}" "${files[@]}"
tests_rc=$?
case $tests_rc in
    0) tests_verdict="passed" ;;
    124|137) tests_verdict="stopped at the ${TEST_LIMIT} s limit (see the last lines above)" ;;
    *) tests_verdict="FAILED (pytest exit $tests_rc)" ;;
esac
echo "gpu_check: tests $tests_verdict in $((SECONDS - started)) s; log in $LOG"

[ $tests_rc -eq 0 ] && [ $bench_rc -eq 0 ]
