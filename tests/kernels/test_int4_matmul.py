"""specdec's int4 x int8 CPU kernel (AVX512-VNNI or AVX2, whichever this CPU runs): the packing, the arithmetic against a reference
in plain torch, the row independence speculative decoding's exactness rests on, torch.compile,
and the fall-back to torchao when it cannot be built."""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path

import pytest
import torch
from kernel_helpers import needs_kernels

from specdec_cli.kernels import build, int4_matmul
from specdec_cli.kernels.int4_matmul import Int4Linear, pack, unpack


def random_linear(n: int, k: int, bias: bool, seed: int) -> torch.nn.Linear:
    torch.manual_seed(seed)
    linear = torch.nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        linear.weight.mul_(torch.linspace(0.2, 3.0, n)[:, None])  # outputs of different scales
    return linear


def reference(x: torch.Tensor, layer: Int4Linear) -> torch.Tensor:
    """What the kernel computes, in float64: each row rounded to int8 with scale max|x| / 127,
    times the weights `pack` stored, plus the bias."""
    rows = x.reshape(-1, x.shape[-1]).double()
    scale = rows.abs().amax(dim=-1, keepdim=True) / 127
    quantized = torch.round(rows / scale).clamp(-127, 127) * scale
    out = quantized @ unpack(layer.packed, layer.scales, layer.mins, layer.group_size).double().T
    if layer.bias.numel():
        out += layer.bias.double()
    return out.reshape(*x.shape[:-1], -1)


def test_pack_keeps_each_weight_within_half_a_step():
    weight = random_linear(48, 128, False, seed=1).weight.detach()
    packed, scales, mins = pack(weight, 32)
    assert packed.dtype == torch.uint8 and packed.numel() == weight.numel() // 2
    restored = unpack(packed, scales, mins, 32)
    assert scales.dtype == mins.dtype == torch.float16
    step = scales.float().transpose(1, 2).reshape(48, 4).repeat_interleave(32, dim=1)
    # half a step, plus the float16 rounding of the stored minimum
    rounding = mins.float().abs().transpose(1, 2).reshape(48, 4).repeat_interleave(32, dim=1) * 2 ** -11
    assert ((restored - weight).abs() <= step / 2 + rounding + 1e-6).all()
    # weights already on the grid come back as they were (the layout loses nothing)
    assert torch.allclose(unpack(*pack(restored, 32), 32), restored, atol=1e-6)


def test_packing_a_few_rows_at_a_time_gives_the_same_bytes(monkeypatch):
    weight = random_linear(80, 128, False, seed=2).weight.detach()
    whole = pack(weight, 32)
    monkeypatch.setattr(int4_matmul, "PACK_ROWS", 32)  # 32, 32 and a last 16
    assert all(torch.equal(a, b) for a, b in zip(pack(weight, 32), whole))


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group, bias", [(32, True), (64, False), (128, True)])
def test_the_kernel_computes_the_reference(dtype, group, bias):
    layer = Int4Linear(random_linear(48, 256, bias, seed=2), group)
    for rows in (1, 3, 4, 9):  # below, at and past the 4-row tile
        x = (torch.randn(1, rows, 256) * torch.linspace(0.1, 4.0, 256)).to(dtype)
        out = layer(x)
        assert out.shape == (1, rows, 48) and out.dtype == dtype
        expected = reference(x, layer)
        tolerance = 1e-4 if dtype == torch.float32 else 1e-2  # bfloat16: the output's own rounding
        assert torch.allclose(out.double(), expected, rtol=tolerance, atol=tolerance * expected.abs().max().item())


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_gets_the_same_bits_at_any_width_and_beside_equal_rows(dtype):
    """A verify of k + 1 tokens must equal k + 1 one-token steps, bit for bit; a run of equal rows
    (a padded step's pad repeats its token), computed once, gets its first row's bits."""
    layer = Int4Linear(random_linear(64, 128, True, seed=3), 32)
    x = torch.randn(11, 128).to(dtype)
    together = layer(x)
    for width in (1, 2, 5):
        parts = torch.cat([layer(x[i:i + width]) for i in range(0, 11, width)])
        assert torch.equal(parts, together), width
    for order in ([0, 0], [0, 0, 1, 2, 2], [0, 1, 1, 1, 2], [2, 2, 2], [0, 1, 0, 0]):
        assert torch.equal(layer(x[order]), together[order]), order


@needs_kernels
def test_a_one_token_steps_pad_repeats_the_token_in_every_layer(tokenizer):
    """A 1-token step runs at width 2; its pad repeats the token's id, position and mask row, so
    every int4 layer gets two equal rows (the kernel computes one) and the pad's logits are the token's."""
    from tiny_models import build_model, qwen2_config

    from specdec_cli.kernels.quantize import quantize_model
    from specdec_cli.runtime.compiled_step import CompileSettings
    from specdec_cli.runtime.static import StaticLM

    model = quantize_model(build_model(qwen2_config(tokenizer), seed=5), "int4", 32)
    inputs = []
    layers = [module for module in model.modules() if isinstance(module, Int4Linear)]
    for layer in layers:
        layer.register_forward_hook(lambda module, args, out: inputs.append(args[0].reshape(-1, args[0].shape[-1])))
    lm = StaticLM(model, len(tokenizer), settings=CompileSettings(enabled=False))  # the compiled step's padding, eagerly
    lm.reset()
    lm.prefill(torch.tensor([5, 6, 7]))
    inputs.clear()
    logits = lm._padded(torch.tensor([8]), 1, 2)
    assert len(inputs) == len(layers) == 14
    assert all(rows.shape[0] == 2 and torch.equal(rows[0], rows[1]) for rows in inputs)
    assert torch.equal(logits[1], logits[0])


@needs_kernels
def test_bfloat16_outputs_are_the_float32_ones_rounded_as_torch_rounds():
    """The kernel writes bfloat16 itself: the same bits as its float32 result through .to()."""
    layer = Int4Linear(random_linear(64, 128, True, seed=6), 32)
    x = (torch.randn(7, 128) * 50).to(torch.bfloat16)
    x[3, 5] = float("nan")  # its row's outputs are NaN, as a float matmul's
    out = layer(x)
    assert out[3].isnan().all() and not out[[0, 1, 2, 4, 5, 6]].isnan().any()
    torch.testing.assert_close(out, layer(x.float()).to(torch.bfloat16), rtol=0, atol=0, equal_nan=True)


@needs_kernels
def test_compiled_with_frozen_weights_equals_eager():
    import torch._inductor.config as inductor

    model = torch.nn.Sequential(Int4Linear(random_linear(64, 128, True, seed=4), 64), torch.nn.SiLU(),
                                Int4Linear(random_linear(32, 64, False, seed=5), 32))
    x = torch.randn(1, 5, 128)
    with torch.no_grad(), inductor.patch(freezing=True):
        compiled = torch.compile(model, fullgraph=True)
        assert torch.equal(compiled(x), model(x))
    layer = model[0]
    torch.library.opcheck(torch.ops.specdec_kernels.int4_linear.default,
                          (x, layer.packed, layer.scales, layer.mins, layer.group_size, layer.bias))


def test_layers_the_kernel_cannot_take():
    assert int4_matmul.fits(torch.nn.Linear(64, 48), 32)
    assert not int4_matmul.fits(torch.nn.Linear(64, 40), 32)  # outputs not in 16s
    assert not int4_matmul.fits(torch.nn.Linear(64, 48), 24)  # a group not in 16s


def test_a_failed_build_warns_once_and_int4_falls_back_to_torchao(monkeypatch, caplog):
    """No compiler (or no ninja): one warning, however many callers ask, and int4 still runs, on
    torchao's kernel. (tests/kernels/test_build.py: the same through the command, in its own process.)"""
    pytest.importorskip("torchao")
    from specdec_cli.kernels.quantize import quantize_model

    def no_compiler(isa, folder):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(build, "_load", no_compiler)
    monkeypatch.setattr(build, "kernel_isa", lambda: "avx512")
    monkeypatch.setattr(build, "_outcome", lru_cache(maxsize=1)(build._outcome.__wrapped__))  # this test's own answer
    monkeypatch.delenv(build.REQUIRE_VARIABLE, raising=False)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48, bias=False)).to(torch.bfloat16)
    model.get_output_embeddings = lambda: None
    with caplog.at_level(logging.WARNING, logger="specdec"):
        quantize_model(model, "int4", 32)
        assert not build.available()
    assert not isinstance(model[0], Int4Linear)
    assert type(model[0].weight).__name__ == "Int4OpaqueTensor"
    assert [r.getMessage() for r in caplog.records] == [
        "specdec's CPU kernels (AVX512-VNNI) did not build: Ninja is required to load C++ extensions; "
        "int4 runs on torchao's slower kernel and attention on sdpa"]


@needs_kernels
def test_packed_weights_are_kept_and_reused(monkeypatch, tmp_path, caplog, models_root, tokenizer):
    """The first load packs and keeps the weights under <specdec cache>/packed; the next one reads
    them back (packing would fail here) into the same buffers; an unreadable file is repacked."""
    import os

    from profile_helpers import write_profile
    from tiny_models import build_model, llama_config, save

    from specdec_cli import Pipeline

    target = save(build_model(llama_config(tokenizer, layers=2), seed=41), tokenizer, models_root / "packed-cache-llama")

    def profile(group: int):
        return str(write_profile(tmp_path, f"g{group}", target={"model": str(target), "dtype": "float32", "quantize": "int4",
                                                                "group_size": group}, drafter={"kind": "ngram"}, device="cpu"))

    with caplog.at_level(logging.INFO, logger="specdec"):
        first = Pipeline.from_profile(profile(32))
    assert "packing" in caplog.text and "once for this model" in caplog.text
    stored = list((Path(os.environ["SPECDEC_CACHE_DIR"]) / "packed").glob("*.safetensors"))
    assert len(stored) == 1

    def no_packing(*args, **kwargs):
        raise AssertionError("packed again")

    with monkeypatch.context() as patched:
        patched.setattr(int4_matmul, "pack", no_packing)
        again = Pipeline.from_profile(profile(32))
    assert torch.equal(dict(again.target.named_buffers())["model.layers.0.mlp.up_proj.packed"],
                       dict(first.target.named_buffers())["model.layers.0.mlp.up_proj.packed"])
    ids = first.encode("def add(a, b):", chat=False)
    assert (again.generate(ids, decoder=again.decoder(), max_new_tokens=8).token_ids
            == first.generate(ids, decoder=first.decoder(), max_new_tokens=8).token_ids)

    stored[0].write_bytes(stored[0].read_bytes()[:100])  # truncated
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specdec"):
        Pipeline.from_profile(profile(32))
    assert "ignoring unreadable packed weights" in caplog.text
    Pipeline.from_profile(profile(64))  # another group size: a file of its own
    assert len(list(stored[0].parent.glob("*.safetensors"))) == 2
