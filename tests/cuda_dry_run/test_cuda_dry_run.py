"""The decoding paths on fake CUDA (fake_cuda.py says how and what fails it): plain decoding, each
drafter, token trees, k: auto and tree: auto at batch sizes 1 and 3, greedy and seeded sampling
(test_dry_run_paths.py has the rest). Each run is several steps: 10 new tokens, drafts of up to 4."""

from __future__ import annotations

import pytest
import torch
from dry_runs import TREE, run

SAMPLED = {"temperature": 0.8, "top_k": 0, "top_p": 1.0}


def test_plain_decoding_on_fake_cuda(tmp_path, llama_pair, drafts):
    result = run(tmp_path, llama_pair, drafts["model"], plain=True)
    assert result["dtype"] == torch.bfloat16  # dtype: auto on a GPU that says it supports bf16


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("kind", ["model", "lookup", "early exit", "chain", "medusa", "eagle-3", "other tokenizer"])
def test_each_drafter_on_fake_cuda(tmp_path, llama_pair, drafts, kind, batch_size):
    run(tmp_path, llama_pair, drafts[kind], batch_size=batch_size)


@pytest.mark.parametrize("shape", ["tree", "k auto", "tree auto"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_trees_and_auto_depth_on_fake_cuda(tmp_path, llama_pair, drafts, shape, batch_size):
    extra = {"tree": {"tree": TREE}, "k auto": {"k": "auto"}, "tree auto": {"tree": "auto"}}[shape]
    run(tmp_path, llama_pair, {**drafts["model"], **extra}, batch_size=batch_size)


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("kind", ["model", "eagle-3"])
def test_seeded_sampling_on_fake_cuda(tmp_path, llama_pair, drafts, kind, batch_size):
    run(tmp_path, llama_pair, {**drafts[kind], "sampling": SAMPLED, "tree": TREE}, batch_size=batch_size)
