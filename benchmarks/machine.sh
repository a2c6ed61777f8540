#!/usr/bin/env bash
# What a benchmark ran on, for beside its figures: the CPU's model and flags, and the memory's speed
# (a bf16 sum over 2 GiB, median of 5; the speed plain decoding follows). Writes to stdout.
set -euo pipefail
grep -m1 "model name" /proc/cpuinfo
grep -o -w 'avx2\|avx512_vnni\|avx512_bf16\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' '
python - <<'PY'
import time, torch
x = torch.ones(1024 ** 3, dtype=torch.bfloat16); x.sum(); rates = []
for _ in range(5):
    t = time.perf_counter(); x.sum(); rates.append(2 * 1024 ** 3 / (time.perf_counter() - t) / 1e9)
print(f"\nbf16 sum over 2 GiB: {sorted(rates)[2]:.1f} GB/s (median of 5)")
PY
