"""Compiled steps reused across processes: a model whose every Linear runs specdec's int4 kernel
compiles unfrozen, so a second process loads its graphs from torch's own caches (counted by
those caches' hit counters, never by time), a checkpoint with other weights reuses the graphs and
still decodes its own tokens (the weights are the graph's inputs, not constants in it), and a
corrupt cache never changes a token."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kernel_helpers import needs_kernels
from profile_helpers import write_profile
from tiny_models import build_model, qwen2_config, save

pytestmark = [needs_kernels, pytest.mark.filterwarnings("ignore")]

# one process: load the profile, decode 10 tokens greedily, report the tokens and the caches' counters
PROBE = """
import json, sys
from torch._dynamo.utils import counters
from specdec_cli import Pipeline, load_profile
pipe = Pipeline(load_profile(sys.argv[1]))
result = pipe.generate("def add(a, b):", max_new_tokens=10)
lm = pipe.kept_decoder.lm  # compile off: a CachedLM, with no compile settings
print(json.dumps({"tokens": list(result.token_ids), "frozen": lm.settings.freezing if hasattr(lm, "settings") else None,
                  "aot_hit": counters["aot_autograd"]["autograd_cache_hit"],
                  "aot_bypass": counters["aot_autograd"]["autograd_cache_bypass"],
                  "fx_hit": counters["inductor"]["fxgraph_cache_hit"]}))
"""


def probe(profile, cache) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", PROBE, str(profile)], capture_output=True, text=True, timeout=600,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def int4_profiles(tmp_path_factory, tokenizer):
    """Two int4 targets of one shape with different weights (heads in int4 too: no plain Linear
    left), each compiled, drafting by lookup; and each one's eager profile."""
    folder = tmp_path_factory.mktemp("reuse")
    profiles = {}
    for seed in (41, 42):
        model = save(build_model(qwen2_config(tokenizer, layers=2, hidden=128), seed=seed), tokenizer,
                     folder / f"model-{seed}")
        for mode in ("on", "off"):
            profiles[seed, mode] = write_profile(
                folder, f"int4-{seed}-{mode}", target={"model": str(model), "dtype": "float32", "quantize": "int4",
                                                       "quantize_head": True},
                drafter={"kind": "ngram"}, device="cpu", compile=mode, k=3)
    return profiles


def test_a_second_process_loads_the_compiled_graphs_from_the_caches(tmp_path, int4_profiles):
    cache = tmp_path / "inductor"
    first = probe(int4_profiles[41, "on"], cache)
    assert first["frozen"] is False and first["aot_bypass"] == 0
    second = probe(int4_profiles[41, "on"], cache)
    assert second["aot_hit"] >= 1 and second["fx_hit"] >= 1, second
    eager = probe(int4_profiles[41, "off"], tmp_path / "unused")
    assert first["tokens"] == second["tokens"] == eager["tokens"]

    other = probe(int4_profiles[42, "on"], cache)  # other weights, the same shapes: the same graphs
    assert other["aot_hit"] >= 1
    assert other["tokens"] == probe(int4_profiles[42, "off"], tmp_path / "unused")["tokens"] != first["tokens"]


def test_a_corrupt_cache_changes_no_token(tmp_path, int4_profiles):
    cache = tmp_path / "inductor"
    expected = probe(int4_profiles[41, "on"], cache)["tokens"]
    files = [p for p in cache.rglob("*") if p.is_file()]
    assert files
    for path in files:
        path.write_bytes(b"\x00not what was written\xff" * 3)
    assert probe(int4_profiles[41, "on"], cache)["tokens"] == expected
