"""specdec's CPU attention (cpu_attention.py): the same values as transformers' sdpa under every
mask the static caches give (causal, a tree's, shut slots, batches), each query row independent of
the others, sdpa kept for what it does not take, and StaticLM switching CPU models to it."""

from __future__ import annotations

import types

import pytest
import torch
from kernel_helpers import needs_kernels

from specdec_cli.kernels import cpu_attention


def sdpa(query, key, value, mask, module):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, mask)[0]


def inputs(batch: int, rows: int, slots: int, dtype: torch.dtype, seed: int, heads: int = 8, kv_heads: int = 2, dim: int = 32):
    torch.manual_seed(seed)
    query = torch.randn(batch, rows, heads, dim, dtype=dtype).transpose(1, 2)  # as transformers makes it
    key, value = (torch.randn(batch, kv_heads, slots, dim, dtype=dtype) for _ in range(2))
    shut = torch.rand(batch, 1, rows, slots) < 0.4
    shut[..., 0] = False  # every row sees a slot
    mask = torch.zeros(batch, 1, rows, slots, dtype=dtype).masked_fill_(shut, torch.finfo(dtype).min)
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    return query, key, value, mask, module


@needs_kernels
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("batch, rows, slots", [(1, 1, 16), (1, 5, 100), (2, 3, 64), (1, 65, 300)])
def test_equals_sdpa_under_any_mask(dtype, tolerance, batch, rows, slots):
    query, key, value, mask, module = inputs(batch, rows, slots, dtype, seed=rows)
    ours, _ = cpu_attention.attention(module, query, key, value, mask)
    expected = sdpa(query.float(), key.float(), value.float(), mask.float(), module)
    assert ours.shape == expected.shape and ours.dtype == dtype
    assert torch.allclose(ours.float(), expected, atol=tolerance, rtol=tolerance)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_gets_the_same_bits_at_any_width_and_beside_equal_rows(dtype):
    """A verify of k + 1 tokens must equal k + 1 one-token steps, bit for bit; a row that repeats
    the one before (a padded step's pad) is copied, and only where query and mask both repeat."""
    query, key, value, mask, module = inputs(2, 9, 128, dtype, seed=1)
    query, mask = query.clone(), mask.clone()
    query[:, :, 3:5] = query[:, :, 2:3]  # rows 2-4 one row, thrice
    mask[:, :, 3:5] = mask[:, :, 2:3]
    query[:, :, 6] = query[:, :, 5]  # the same query under another mask
    mask[:, :, 8] = mask[:, :, 7]  # the same mask, a query that differs in one head only
    query[:, :, 8] = query[:, :, 7]
    query[:, 3, 8] += 1
    together, _ = cpu_attention.attention(module, query, key, value, mask)
    for b in range(2):
        for row in range(9):
            alone, _ = cpu_attention.attention(module, query[b:b + 1, :, row:row + 1], key[b:b + 1], value[b:b + 1],
                                               mask[b:b + 1, :, row:row + 1])
            assert torch.equal(alone, together[b:b + 1, row:row + 1]), (b, row)
    assert not torch.equal(together[:, 6], together[:, 5]) and not torch.equal(together[:, 8, 3], together[:, 7, 3])


@needs_kernels
def test_what_it_does_not_take_goes_to_sdpa(monkeypatch):
    query, key, value, mask, module = inputs(1, 4, 32, torch.float32, seed=2)
    monkeypatch.setattr(torch.ops.specdec_kernels, "masked_attention", None)  # calling it would fail
    for case in ({"mask": None}, {"rows": cpu_attention.MAX_ROWS + 1}, {"dim": 24}, {"dtype": torch.float16}):
        q, k, v, m, mod = inputs(1, case.get("rows", 4), 32, case.get("dtype", torch.float32), seed=3, dim=case.get("dim", 32))
        m = case.get("mask", m)
        ours, _ = cpu_attention.attention(mod, q, k, v, m)
        assert torch.equal(ours, sdpa(q, k, v, m, mod)), case
    ours, _ = cpu_attention.attention(module, query, key, value, mask, sliding_window=8)
    assert torch.equal(ours, sdpa(query, key, value, mask, module))


@needs_kernels
def test_compiled_with_dynamic_shapes_equals_eager():
    assert cpu_attention.registered()  # which tells torch.compile the op's output shape
    query, key, value, mask, module = inputs(1, 6, 64, torch.float32, seed=4)
    step = torch.compile(lambda q, k, v, m: cpu_attention.attention(module, q, k, v, m)[0], dynamic=True, fullgraph=True)
    assert torch.equal(step(query, key, value, mask), cpu_attention.attention(module, query, key, value, mask)[0])
    torch.library.opcheck(torch.ops.specdec_kernels.masked_attention.default, (query, key, value, mask, 0.25))


@needs_kernels
def test_static_caches_switch_a_cpu_model_to_it(tokenizer, monkeypatch):
    """StaticLM on CPU attends with the kernel; its logits equal a full forward's (sdpa, no cache)."""
    from tiny_models import build_model, llama_config

    from specdec_cli.runtime.compiled_step import CompileSettings
    from specdec_cli.runtime.static import StaticLM

    model = build_model(llama_config(tokenizer, layers=2), seed=5)
    assert model.config._attn_implementation == "sdpa"
    sequence = torch.randint(0, len(tokenizer), (20,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        reference = model(input_ids=sequence[None]).logits[0]
    lm = StaticLM(model, len(tokenizer), settings=CompileSettings(enabled=False))
    assert model.config._attn_implementation == cpu_attention.NAME
    kernel, calls = torch.ops.specdec_kernels.masked_attention, []
    monkeypatch.setattr(torch.ops.specdec_kernels, "masked_attention", lambda *a: calls.append(1) or kernel(*a))
    lm.reset()
    lm.prefill(sequence[:8])
    logits = torch.cat([lm.forward(sequence[8:11], keep=3), lm.forward(sequence[11:12], keep=1)])
    assert torch.allclose(logits, reference[8:12], atol=1e-4)
    assert len(calls) >= 2 * 2  # two layers, two steps at least
