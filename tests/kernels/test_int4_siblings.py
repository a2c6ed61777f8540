"""int4 layers that read one input, in one kernel call: their weights laid end to end at load
(int4_siblings.py), their calls merged in the compiled step (int4_merge_pass.py). What must hold:
the same bits as the separate calls, eager and compiled; the merge really happens (fewer calls in
the graph); and inductor's graph cache, which serves a merged graph to the next model of the same
shapes, gives that model its own weights."""

from __future__ import annotations

import copy

import pytest
import torch
from kernel_helpers import needs_kernels
from tiny_models import build_model, llama_config, qwen2_config

from specdec_cli.kernels import int4_merge_pass
from specdec_cli.kernels.int4_siblings import share_storage
from specdec_cli.kernels.quantize import quantize_model
from specdec_cli.runtime.lm import make_lm

pytestmark = needs_kernels

IDS = torch.tensor([5, 9, 14, 3, 27, 8])


def int4_model(tokenizer, config, seed: int) -> torch.nn.Module:
    """Every Linear in int4, the head too: a full-precision head's prepacked weights would keep the
    graph out of inductor's cache."""
    configs = {"qwen2": qwen2_config, "llama": llama_config}
    return quantize_model(build_model(configs[config](tokenizer, layers=1, hidden=64), seed=seed), "int4", 32, head=True)


def compiled_logits(model: torch.nn.Module, vocab: int) -> torch.Tensor:
    """The logits of IDS through the compiled step (a prefill, then a 2-token verify)."""
    lm = make_lm(model, vocab, "on")
    lm.reserve(32)
    lm.prefill(IDS[:4])
    return lm.forward(IDS[4:], keep=2)


@pytest.fixture
def int4_calls(monkeypatch) -> list[tuple[int, int]]:
    """(int4_linear calls before, after) for each graph the merge pass sees."""
    seen = []
    merge = int4_merge_pass.MergeSiblings.__call__

    def counting(self, graph):
        count = lambda: sum(node.target is torch.ops.specdec_kernels.int4_linear.default for node in graph.nodes)  # noqa: E731
        before = count()
        merge(self, graph)
        seen.append((before, count()))

    monkeypatch.setattr(int4_merge_pass.MergeSiblings, "__call__", counting)
    return seen


@pytest.mark.parametrize("config", ["qwen2", "llama"])
def test_siblings_share_one_buffer_and_give_the_same_bits_eagerly(tokenizer, config):
    model = int4_model(tokenizer, config, seed=1)
    with torch.inference_mode():
        before = model(input_ids=IDS[None]).logits
        share_storage(model)
        after = model(input_ids=IDS[None]).logits
    assert torch.equal(before, after)
    attention, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    for first, second in [(attention.q_proj, attention.k_proj), (attention.k_proj, attention.v_proj),
                          (mlp.gate_proj, mlp.up_proj)]:
        for part in ("packed", "scales", "mins"):
            a, b = getattr(first, part), getattr(second, part)
            assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            assert a.storage_offset() + a.numel() == b.storage_offset()
    # the down projection reads other inputs: a buffer of its own
    assert mlp.down_proj.packed.untyped_storage().data_ptr() != mlp.up_proj.packed.untyped_storage().data_ptr()


def test_the_compiled_step_merges_siblings_and_keeps_the_bits(tokenizer, tmp_path, monkeypatch, int4_calls):
    """Llama: q, k, v and o share one buffer (same inputs' width, no bias) but o reads another input:
    only q, k and v may merge. (Qwen2's biased q, k, v: the cache test below.)"""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # the pass runs: no graph cached
    model = int4_model(tokenizer, "llama", seed=2)
    separate = compiled_logits(copy.deepcopy(model), len(tokenizer))
    assert int4_calls[-1][0] == int4_calls[-1][1]  # nothing shares a buffer: nothing merged
    merged = compiled_logits(share_storage(model), len(tokenizer))
    # q, k, v -> one call; gate, up -> one call; the output and down projections alone; the head
    assert int4_calls[-1] == (7 + 1, 4 + 1)
    assert torch.equal(merged, separate)


def test_a_cached_merged_graph_serves_another_models_weights(tokenizer, tmp_path, monkeypatch, int4_calls):
    """Two models of the same shapes, compiled one after the other with inductor's graph cache on:
    the second is served the first's graph, and must still compute with its own weights, the bits
    of its own separate calls (Qwen2: q, k and v with biases, merged too)."""
    import torch._dynamo.utils
    import torch._inductor.config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # empty: the first compile misses
    first, second = (int4_model(tokenizer, "qwen2", seed=seed) for seed in (3, 4))
    expected = compiled_logits(copy.deepcopy(second), len(tokenizer))  # unmerged: a graph of its own
    with torch._inductor.config.patch(fx_graph_cache=True):
        from_first = compiled_logits(share_storage(first), len(tokenizer))
        assert int4_calls[-1] == (7 + 1, 4 + 1)
        counters = torch._dynamo.utils.counters["inductor"]
        hits = counters["fxgraph_cache_hit"]
        served = compiled_logits(share_storage(second), len(tokenizer))
    assert counters["fxgraph_cache_hit"] > hits
    assert torch.equal(served, expected) and not torch.equal(served, from_first)
