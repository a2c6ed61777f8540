"""The dry run catches what it is for (each fault planted in the verify step of a run that is right
on the CPU), and what a GPU's properties decide there (dtype: auto, compile: auto)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from dry_runs import dry_run
from fake_cuda import FAKE_GPU, DryRunFailure, on_fake_cuda

from specdec_cli.primitives import device_calls


def plant(monkeypatch, fault):
    """Run `fault(logits)` inside every verify, just before the choices are made."""
    from specdec_cli.decoding import batched

    choose = batched.choose_rows

    def choose_with_fault(logits, samplings, noises):
        fault(logits)
        return choose(logits, samplings, noises)

    monkeypatch.setattr(batched, "choose_rows", choose_with_fault)


def test_a_cpu_tensor_beside_a_cuda_one_is_caught(tmp_path, llama_pair, drafts, monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorDeviceMismatchError

    plant(monkeypatch, lambda logits: logits + torch.zeros(logits.shape[-1], dtype=logits.dtype))
    with pytest.raises(FakeTensorDeviceMismatchError):
        dry_run(tmp_path, llama_pair["target"], drafts["model"])


def test_a_float32_tensor_beside_bf16_is_caught(tmp_path, llama_pair, drafts, monkeypatch):
    plant(monkeypatch, lambda logits: logits + torch.zeros(logits.shape[-1], device=logits.device))
    found = dry_run(tmp_path, llama_pair["target"], drafts["model"])["found"]
    assert any("torch.bfloat16 and torch.float32 in one op" in line for line in found)


def test_a_read_outside_the_seam_is_caught(tmp_path, llama_pair, drafts, monkeypatch):
    from torch._subclasses.fake_tensor import DataDependentOutputException

    plant(monkeypatch, lambda logits: logits.argmax(dim=-1).tolist())
    with pytest.raises(DataDependentOutputException):
        dry_run(tmp_path, llama_pair["target"], drafts["model"])


def test_a_copy_to_the_host_is_caught(tmp_path, llama_pair, drafts, monkeypatch):
    plant(monkeypatch, lambda logits: logits.to("cpu"))
    found = dry_run(tmp_path, llama_pair["target"], drafts["model"])["found"]
    assert any("device -> host copy" in line for line in found)


def test_work_fallen_back_to_the_cpu_is_caught(tmp_path, llama_pair, drafts, monkeypatch):
    plant(monkeypatch, lambda logits: torch.softmax(torch.ones(logits.shape[-1]), dim=-1))
    found = dry_run(tmp_path, llama_pair["target"], drafts["model"])["found"]
    assert any("floating-point work on the CPU during the decode" in line for line in found)


def test_a_diverging_path_is_caught(tmp_path, llama_pair, drafts):
    """A fake run that reads what the CPU run did not (here: no reads recorded at all) fails."""
    with on_fake_cuda([]):
        with pytest.raises(DryRunFailure, match="the CPU run read only 0"):
            device_calls.to_host(torch.zeros(2, device="cuda"))


# --- what a GPU's properties decide

def test_dtype_auto_follows_the_gpu(monkeypatch):
    from specdec_cli.models.devices import resolve_device, resolve_dtype

    for bf16, expected in ((True, torch.bfloat16), (False, torch.float16)):
        with on_fake_cuda([], dataclasses.replace(FAKE_GPU, bf16=bf16)):
            device = resolve_device("auto")
            assert device.type == "cuda"
            assert resolve_dtype("auto", device) == expected


def test_compile_auto_on_a_gpu_reads_its_bandwidth():
    """compile: auto's prior for a model no run has compiled on this GPU: a step streams the weights
    at 70% of the GPU's own bandwidth. An 8B target (fake weights, 16 GB in bf16) then steps in
    ~7 ms, so one generation stays eager (a CPU's 10 GB/s made it 1.6 s a step, and compiled on the
    first run), and a thousand generations compile."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec_cli.kernels.quantize import stored_bytes
    from specdec_cli.runtime.compile_choice import PRIOR_GPU_SHARE, prior_costs, resolve_auto
    from specdec_cli.specs import Workload

    config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256)
    kept = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # made in bf16: a fake weight cannot be converted in place
    try:
        with on_fake_cuda([]), torch.device("cuda"):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(kept)
    with on_fake_cuda([]):
        device = torch.device("cuda")
        step = prior_costs(model, device).eager_step_s
        assert stored_bytes(model) > 15e9
        assert step == pytest.approx(stored_bytes(model) / (FAKE_GPU.memory_bandwidth * PRIOR_GPU_SHARE))
        assert not resolve_auto(device, [model], Workload.of(1, 128), room=None).on
        assert resolve_auto(device, [model], Workload.of(1000, 256), room=None).on
