"""Where the time goes: specdec vs transformers' assisted generation, same draft, same k, one prompt.

    python benchmarks/where_time.py [PROFILE]      (default qwen-coder-local-int8; a kind: model drafter)

Runs each once under torch.profiler and prints, per method, the wall time, target forwards, and the
share of wall time in matmuls, attention, other torch ops, and Python/framework outside torch ops.
One run each: the shares are the point; for speed figures use `specdec bench`.
"""
import json
import sys
import time

from torch.profiler import ProfilerActivity, profile

from specdec_cli import Pipeline
from specdec_cli.bench.engine_methods import EngineMethod
from specdec_cli.bench.transformers_methods import HFMethod, draft_model_of
from specdec_cli.specs import SamplingSpec

profile_name = sys.argv[1] if len(sys.argv) > 1 else "qwen-coder-local-int8"
pipe = Pipeline.from_profile(profile_name)
ids = pipe.encode("Write a C++ program to find the nth Fibonacci number using recursion.")
s = SamplingSpec()
eng = EngineMethod("specdec-k5", pipe, 5)
hf = HFMethod("hf-assisted-k5", pipe, draft_model_of(pipe), {"num_assistant_tokens": 5, "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0})
for m in (eng, hf):
    m.run(ids, 16, s, 0)

LINEAR = ("aten::mm", "aten::addmm", "aten::linear", "aten::_weight_int8pack_mm", "aten::_weight_int4pack_mm_for_cpu",
          "aten::matmul", "aten::bmm", "aten::baddbmm")
ATTN = ("aten::_scaled_dot_product", "aten::scaled_dot_product")


def group(name: str) -> str:
    if name.startswith(LINEAR) or "linear" in name:
        return "matmul (Linear layers, LM head)"
    if name.startswith(ATTN) or "flash" in name or "attention" in name:
        return "attention"
    return "other torch ops"


report = {}
for m in (eng, hf):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        r = m.run(ids, 96, s, 0)
        wall = time.perf_counter() - started
    groups = {}
    for e in prof.key_averages():
        name = group(e.key)
        groups[name] = groups.get(name, 0.0) + e.self_cpu_time_total / 1e6
    ops = sum(groups.values())
    groups["python and framework outside torch ops"] = max(wall - ops, 0.0)
    st = r.get("stats")
    report[m.name] = {"wall_s": wall, "target_forwards": r["target_forwards"], "new_tokens": len(r["token_ids"]) if "token_ids" in r else None,
                      "draft_s": getattr(st, "draft_seconds", None), "verify_s": getattr(st, "verify_seconds", None),
                      "share": {k: round(v / wall, 3) for k, v in groups.items()}}
    top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:8]
    report[m.name]["top_ops"] = [(e.key, round(e.self_cpu_time_total / 1e6, 3)) for e in top]
print(json.dumps(report, indent=1))
