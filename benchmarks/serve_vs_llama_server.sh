#!/usr/bin/env bash
# `specdec serve` beside llama.cpp's `llama-server` (plain, and its best setting --spec-default),
# through the same endpoint bench (`specdec bench --endpoint`) at concurrency 1, 4 and 8, one server
# at a time, and specdec's in-process bench of the same profile for the served/in-process ratio.
#
#   benchmarks/serve_vs_llama_server.sh LLAMA_BIN_DIR [OUT_DIR]
#
# LLAMA_BIN_DIR holds llama-server (built from llama.cpp); the GGUF and the pair are the ones
# ../shared/models/get-qwen-coder-pair wrote (~/.cache/specdec-bench). Prompts: Spec-Bench's coding
# category (LIMIT of them), N new tokens, greedy. Concurrency 1 runs on one row / one slot (specdec
# --batch-size 1, llama-server -np 1); 4 and 8 on four (--batch-size 4, -np 4): requests past four
# wait in the server's queue. Beside each: the server's peak resident memory (VmHWM). Run it alone.
# Settings: PROFILE (qwen-coder-local-int4), DRAFTER (ngram; empty: the profile's own), N (128), LIMIT (8), REPEATS (1),
# QUESTIONS (../shared/data/spec_bench/question.jsonl), PORT (8090), THREADS (2).
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 LLAMA_BIN_DIR [OUT_DIR]" >&2; exit 2; }
BIN=$1; OUT=${2:-serve-$(date +%Y%m%d-%H%M)}; mkdir -p "$OUT"
PROFILE=${PROFILE:-qwen-coder-local-int4} DRAFTER=${DRAFTER-ngram} N=${N:-128} LIMIT=${LIMIT:-8}
REPEATS=${REPEATS:-1} PORT=${PORT:-8090} THREADS=${THREADS:-2}
QUESTIONS=${QUESTIONS:-$(dirname "$0")/../../shared/data/spec_bench/question.jsonl}
GGUF=~/.cache/specdec-bench/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
PROMPTS=(--prompts "$QUESTIONS" --category coding --limit "$LIMIT" -n "$N" --repeats "$REPEATS" --warmup 1)
URL=http://127.0.0.1:$PORT
MODELS=(-p "$PROFILE"); [[ -n $DRAFTER ]] && MODELS+=(--drafter "$DRAFTER")
SERVERS=${SERVERS:-specdec llama}  # which servers to run: specdec, llama or both

"$(dirname "$0")/machine.sh" > "$OUT/machine.txt"

PID=
stop_server() { [[ -n $PID ]] && { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; }; PID=; }
trap stop_server EXIT

serve_and_bench() {  # name, concurrency list, server command...
  local name=$1 levels=$2; shift 2
  "$@" > "$OUT/$name-server.log" 2>&1 &
  PID=$!
  until curl -sf "$URL/health" > /dev/null; do
    kill -0 "$PID" 2>/dev/null || { echo "$name: the server died (see $OUT/$name-server.log)" >&2; exit 1; }
    sleep 1
  done
  for c in $levels; do
    specdec bench --endpoint "$URL" "${PROMPTS[@]}" --concurrency "$c" -f json -o "$OUT/$name-c$c.json" > /dev/null
    echo "$name c=$c done"
  done
  grep VmHWM "/proc/$PID/status" | awk '{print $2}' > "$OUT/$name-peak-kb.txt"
  stop_server
}

if [[ $SERVERS == *specdec* ]]; then
  specdec bench "${MODELS[@]}" --methods specdec --no-drift "${PROMPTS[@]}" -f json -o "$OUT/in-process.json" > /dev/null
  echo "in-process bench done"
  serve_and_bench specdec-b1 "1" specdec serve "${MODELS[@]}" --batch-size 1 --port "$PORT"
  serve_and_bench specdec-b4 "4 8" specdec serve "${MODELS[@]}" --batch-size 4 --port "$PORT"
fi
for np in 1 4; do
  [[ $SERVERS == *llama* ]] || break
  levels=$([[ $np == 1 ]] && echo "1" || echo "4 8")
  serve_and_bench "llama-plain-np$np" "$levels" "$BIN/llama-server" -m "$GGUF" -c $((2048 * np)) -np "$np" -t "$THREADS" --metrics --port "$PORT" --host 127.0.0.1
  serve_and_bench "llama-spec-default-np$np" "$levels" "$BIN/llama-server" -m "$GGUF" -c $((2048 * np)) -np "$np" -t "$THREADS" --metrics --port "$PORT" --host 127.0.0.1 --spec-default
done

python - "$OUT" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print(open(out / "machine.txt").read().strip())
if (out / "in-process.json").exists():
    local = json.loads((out / "in-process.json").read_text())
    rates = {r["method"]: r["tokens_per_second"] for r in local["results"]}
    print(f"\nin-process bench: specdec {rates['specdec']:.1f} tok/s, plain {rates['plain']:.1f} (per-prompt medians)")
print()
print("| server | concurrency | tok/s per request (median) | total tok/s | TTFT (median) | tau | peak RSS |")
print("|---|---|---|---|---|---|---|")
for report in sorted(out.glob("*-c*.json")):
    name, c = report.stem.rsplit("-c", 1)
    row = json.loads(report.read_text())["results"][-1]
    peak = int((out / f"{name}-peak-kb.txt").read_text()) / 1024
    tau = row.get("mean_accepted_length")
    print(f"| {name} | {c} | {row['tokens_per_second']:.1f} | {row['total_tokens_per_second']:.1f} | "
          f"{row['ttft_seconds'] * 1000:.0f} ms | {'-' if tau is None else f'{tau:.2f}'} | {peak:.0f} MiB |")
EOF
