"""Logits -> probabilities: one function, used for the target's p and the draft's q alike.

The order of warps matches transformers' sampling (temperature, then top-k, then top-p), so that
"the target's distribution" means the same thing here as in `generate(do_sample=True)`.
"""

from __future__ import annotations

import torch

from .profile import SamplingSpec


def warp_logits(logits: torch.Tensor, sampling: SamplingSpec) -> torch.Tensor:
    """Apply temperature, top-k and top-p to the last dimension; removed tokens get -inf."""
    logits = logits.float() / sampling.temperature
    vocab = logits.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # drop the low tail whose mass is at most 1 - top_p; the most likely token always stays
        drop_sorted = cumulative <= (1.0 - sampling.top_p)
        drop_sorted[..., -1] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def probabilities(logits: torch.Tensor, sampling: SamplingSpec) -> torch.Tensor:
    """The sampling distribution (float32) for `logits`; at temperature 0 a one-hot of the argmax."""
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    return warp_logits(logits, sampling).softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token id per row of `probs` (shape [..., V] -> [...]), drawn with `generator`."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def fit_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Cut or pad the last dimension of `logits` to `vocab` ids, so that p and q index the same tokens.

    Models pad their embedding matrices (Qwen: 151936 rows for 151665 tokens); the padded rows are
    not tokens and are cut before the softmax. A draft with a narrower head gets -inf (no mass) there.
    """
    width = logits.shape[-1]
    if width == vocab:
        return logits
    if width > vocab:
        return logits[..., :vocab]
    return torch.nn.functional.pad(logits, (0, vocab - width), value=float("-inf"))
