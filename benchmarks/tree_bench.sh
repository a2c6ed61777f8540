#!/usr/bin/env bash
# Token trees on the real Qwen2.5-Coder pair (local bf16 folders, see profiles/qwen-coder-local.yaml):
# v(n) of the target and the draft, compiled vs eager; chains vs trees on Spec-Bench coding
# (model drafter, dtype auto; then the int8 draft); prompt lookup chain vs tree on extraction
# and summarization. Run it alone: 2 cores measure nothing next to another heavy process.
#   bash benchmarks/tree_bench.sh [OUT_DIR]      (~30-40 min on a 2-core EPYC)
set -euo pipefail
OUT=${1:-bench-results/trees}
SB=${SPEC_BENCH:?set SPEC_BENCH to Spec-Bench\'s question.jsonl}
PAIR=${PAIR:-$HOME/.cache/specdec-bench}
mkdir -p "$OUT"
grep -m1 'model name' /proc/cpuinfo | tee "$OUT/cpu.txt"
grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|avx512_vnni|amx_bf16)$' | tr '\n' ' ' | tee -a "$OUT/cpu.txt"; echo

echo "== v(n), target (dtype auto on this CPU: bf16 with AVX512-BF16, else fp32)"
DTYPE=$(python -c "import torch; print('bfloat16' if 'avx512_bf16' in open('/proc/cpuinfo').read() else 'float32')")
python benchmarks/compile_costs.py "$PAIR/qwen2.5-coder-1.5b-instruct" --dtype "$DTYPE" --widths 1,2,4,8,12,16,24,32,48,64 --runs 3 | tee "$OUT/v_target.txt"
echo "== v(n), draft"
python benchmarks/compile_costs.py "$PAIR/qwen2.5-coder-0.5b-instruct" --dtype "$DTYPE" --widths 1,2,4,8,16 --runs 3 | tee "$OUT/v_draft.txt"

echo "== coding: chains vs trees, model drafter, compiled"
specdec tune-k -p qwen-coder-local --compile on --prompts "$SB" --category coding --limit 3 -n 96 --repeats 1 \
  --ks 4,6,8 --trees 8,16,24/4/8,32/4/10,auto -o "$OUT/tune_coding.json" | tee "$OUT/tune_coding.txt"

echo "== prompt lookup: chain vs tree on extraction and summarization"
cat > "$OUT/qwen-ngram.yaml" <<YAML
name: qwen-ngram-local
target: {model: $PAIR/qwen2.5-coder-1.5b-instruct, dtype: auto}
drafter: {kind: ngram, max_ngram: 3}
k: 8
YAML
specdec tune-k -p "$OUT/qwen-ngram.yaml" --compile on --prompts "$SB" --category extraction --category summarization \
  --limit 2 -n 96 --repeats 1 --ks 4,8,16 --trees 16/4/8,32/4/16,auto -o "$OUT/tune_ngram.json" | tee "$OUT/tune_ngram.txt"

echo "== coding: the best chain and tree vs transformers' assisted generation at constant k (same draft object)"
specdec bench -p qwen-coder-local --compile on --prompts "$SB" --category coding --limit 3 -n 96 --repeats 1 \
  --methods plain,specdec,specdec-tree,hf-assisted -k 6 --tree 32,4,10 --hf-ks 4,6,8 -o "$OUT/bench_coding.json" | tee "$OUT/bench_coding.txt"

echo "== tree: auto beside fixed trees and the chain"
specdec tune-k -p qwen-coder-local --compile on --prompts "$SB" --category coding --limit 3 -n 96 --repeats 1 \
  --ks 6 --no-auto --trees 8,32/4/10,auto -o "$OUT/tune_auto.json" | tee "$OUT/tune_auto.txt"

echo "== int8 draft: chains vs trees"
specdec tune-k -p qwen-coder-local-int8 --compile on --prompts "$SB" --category coding --limit 3 -n 96 --repeats 1 \
  --ks 5,8 --no-auto --trees 8,32/4/10 -o "$OUT/tune_int8.json" | tee "$OUT/tune_int8.txt"
