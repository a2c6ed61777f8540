"""The demo profile in float32 against bf16: plain decoding and the profile's drafter (prompt lookup,
k: auto), 64 tokens, interleaved per repeat; medians of tok/s.

usage: python benchmarks/demo_dtype.py off|on [repeats]   (compile off, as a one-off generate, or on)
"""
import statistics
import sys
import time

import torch

from specdec_cli import Pipeline
from specdec_cli.decoding.engine import run

PROMPT = ("List every year mentioned in this text, with what happened in that year: The Great Barrier Reef, off the coast of Queensland, Australia, is the world's largest coral reef system. It was declared a World Heritage Site in 1981. Rising sea temperatures caused mass coral bleaching in 1998, 2002, 2016 and 2017, and scientists warn that the reef could lose most of its coral by 2050.")
mode = sys.argv[1] if len(sys.argv) > 1 else "off"
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
n = 64
runs = {}
for dt in ("float32", "bfloat16"):
    pipe = Pipeline.from_profile("smollm2-demo", dtype=dt, compile=mode)
    ids = pipe.encode(PROMPT)
    runs[(dt, "plain")] = (pipe.decoder(drafter=None), ids)
    runs[(dt, "lookup")] = (pipe.decoder(), ids)
times = {key: [] for key in runs}
texts = {}
for r in range(repeats + 1):
    for key, (dec, ids) in runs.items():
        t = time.perf_counter()
        fin = run(dec, ids, max_new_tokens=n)
        dt_ = time.perf_counter() - t
        if r:
            times[key].append(len(fin.token_ids) / dt_)
        texts[key] = fin.token_ids
for key, v in times.items():
    print(f"{key[0]:9s} {key[1]:7s} median {statistics.median(v):6.1f} tok/s (min {min(v):.1f} max {max(v):.1f})")
print("fp32 text == bf16 text:", texts[("float32", "plain")] == texts[("bfloat16", "plain")])
print("torch", torch.__version__, torch.backends.cpu.get_cpu_capability())
