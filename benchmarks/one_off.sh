#!/usr/bin/env bash
# A one-off run from a shell, as a user types it: wall seconds of `specdec generate` (the int4 pair's
# shipped profile as it is, then --compile on in a second process, then --compile off) beside
# llama.cpp's `llama-cli -st` (plain, --spec-default, and with the 0.5B draft), one coding prompt,
# 128 new tokens, greedy. Each command runs REPEATS times in turn; run it alone on the machine.
#
#   benchmarks/one_off.sh LLAMA_BIN_DIR [OUT_DIR]
#
# LLAMA_BIN_DIR holds llama-cli (built from llama.cpp); the GGUFs and the pair are the ones
# ../shared/models/get-qwen-coder-pair wrote (~/.cache/specdec-bench). Settings: REPEATS (3),
# PROFILE (qwen-coder-local-int4), N (128), INDUCTOR (a fresh folder for --compile on's first run).
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 LLAMA_BIN_DIR [OUT_DIR]" >&2; exit 2; }
BIN=$1; OUT=${2:-one-off-$(date +%Y%m%d-%H%M)}; mkdir -p "$OUT"
REPEATS=${REPEATS:-3}; PROFILE=${PROFILE:-qwen-coder-local-int4}; N=${N:-128}
PAIR=~/.cache/specdec-bench
PROMPT="Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring and type hints."
export SPECDEC_INDUCTOR=${INDUCTOR:-$OUT/inductor}

timed() {  # label, command...: appends "label<TAB>wall" to $OUT/walls.tsv, keeps stderr
  local label=$1; shift
  local start end
  start=$(date +%s.%N)
  "$@" > "$OUT/$label.out" 2> "$OUT/$label.err" < /dev/null
  end=$(date +%s.%N)
  printf '%s\t%.2f\n' "$label" "$(echo "$end - $start" | bc)" | tee -a "$OUT/walls.tsv"
}

grep -m1 "model name" /proc/cpuinfo > "$OUT/machine.txt"
grep -o -w 'avx2\|avx512_vnni\|avx512_bf16\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ' >> "$OUT/machine.txt"
# --compile on, first process: an empty inductor cache (the kernels and packed weights may be warm)
TORCHINDUCTOR_CACHE_DIR=$SPECDEC_INDUCTOR timed specdec-compile-on-first specdec generate -p "$PROFILE" -n "$N" -f text -v --compile on "$PROMPT"
for r in $(seq "$REPEATS"); do
  timed "specdec-profile-$r" specdec generate -p "$PROFILE" -n "$N" -f text -v "$PROMPT"
  TORCHINDUCTOR_CACHE_DIR=$SPECDEC_INDUCTOR timed "specdec-compile-on-$r" specdec generate -p "$PROFILE" -n "$N" -f text -v --compile on "$PROMPT"
  timed "specdec-lookup-$r" specdec generate -p "$PROFILE" -n "$N" -f text -v --drafter ngram "$PROMPT"
  timed "llama-cli-plain-$r" "$BIN/llama-cli" -m "$PAIR/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" -p "$PROMPT" -n "$N" -st --temp 0 -t 2 --simple-io --no-display-prompt
  timed "llama-cli-spec-default-$r" "$BIN/llama-cli" -m "$PAIR/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" -p "$PROMPT" -n "$N" -st --temp 0 -t 2 --simple-io --no-display-prompt --spec-default
  timed "llama-cli-draft-$r" "$BIN/llama-cli" -m "$PAIR/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" -md "$PAIR/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" -p "$PROMPT" -n "$N" -st --temp 0 -t 2 --simple-io --no-display-prompt
done
