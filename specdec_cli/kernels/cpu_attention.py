"""specdec's CPU attention for static caches: the verify's few query rows against the cache's slots.

ATen's CPU SDPA costs about 100 us a layer for a 2-row step over 256 slots, whatever the work (a
1.5B model: 4 ms of a 43 ms int4 step; a 135M draft: a third of its step), and grows with the
cache's capacity, masked slots included. The kernel beside the int4 one (cpu_kernels.cpp) takes one
query row per task, skips masked slots and keeps each row's output independent of the others.

Registered with transformers as the attention implementation `specdec_cpu`: StaticLM switches a
CPU model that runs sdpa to it (static caches always pass an explicit mask). It hands to
transformers' sdpa whatever it does not take: no mask (a causal prefill), more than MAX_ROWS rows,
another device or dtype, head sizes that are not 16s, dropout, soft-capping, sliding windows."""

from __future__ import annotations

from functools import lru_cache

import torch

from . import build

NAME = "specdec_cpu"
MAX_ROWS = 128  # wider forwards are prefills, where SDPA's blocked kernel is the faster one
DTYPES = (torch.float32, torch.bfloat16)


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: query [B, H, n, D], key and value [B, Hkv, C, D] ->
    ([B, n, H, D], no weights)."""
    if not takes(query, key, value, attention_mask, dropout, kwargs):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = torch.ops.specdec_kernels.masked_attention(query, key, value, attention_mask, scale)
    return out.transpose(1, 2).contiguous(), None


def takes(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, dropout: float,
          kwargs: dict) -> bool:
    return (mask is not None and query.device.type == "cpu" and query.dtype in DTYPES
            and key.dtype == value.dtype == mask.dtype == query.dtype and query.shape[2] <= MAX_ROWS
            and query.shape[-1] % 16 == 0 and query.shape[-1] <= 256 and query.shape[1] % key.shape[1] == 0
            and mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[-1] == key.shape[2] and mask.stride(-1) == 1
            and key.stride(-1) == 1 and key.stride() == value.stride() and not dropout
            and kwargs.get("softcap") is None and not kwargs.get("sliding_window")
            and kwargs.get("s_aux") is None and not kwargs.get("output_attentions"))


@lru_cache(maxsize=1)
def registered() -> bool:
    """Whether the kernel runs here (build.available(): an AVX512-VNNI or AVX2 CPU, the kernels
    built) and transformers knows it by NAME; torch.compile's tracing knows its output's shape."""
    if not build.available():
        return False
    torch.library.register_fake("specdec_kernels::masked_attention")(lambda q, k, v, mask, scale: q.new_empty(q.shape))
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks transformers builds are sdpa's
    return True


def use_on(model: torch.nn.Module) -> bool:
    """Switch a CPU model that attends with sdpa to NAME; whether it now does."""
    config = model.config
    if getattr(config, "_attn_implementation", None) == NAME:
        return True
    if getattr(config, "_attn_implementation", None) != "sdpa" or not registered():
        return False
    model.set_attn_implementation(NAME)
    return config._attn_implementation == NAME
