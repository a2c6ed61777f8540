"""A target and a draft with two different byte-level BPE tokenizers, built at test time. Both are
fitted for a few seconds to the same lines, each in its own tokens, so that they write alike
(random weights would agree on almost nothing across two tokenizers)."""

from __future__ import annotations

from pathlib import Path

import torch

from tiny_models import CORPUS, build_model, build_tokenizer, llama_config, save

STEPS = 120  # enough for both to write the lines back, a few seconds on a CPU core

# the draft's tokenizer learns its merges from other lines, in another order, with other special ids
DRAFT_CORPUS = [line[::-1] for line in CORPUS[:3]] + CORPUS[3:] + [
    "return the reversed list of items; print every value.",
    "Speculation: draft, then verify. Résumé naïve café — ünïcödé ✓",
]


def build_draft_tokenizer(folder: Path, vocab_size: int = 300):
    """A byte-level BPE with merges and special-token ids of its own (and no chat template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<pad>", "<|endoftext|>", "<|start|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(DRAFT_CORPUS * 3, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|start|>", eos_token="<|endoftext|>", pad_token="<pad>")
    fast.save_pretrained(folder)
    return fast


def fitted(model, tokenizer, lines: list[str], steps: int, seed: int):
    """`model` after `steps` of Adam on `lines` (each with its BOS and EOS), in eval mode."""
    torch.manual_seed(seed)
    rows = [[tokenizer.bos_token_id] + tokenizer.encode(line) + [tokenizer.eos_token_id] for line in lines]
    width = max(map(len, rows))
    ids = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows])
    labels = torch.where(ids == tokenizer.pad_token_id, -100, ids)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def build_vocab_pair(root: Path) -> dict[str, Path]:
    """target: a 4-layer Llama on the suite's BPE (400 tokens); draft: a 2-layer Llama on a 300-token
    BPE of its own; stranger: a draft on a 12-word vocabulary (shares almost nothing)."""
    from tiny_models import build_word_tokenizer

    target_tok = build_tokenizer(root / "vocab-target-tok", vocab_size=400, chat=False)
    draft_tok = build_draft_tokenizer(root / "vocab-draft-tok")
    target = fitted(build_model(llama_config(target_tok, layers=4), seed=0), target_tok, CORPUS, STEPS, seed=0)
    draft = fitted(build_model(llama_config(draft_tok, layers=2), seed=1), draft_tok, CORPUS, STEPS, seed=1)
    words = build_word_tokenizer(root / "vocab-words-tok")
    return {
        "target": save(target, target_tok, root / "vocab-target"),
        "draft": save(draft, draft_tok, root / "vocab-draft"),
        "stranger": save(build_model(llama_config(words, layers=1, hidden=32), seed=2), words, root / "vocab-stranger"),
    }
