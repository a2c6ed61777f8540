#!/usr/bin/env bash
# The CPU aims on the real Qwen2.5-Coder pair (local bf16 folders, see profiles/qwen-coder-local.yaml),
# in float32 (what dtype auto picks on a CPU without native bf16; DTYPE=bfloat16 for a CPU with
# AVX512-BF16 or AMX, where auto picks bf16), compile on:
#   v(n) of the target, compiled vs eager, n = 1..16;
#   plain, specdec (k: auto) and transformers' generate alone and assisted at constant k = 3, 5, 8,
#   same draft object, on Spec-Bench coding prompts (bench: paired per prompt, same run), with the
#   0.5B draft in the same dtype (qwen-coder-local) and with its Linear layers in dynamic int8
#   (qwen-coder-local-int8).
#   bash benchmarks/cpu_aims.sh [OUT_DIR]           (~70 min on a 2-core EPYC; run it alone)
#   AVX2=emulate bash benchmarks/cpu_aims.sh OUT    on an AVX512 host: torch's kernels held to AVX2
#   DTYPE=bfloat16 bash benchmarks/cpu_aims.sh OUT  on a CPU with native bf16
# AVX2=emulate sets ATEN_CPU_CAPABILITY=avx2 (ATen's kernels and inductor's vector ISA),
# ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS and FBGEMM_ENABLE_INSTRUCTIONS (the int8 draft's GEMMs)
# to AVX2: the AVX2 code paths on this machine's cores, caches and memory, which is close to an
# AVX2-only CPU but not one (the clock and the memory bandwidth stay this machine's).
set -euo pipefail
OUT=${1:-bench-results/cpu-aims}
SB=${SPEC_BENCH:?set SPEC_BENCH to Spec-Bench\'s question.jsonl}
PAIR=${PAIR:-$HOME/.cache/specdec-bench}
DTYPE=${DTYPE:-float32}
if [ "${AVX2:-}" = emulate ]; then
  export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2
fi
mkdir -p "$OUT"
python -c "import sys; sys.path.insert(0, 'benchmarks'); from compile_costs import cpu_line; print(cpu_line())" | tee "$OUT/cpu.txt"

echo "== v(n) of the target, $DTYPE, compiled vs eager"
python benchmarks/compile_costs.py "$PAIR/qwen2.5-coder-1.5b-instruct" --dtype "$DTYPE" \
  --widths 1,2,3,4,5,6,8,12,16 --runs 5 | tee "$OUT/v_target.txt"

for profile in qwen-coder-local qwen-coder-local-int8; do
  echo "== coding, $profile: plain, specdec and transformers' generate, alone and assisted (same draft object)"
  specdec bench -p "$profile" --dtype "$DTYPE" --compile on --prompts "$SB" --category coding --limit 3 \
    -n 96 --repeats 2 --methods plain,specdec,hf-plain,hf-assisted -k auto --hf-ks 3,5,8 \
    -o "$OUT/bench_$profile.json" | tee "$OUT/bench_$profile.txt"
done
