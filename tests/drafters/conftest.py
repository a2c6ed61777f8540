"""The draft heads the head tests share, fitted once per test session (a few seconds each)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from exact_distribution import PROMPT_WORDS
from head_checkpoints import DRAFT_VOCAB, KINDS, NEW_TOKENS, PROMPTS, eagle_config, fit_eagle, fit_medusa, greedy_sequences, most_used, write_head


@pytest.fixture(scope="session")
def heads(llama_pair, tokenizer, tmp_path_factory) -> dict:
    """One head folder of each kind for llama_pair's target, in the published layouts."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("heads")
    target = AutoModelForCausalLM.from_pretrained(llama_pair["target"], dtype=torch.float32).eval()
    sequences = greedy_sequences(target, [tokenizer(p)["input_ids"] for p in PROMPTS], NEW_TOKENS)
    folders, tensors = {}, {}
    for kind in KINDS:
        if kind.startswith("medusa"):
            own = kind == "medusa-own"
            config = {"medusa_num_heads": 3, "medusa_num_layers": 1, "base_model_name_or_path": "tiny-llama"}
            draft_ids = most_used(sequences, DRAFT_VOCAB, target.config.vocab_size) if kind == "medusa-vocab" else None
            state = fit_medusa(target, sequences, 3, own, draft_ids=draft_ids)
            weights = "medusa_lm_head.safetensors"
        else:
            config = eagle_config(target, kind)
            state = fit_eagle(target, sequences, kind, config)
            weights = "model.safetensors"
        tensors[kind] = state
        folders[kind] = write_head(root / kind, config, state, weights)
    return {"folders": folders, "tensors": tensors, "target": target, "root": root}



@pytest.fixture(scope="session")
def word_heads(small_vocab_pair, tmp_path_factory) -> dict[str, Path]:
    """Heads for small_vocab_pair's 2-layer, 12-token target, fitted to its samples: Medusa sharing
    its LM head, and EAGLE-3 over 8 of the 12 tokens (the other 4 only the target makes)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("word-heads")
    target = AutoModelForCausalLM.from_pretrained(small_vocab_pair["target"], dtype=torch.float32).eval()
    words = AutoTokenizer.from_pretrained(small_vocab_pair["target"])
    prompt = words(PROMPT_WORDS)["input_ids"]
    torch.manual_seed(4)
    with torch.inference_mode():  # the target's own samples at temperature 1
        sampled = target.generate(
            torch.tensor([prompt] * 16), attention_mask=torch.ones(16, len(prompt), dtype=torch.long),
            max_new_tokens=12, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, eos_token_id=None, pad_token_id=0,
        ).tolist()
    folders = {}
    config = {"medusa_num_heads": 2, "medusa_num_layers": 1}
    state = fit_medusa(target, sampled, 2, own_lm_heads=False, steps=60, wrong_labels=False)
    folders["medusa"] = write_head(root / "medusa", config, state, "medusa_lm_head.safetensors")
    state = fit_medusa(target, sampled, 2, own_lm_heads=False, steps=60, wrong_labels=False,
                       draft_ids=most_used(sampled, 8, target.config.vocab_size))
    folders["medusa-vocab"] = write_head(root / "medusa-vocab", config, state, "medusa_lm_head.safetensors")
    # the target is too shallow for the default layers (2, L//2, L-3): the config names them (as vLLM reads them)
    config = eagle_config(target, "eagle3", draft_vocab_size=8, eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]})
    state = fit_eagle(target, sampled, "eagle3", config, steps=60, feature_layers=(0, 1, 2))
    folders["eagle3"] = write_head(root / "eagle3", config, state, "model.safetensors")
    return folders
