"""Logits -> probabilities: one function, used for the target's p and the draft's q alike.

The warps are transformers' own (temperature, then top-k, then top-p, as in generate), so that
"the target's distribution" means the same thing here as in `generate(do_sample=True)`.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from .specs import SamplingSpec


@lru_cache(maxsize=32)
def logits_warpers(sampling: SamplingSpec):
    """transformers' own warpers for this temperature / top-k / top-p, in generate()'s order."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    warpers = LogitsProcessorList([TemperatureLogitsWarper(sampling.temperature)])
    if sampling.top_k > 0:
        warpers.append(TopKLogitsWarper(sampling.top_k))
    if sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(sampling.top_p))
    return warpers


def warp_logits(logits: torch.Tensor, sampling: SamplingSpec) -> torch.Tensor:
    """Apply temperature, top-k and top-p to the last dimension (float32); removed tokens get -inf."""
    rows = logits.float().reshape(-1, logits.shape[-1])
    return logits_warpers(sampling)(None, rows).reshape(logits.shape)


def probabilities(logits: torch.Tensor, sampling: SamplingSpec) -> torch.Tensor:
    """The sampling distribution (float32) for `logits`; at temperature 0 a one-hot of the argmax."""
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    return warp_logits(logits, sampling).softmax(dim=-1)


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
