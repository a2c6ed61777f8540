"""More paths on fake CUDA (fake_cuda.py says how and what fails it): static caches, a compile
that fails, int8, float16, stop texts, a constraint; and the host syncs a step, counted."""

from __future__ import annotations

import pytest
import torch
from dry_runs import TREE, run


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_static_caches_on_fake_cuda(tmp_path, llama_pair, drafts, shape, batch_size):
    """compile: on's static caches (writes, rollbacks, a tree's path moved into place) and padded steps."""
    extra = {"tree": TREE} if shape == "tree" else {}
    result = run(tmp_path, llama_pair, {**drafts["model"], **extra}, batch_size=batch_size, static=True)
    assert result["compile"] == "on"


@pytest.mark.parametrize("batch_size", [1, 3])
def test_int8_on_fake_cuda(tmp_path, llama_pair, drafts, batch_size):
    """The target quantize: int8 (torchao's weight-only layout for CUDA). int4's CUDA layout cannot
    run on fake tensors: torchao packs it with a CUDA kernel that has no fake version."""
    run(tmp_path, llama_pair, drafts["model"], batch_size=batch_size, quantize="int8")


def test_a_compile_that_fails_on_cuda_decodes_eagerly(tmp_path, llama_pair, drafts, caplog, monkeypatch):
    """compile: on where the compiler fails (here: no driver for inductor's CUDA kernels): one
    warning, the steps run uncompiled, the same tokens, exit as usual."""
    from specdec_cli.runtime import compiled_step

    monkeypatch.setattr(compiled_step, "_failure", [])  # a failure is remembered a process
    run(tmp_path, llama_pair, drafts["model"], static="try")
    failures = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compile failed")]
    assert len(failures) == 1 and "decoding uncompiled, the same tokens" in failures[0]


def test_float16_on_fake_cuda(tmp_path, llama_pair, drafts):
    result = run(tmp_path, llama_pair, {**drafts["model"], "tree": TREE}, dtype="float16")
    assert result["dtype"] == torch.float16


def test_stop_texts_on_fake_cuda(tmp_path, llama_pair, drafts):
    result = run(tmp_path, llama_pair, drafts["lookup"], batch_size=3, stop=["\n"], max_new_tokens=16)
    assert result["reads"] > 0


# --- host syncs: on a GPU each device -> host read waits for the queue to drain

@pytest.mark.parametrize("kind", ["plain", "model", "lookup", "early exit", "chain", "medusa", "eagle-3", "other tokenizer"])
def test_a_chain_step_reads_the_device_once(tmp_path, llama_pair, drafts, kind):
    """One device -> host transfer a step (the verify's result), none at the start of a generation."""
    result = run(tmp_path, llama_pair, drafts["model" if kind == "plain" else kind], plain=kind == "plain",
                 max_new_tokens=16)
    assert len(result["device_reads"]) == result["steps"][0], result["device_reads"]


@pytest.mark.parametrize("shape", ["tree", "k auto"])
def test_a_draft_models_tree_or_auto_depth_reads_once_a_level(tmp_path, llama_pair, drafts, shape):
    """A draft model's tree reads q's top values once a level (the tree's shape is settled on the
    host), and k: auto once a drafted token (whether one more pays): at most 1 + depth a step."""
    extra = {"tree": TREE} if shape == "tree" else {"k": "auto"}
    result = run(tmp_path, llama_pair, {**drafts["model"], **extra}, max_new_tokens=16)
    steps, reads = result["steps"][0], len(result["device_reads"])
    deepest = TREE["depth"] if shape == "tree" else result["k_limit"]
    assert steps < reads <= steps * (1 + deepest)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_constrained_decoding_on_fake_cuda(tmp_path, llama_pair, drafts, batch_size):
    """A JSON constraint: the matcher's masks are made on the host and cross to the device."""
    from specdec_cli.specs import ConstraintSpec

    run(tmp_path, llama_pair, drafts["model"], batch_size=batch_size, constraint=ConstraintSpec("json"))
