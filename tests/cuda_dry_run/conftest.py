"""The CUDA dry run needs a CUDA build of torch (the CPU build cannot fake a CUDA device) and no GPU
(on a GPU, the real suite runs instead: benchmarks/gpu_check.sh). benchmarks/cuda_dry_run.sh makes
its venv and runs it; the main suite, on the CPU build, skips it."""

from __future__ import annotations

import pytest
import torch
from head_checkpoints import DRAFT_VOCAB, eagle_config, random_tensors, write_head
from tiny_models import build_model, llama_config, save
from vocab_pairs import build_draft_tokenizer


def pytest_collection_modifyitems(config, items):
    if torch.version.cuda is not None and not torch.cuda.is_available():
        return
    why = "the CUDA dry run needs a CUDA build of torch on a machine without a GPU (benchmarks/cuda_dry_run.sh)"
    for item in items:
        if "cuda_dry_run" in str(item.path):
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def drafts(llama_pair, tmp_path_factory) -> dict[str, dict]:
    """A drafter profile section of each kind for llama_pair's target (heads with random weights:
    the dry run checks devices and dtypes, not how well they guess)."""
    from transformers import AutoConfig

    root = tmp_path_factory.mktemp("dry-drafts")
    config = AutoConfig.from_pretrained(llama_pair["target"])
    generator = torch.Generator().manual_seed(0)
    hidden, vocab = config.hidden_size, config.vocab_size
    medusa = write_head(root / "medusa", {"medusa_num_heads": 3, "medusa_num_layers": 1},
                        random_tensors("medusa", hidden, vocab, generator=generator), "medusa_lm_head.safetensors")
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(llama_pair["target"], dtype=torch.float32)
    eagle3 = write_head(root / "eagle3", eagle_config(target, "eagle3"),
                        random_tensors("eagle3", hidden, vocab, generator=generator, draft_vocab=DRAFT_VOCAB), "model.safetensors")
    other_tokenizer = build_draft_tokenizer(root / "other-tok")
    other = save(build_model(llama_config(other_tokenizer, layers=2), seed=5), other_tokenizer, root / "other-draft")
    model = {"kind": "model", "model": str(llama_pair["draft"])}
    return {
        "model": {"drafter": model},
        "lookup": {"drafter": {"kind": "ngram"}},
        "early exit": {"drafter": {"kind": "early-exit", "layers": 2}},
        "chain": {"drafter": {"kind": "chain", "drafters": [{"kind": "ngram"}, model]}},
        "medusa": {"drafter": {"kind": "medusa", "heads": str(medusa)}},
        "eagle-3": {"drafter": {"kind": "eagle", "head": str(eagle3)}},
        "other tokenizer": {"drafter": {"kind": "model", "model": str(other), "vocab": "intersect"}},
    }
