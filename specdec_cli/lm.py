"""A causal LM with its own KV cache, where rolling back means cropping to the committed length."""

from __future__ import annotations

import torch

from .models import input_device
from .sampling import fit_vocab


class CachedLM:
    """One model plus one DynamicCache; `length` (kept on the host) is how many positions the cache holds."""

    def __init__(self, model: torch.nn.Module, vocab: int):
        self.model = model
        self.vocab = vocab
        self.device = input_device(model)
        self.cache = None
        self.length = 0

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.length = 0

    def forward(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        """Append `ids` [n] to the cache; logits [keep, vocab] for the last `keep` positions."""
        with torch.inference_mode():  # no autograd graph: decoding never needs gradients
            out = self.model(
                input_ids=ids.view(1, -1).to(self.device, non_blocking=True),
                cache=self.cache,
                use_cache=True,
                logits_to_keep=keep,
            )
        self.length += ids.shape[-1]
        return fit_vocab(out.logits[0, -keep:], self.vocab)

    def prefill(self, ids: torch.Tensor) -> None:
        """Fill the cache with `ids`; only the last position's logits are computed (and dropped)."""
        if ids.numel():
            self.forward(ids, keep=1)

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (rejected drafts)."""
        if length < self.length:
            self.cache.crop(length - self.length)  # a negative count removes that many from the end
            self.length = length

    def cached_positions(self) -> int:
        """The cache's own count, for tests that check the host-side bookkeeping."""
        return self.cache.get_seq_length() if self.cache is not None else 0
