"""GPTQ and AWQ int4 checkpoints, read by specdec itself (no GPTQ/AWQ package): tiny Qwen2 models
rounded to int4 here and written in each format as AutoGPTQ / GPTQModel and AutoAWQ pack them,
then loaded through the real profile and loading code."""

from __future__ import annotations

import json

import pytest
import torch
from kernel_helpers import needs_kernels
from profile_helpers import write_profile
from safetensors.torch import save_file
from tiny_models import build_model, qwen2_config, save

from specdec_cli import Pipeline
from specdec_cli.kernels import int4_matmul
from specdec_cli.models.stored_int4 import AWQ_ORDER, StoredInt4, layer_codes, stored_int4, unpack_words

GROUP = 32
LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def round_to_int4(weight: torch.Tensor, lowest_zero: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest per group: (codes [out, in], zeros [out, groups], float16 scales [out, groups])."""
    out, inputs = weight.shape
    groups = weight.reshape(out, inputs // GROUP, GROUP)
    low, high = groups.amin(-1).clamp(max=0), groups.amax(-1).clamp(min=0)
    scales = ((high - low) / 15).clamp_min(1e-4).half()
    zeros = (-low / scales.float()).round().clamp(lowest_zero, 15).to(torch.int64)
    codes = (groups / scales.float()[..., None]).round() + zeros[..., None]
    return codes.clamp(0, 15).to(torch.int64).reshape(out, inputs), zeros, scales


def words(codes: torch.Tensor) -> torch.Tensor:
    """int64 [..., 8n] codes -> int32 [..., n], the first of each 8 in the low bits (wrapping as int32)."""
    eights = codes.reshape(*codes.shape[:-1], -1, 8)
    packed = sum(eights[..., i] << (4 * i) for i in range(8))
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def gptq_parts(codes, zeros, scales, v1: bool) -> dict[str, torch.Tensor]:
    """AutoGPTQ's pack: qweight packs 8 inputs down the input axis; qzeros 8 outputs (v1: zero - 1)."""
    return {"qweight": words(codes).T.contiguous(),
            "qzeros": words((zeros - int(v1)).T.contiguous()),
            "scales": scales.T.contiguous(),
            "g_idx": (torch.arange(codes.shape[1]) // GROUP).to(torch.int32)}


def awq_parts(codes, zeros, scales) -> dict[str, torch.Tensor]:
    """AutoAWQ's pack (GEMM): 8 outputs a word, nibble i holding output 8c + AWQ_ORDER[i]."""
    order = torch.tensor(AWQ_ORDER)
    shuffle = lambda t: t.reshape(t.shape[0], -1, 8)[..., order].reshape(t.shape[0], -1)  # noqa: E731
    return {"qweight": words(shuffle(codes.T.contiguous())), "qzeros": words(shuffle(zeros.T.contiguous())),
            "scales": scales.T.contiguous()}


def write_checkpoint(model, tokenizer, folder, method: str, v1: bool = True) -> tuple[object, dict]:
    """`model` saved with its decoder Linears in `method`'s int4 format; returns the float32 model
    holding exactly those dequantized weights (the reference), and the quantization_config."""
    save(model, tokenizer, folder)
    reference = build_model(model.config, seed=0)
    reference.load_state_dict(model.state_dict())
    tensors = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    for name, layer in reference.named_modules():
        if name.rpartition(".")[2] not in LAYERS:
            continue
        codes, zeros, scales = round_to_int4(layer.weight.detach(), lowest_zero=1 if method == "gptq" and v1 else 0)
        with torch.no_grad():  # the reference holds what the checkpoint says
            layer.weight.copy_((codes - zeros.repeat_interleave(GROUP, 1)) * scales.float().repeat_interleave(GROUP, 1))
        del tensors[f"{name}.weight"]
        parts = gptq_parts(codes, zeros, scales, v1) if method == "gptq" else awq_parts(codes, zeros, scales)
        tensors.update({f"{name}.{part}": value for part, value in parts.items()})
    save_file(tensors, str(folder / "model.safetensors"))
    quantization = ({"quant_method": "gptq", "bits": 4, "group_size": GROUP, "sym": False, "desc_act": False,
                     "checkpoint_format": "gptq" if v1 else "gptq_v2"} if method == "gptq"
                    else {"quant_method": "awq", "bits": 4, "group_size": GROUP, "version": "gemm", "zero_point": True})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config))
    return reference.eval(), quantization


@pytest.fixture(scope="module")
def checkpoints(models_root, tokenizer):
    """name -> (folder, reference model): GPTQ v1, GPTQ v2 and AWQ of one tiny Qwen2 (tied head, q/k/v biases)."""
    model = build_model(qwen2_config(tokenizer, layers=2), seed=41)
    made = {}
    for name, method, v1 in (("gptq", "gptq", True), ("gptq_v2", "gptq", False), ("awq", "awq", False)):
        folder = models_root / f"stored-{name}"
        made[name] = (folder, write_checkpoint(model, tokenizer, folder, method, v1)[0])
    return made


def test_the_word_layouts_as_the_formats_define_them():
    word = torch.tensor([[0x76543210]], dtype=torch.int32)
    assert unpack_words(word).tolist() == [[0, 1, 2, 3, 4, 5, 6, 7]]
    # GPTQ: one qweight word is inputs 0..7 of output 0; v1 zeros are stored minus one
    fmt = StoredInt4("gptq", 8, zeros_stored_minus_one=True)
    codes, zeros, scales, groups = layer_codes(fmt, {"qweight": word, "qzeros": torch.tensor([[0x11111111]], dtype=torch.int32),
                                                     "scales": torch.ones(1, 8, dtype=torch.float16)})
    assert codes[0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7] and zeros[:, 0].tolist() == [2] * 8
    # AWQ: nibble i holds output AWQ_ORDER[i], so outputs 0..7 read nibbles 0, 4, 1, 5, 2, 6, 3, 7
    fmt = StoredInt4("awq", 8, zeros_stored_minus_one=False)
    codes, zeros, _, _ = layer_codes(fmt, {"qweight": word.repeat(8, 1), "qzeros": word, "scales": torch.ones(1, 8, dtype=torch.float16)})
    assert codes[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7] and zeros[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


def test_a_gptq_v1_zero_of_sixteen_does_not_carry_into_its_neighbour():
    fmt = StoredInt4("gptq", 8, zeros_stored_minus_one=True)
    _, zeros, _, _ = layer_codes(fmt, {"qweight": torch.zeros(1, 8, dtype=torch.int32),
                                       "qzeros": torch.tensor([[0x0000000F]], dtype=torch.int32),
                                       "scales": torch.ones(1, 8, dtype=torch.float16)})
    assert zeros[:, 0].tolist() == [16, 1, 1, 1, 1, 1, 1, 1]


@pytest.mark.parametrize("name", ["gptq", "gptq_v2", "awq"])
def test_dequantized_where_the_kernel_is_not_used_gives_the_checkpoints_weights(tmp_path, monkeypatch, checkpoints, name):
    """Off specdec's kernel (as on CUDA) the layers hold (q - zero) * scale exactly: the same logits."""
    monkeypatch.setenv("SPECDEC_INT4_KERNEL", "torchao")
    folder, reference = checkpoints[name]
    pipe = Pipeline.from_profile(str(write_profile(tmp_path, name, target={"model": str(folder), "dtype": "float32"},
                                                   drafter={"kind": "ngram"}, chat=False)))
    assert type(pipe.target.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    ids = torch.tensor([pipe.encode("def add(a, b): return a + b")])
    with torch.no_grad():
        torch.testing.assert_close(pipe.target(ids).logits, reference(ids).logits, rtol=1e-5, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("name", ["gptq", "awq"])
def test_on_the_kernel_the_layers_hold_the_checkpoints_weights_and_speculation_stays_exact(tmp_path, checkpoints, name):
    folder, reference = checkpoints[name]
    pipe = Pipeline.from_profile(str(write_profile(tmp_path, name, target={"model": str(folder), "dtype": "float32"},
                                                   drafter={"kind": "early-exit", "layers": 1}, chat=False)))
    layer = pipe.target.model.layers[1].mlp.down_proj
    assert isinstance(layer, int4_matmul.Int4Linear)
    expected = reference.model.layers[1].mlp.down_proj.weight
    stored = int4_matmul.unpack(layer.packed, layer.scales, layer.mins, layer.group_size)
    # minimums are kept in float16: -zero * scale within its rounding
    assert (stored - expected).abs().max() <= 2**-11 * expected.abs().max()
    ids = pipe.encode("def add(a, b): return a + b  # def add(a, b):")
    with torch.no_grad():
        logits, wanted = pipe.target(torch.tensor([ids])).logits, reference(torch.tensor([ids])).logits
    assert (logits.argmax(-1) == wanted.argmax(-1)).float().mean() >= 0.9  # int8 activations: near, not equal
    plain = pipe.generate(ids, decoder=pipe.decoder(drafter=None), max_new_tokens=20)
    for k in (1, 3):
        assert pipe.generate(ids, decoder=pipe.decoder(k=k), max_new_tokens=20).token_ids == plain.token_ids


@needs_kernels
def test_quantize_head_takes_the_head_of_a_gptq_checkpoint_too(tmp_path, checkpoints):
    folder, _ = checkpoints["gptq"]
    pipe = Pipeline.from_profile(str(write_profile(tmp_path, "head", target={"model": str(folder), "dtype": "float32",
                                                                            "quantize_head": True},
                                                   drafter={"kind": "ngram"}, chat=False)))
    assert isinstance(pipe.target.lm_head, int4_matmul.Int4Linear)
    assert type(pipe.target.model.embed_tokens) is torch.nn.Embedding  # the input embedding stays
    from specdec_cli.kernels.quantize import quantization_of

    assert quantization_of(pipe.target) == f"gptq-int4-g{GROUP}-head"


def test_quantize_head_on_an_unquantized_model_is_a_one_line_error(capsys, tmp_path, checkpoints, models_root, tokenizer):
    from cli_helpers import assert_one_line_error, run_cli

    plain = save(build_model(qwen2_config(tokenizer), seed=3), tokenizer, models_root / "stored-none")
    profile = write_profile(tmp_path, "nohead", target={"model": str(plain), "dtype": "float32", "quantize_head": True},
                            drafter={"kind": "ngram"}, chat=False)
    code, _, err = run_cli(capsys, "generate", "hello", "-p", str(profile), "-n", "4")
    assert code == 2
    assert_one_line_error(err, "quantize_head: true goes with quantize: int4 or a GPTQ/AWQ int4 checkpoint")


@pytest.mark.parametrize("change, fragment", [
    ({"quantize": "int4"}, "stored quantized already (gptq); remove quantize: int4"),
    ({"bits": 8}, "GPTQ with 8-bit weights; specdec reads 4-bit GPTQ checkpoints only"),
])
def test_what_specdec_cannot_take_is_a_one_line_error(capsys, tmp_path, models_root, tokenizer, change, fragment):
    from cli_helpers import assert_one_line_error, run_cli

    folder = models_root / f"stored-bad-{len(fragment)}"
    write_checkpoint(build_model(qwen2_config(tokenizer), seed=4), tokenizer, folder, "gptq")
    target = {"model": str(folder), "dtype": "float32"}
    if "bits" in change:
        config = json.loads((folder / "config.json").read_text())
        config["quantization_config"].update(change)
        (folder / "config.json").write_text(json.dumps(config))
    else:
        target.update(change)
    profile = write_profile(tmp_path, "bad", target=target, drafter={"kind": "ngram"}, chat=False)
    code, _, err = run_cli(capsys, "generate", "hello", "-p", str(profile), "-n", "4")
    assert code == 2
    assert_one_line_error(err, fragment)


def test_formats_specdec_does_not_read_are_named():
    assert stored_int4({"quant_method": "bitsandbytes"}, "m") is None
    assert stored_int4({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}, "m").label == "awq-int4-g128"
    with pytest.raises(Exception, match="AWQ version gemv"):
        stored_int4({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "m")
    with pytest.raises(Exception, match="group_size -1"):
        stored_int4({"quant_method": "gptq", "bits": 4, "group_size": -1}, "m")


@needs_kernels
def test_a_second_load_maps_the_converted_layers_from_the_cache(tmp_path, monkeypatch, checkpoints):
    from specdec_cli.models import stored_int4

    folder, _ = checkpoints["awq"]
    profile = str(write_profile(tmp_path, "cached", target={"model": str(folder), "dtype": "float32"},
                                drafter={"kind": "ngram"}, chat=False))
    first = Pipeline.from_profile(profile).target.model.layers[0].mlp.up_proj
    monkeypatch.setattr(stored_int4, "layer_codes", lambda *_: pytest.fail("converted again"))
    again = Pipeline.from_profile(profile).target.model.layers[0].mlp.up_proj
    assert all(torch.equal(getattr(first, part), getattr(again, part)) for part in int4_matmul.PARTS)
