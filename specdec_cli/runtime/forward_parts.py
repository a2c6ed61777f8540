"""What both LMs (the eager CachedLM and the compiled StaticLM) use in a forward: the check that a
model can attend as a token tree needs, the gather of an accepted path in a KV cache, and the
hidden-state features draft heads read."""

from __future__ import annotations

import torch


def check_tree_attention(
    model: torch.nn.Module, who: str = "token trees need", instead: str = "leave out `tree:` and the chain's solo_ngram",
) -> None:
    """Token trees (and batches of rows with holes) need attention that takes an explicit 4D mask:
    transformers' sdpa and eager do, and specdec's CPU attention (cpu_attention.py)."""
    from ..errors import UsageError
    from ..kernels.cpu_attention import NAME as CPU_ATTENTION

    implementation = getattr(model.config, "_attn_implementation", None) or "eager"
    if implementation not in ("sdpa", "eager", CPU_ATTENTION):
        raise UsageError(
            f"{who} sdpa or eager attention; {type(model).__name__} runs '{implementation}' "
            f"(load the model with attn_implementation='sdpa', or {instead})"
        )


def gather_path(layers, start: int, slots: list[int]) -> None:
    """In every cache layer ([batch, heads, positions, head_dim] keys and values) move the entries
    at `slots` to start, start + 1, ...; nothing to move when they already sit there (a chain)."""
    if slots == list(range(start, start + len(slots))):
        return
    indices: dict[torch.device, torch.Tensor] = {}  # one copy to each device (layers may be spread)
    with torch.inference_mode():  # cache buffers are inference tensors
        for layer in layers:
            device = layer.keys.device
            if device not in indices:
                indices[device] = torch.tensor(slots, dtype=torch.long, device=device)
            index = indices[device]
            for tensor in (layer.keys, layer.values):
                tensor[:, :, start : start + len(slots)] = tensor.index_select(2, index)


def pick_features(hidden_states: tuple[torch.Tensor, ...], layers: tuple[int, ...]) -> torch.Tensor:
    """transformers' hidden states (index 0: the embeddings, i: the input of layer i, last: the
    final norm's output) at `layers`, concatenated per token, of a one-sequence forward:
    [n, len(layers) * hidden]."""
    return batch_features(hidden_states, layers)[0]


def batch_features(hidden_states: tuple[torch.Tensor, ...], layers: tuple[int, ...]) -> torch.Tensor:
    """pick_features for every row of a batch: [rows, n, len(layers) * hidden]."""
    return torch.cat([hidden_states[i] for i in layers], dim=-1)
