"""Both KV caches checked against a fresh prefill of the committed tokens (a dynamic cache or a static one)."""

from __future__ import annotations

import torch
from transformers import DynamicCache


def fresh_cache(model, ids: list[int]) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    if ids:
        with torch.inference_mode():
            model(input_ids=torch.tensor([ids], device=model.device), cache=cache, use_cache=True)
    return cache


def assert_cache_holds(lm, ids: list[int]) -> None:
    """The cache of a CachedLM equals a fresh prefill of `ids`, position for position."""
    assert lm.length == len(ids) == lm.cached_positions()
    reference = fresh_cache(lm.model, ids)
    for ours, theirs in zip(lm.cache.layers, reference.layers):
        if not ids:
            continue
        assert ours.keys.shape == theirs.keys.shape
        assert (ours.keys - theirs.keys).abs().max() < 1e-4
        assert (ours.values - theirs.values).abs().max() < 1e-4


def assert_static_cache_holds(lm, ids: list[int]) -> None:
    """The first `length` slots of every layer of a StaticLM equal a fresh eager prefill of `ids`."""
    assert lm.length == len(ids) == lm.cached_positions()
    if not ids:
        return
    reference = fresh_cache(lm.model, ids)
    for ours, theirs in zip(lm.cache.layers, reference.layers, strict=True):
        assert torch.allclose(ours.keys[:, :, : len(ids)], theirs.keys, atol=1e-4)
        assert torch.allclose(ours.values[:, :, : len(ids)], theirs.values, atol=1e-4)
