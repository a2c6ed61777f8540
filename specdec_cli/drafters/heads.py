"""Draft heads that read the target's own hidden states: Medusa's heads and an EAGLE / EAGLE-3
layer, as torch modules in the published checkpoints' layouts (so that those load as they are,
and what `specdec train-draft` writes loads in vLLM and SGLang too).

- Medusa (FasterDecoding/Medusa): head h is `{h}.{l}.linear` ResBlocks (x + SiLU(Wx + b)) and its
  own LM head `{h}.{L}.weight` [V, H]; without it (Medusa-2 layout, and ours) the target's LM head
  serves. The heads read the target's last hidden state (after the final norm) at position t;
  head h predicts the token at t + 2 + h (the target's LM head predicts t + 1).
- EAGLE (-1/-2, SafeAILab/EAGLE): fc(cat(embed(token), feature)) [2H -> H] into one decoder layer
  without an input norm; the target's LM head on its output. The feature is the target's last
  hidden state; drafting deeper feeds the layer's own output back as the feature.
- EAGLE-3: fc over three of the target's layers' states (the inputs of layers 2, L//2, L-3:
  transformers' hidden_states[i]) [3H -> H]; the layer reads cat(input_layernorm(embed),
  hidden_norm(hidden)) [2H]; its own norm and LM head over a reduced draft vocabulary, mapped to
  the target's by `d2t` (target id = draft id + d2t[draft id]). Deeper steps feed the layer's
  output (before the norm) back as the hidden, without fc.
In every kind the pair (feature of position i, token i + 1) sits at rotary position i.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F


class ResBlock(nn.Module):
    """Medusa's block: x + SiLU(W x + b)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """`heads` heads of `layers` ResBlocks each; `own_lm_heads` False: the target's LM head serves
    every head (one matmul for all of them). `draft_ids` (heads specdec trains): the heads score
    only these rows of the target's LM head, a draft vocabulary as EAGLE-3's: the full LM head is
    most of what a draft costs on a small model (SmolLM2-135M, 2 CPU cores: 2.6 ms for its 49,152
    rows, 0.2 ms for 8,192)."""

    kind = "medusa"

    def __init__(self, heads: int, layers: int, hidden: int, vocab: int, own_lm_heads: bool, draft_ids: torch.Tensor | None = None):
        super().__init__()
        self.layers = layers
        self.vocab = vocab
        self.own_lm_heads = own_lm_heads
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden) for _ in range(layers)], *([nn.Linear(hidden, vocab, bias=False)] if own_lm_heads else []))
            for _ in range(heads)
        )
        self.register_buffer("draft_ids", draft_ids, persistent=False)  # saved beside the heads (head_files)
        self._rows: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.heads)

    def states(self, feature: torch.Tensor) -> torch.Tensor:
        """Every head's output [..., heads, H] from the target's last hidden state(s) [..., H]."""
        return torch.stack([head(feature) for head in self.heads], dim=-2)

    def draft_rows(self, target_lm_head: nn.Module) -> torch.Tensor:
        """The target's LM-head rows of the draft vocabulary, copied once (the target is frozen)."""
        weight = target_lm_head.weight
        if self._rows is None or self._rows.device != weight.device or self._rows.dtype != weight.dtype:
            self._rows = weight.detach()[self.draft_ids.to(weight.device)]
        return self._rows

    def draft_logits(self, feature: torch.Tensor, target_lm_head: nn.Module) -> torch.Tensor:
        """Logits over the draft vocabulary [..., heads, len(draft_ids)] (what training scores)."""
        return self.states(feature) @ self.draft_rows(target_lm_head).T

    def logits(self, feature: torch.Tensor, target_lm_head: nn.Module) -> torch.Tensor:
        """Every head's logits [..., heads, V] over the target's vocabulary (outside the draft vocabulary: -inf)."""
        if self.own_lm_heads:
            return self.states(feature)  # each head's Sequential ends in its own LM head
        if self.draft_ids is None:
            return target_lm_head(self.states(feature))
        return full_vocabulary(self.draft_logits(feature, target_lm_head), self.draft_ids, self.vocab)


def full_vocabulary(draft: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """Logits over a draft vocabulary [..., len(ids)] placed at their target ids [..., vocab]; -inf elsewhere."""
    full = draft.new_full((*draft.shape[:-1], vocab), float("-inf"))
    return full.index_copy_(-1, ids.to(draft.device), draft)


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


@dataclass(frozen=True)
class HeadShape:
    """What an EAGLE layer is made of (read from its config.json)."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    vocab: int  # the target's vocabulary
    draft_vocab: int  # EAGLE-3's reduced vocabulary (= vocab when not reduced)
    feature_dim: int  # what fc reads of the target: EAGLE 2H (embed + feature), EAGLE-3 3H
    fc_bias: bool


class EagleLayer(nn.Module):
    """One Llama decoder layer whose attention reads `in_dim` features (EAGLE-3: 2H)."""

    def __init__(self, shape: HeadShape, in_dim: int, input_norms: bool):
        super().__init__()
        h, hd = shape.hidden, shape.head_dim
        self.shape = shape
        if input_norms:  # EAGLE-3; EAGLE-1 dropped the first layer's input norm
            self.input_layernorm = RMSNorm(h, shape.eps)
            self.hidden_norm = RMSNorm(h, shape.eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(in_dim, shape.heads * hd, bias=False)
        self.self_attn.k_proj = nn.Linear(in_dim, shape.kv_heads * hd, bias=False)
        self.self_attn.v_proj = nn.Linear(in_dim, shape.kv_heads * hd, bias=False)
        self.self_attn.o_proj = nn.Linear(shape.heads * hd, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h, shape.eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, shape.intermediate, bias=False)
        self.mlp.up_proj = nn.Linear(h, shape.intermediate, bias=False)
        self.mlp.down_proj = nn.Linear(shape.intermediate, h, bias=False)

    def attend(self, x: torch.Tensor, rotary, extend: Callable, mask: torch.Tensor) -> torch.Tensor:
        """Attention of x [B, n, in_dim] over the keys `extend(k, v)` returns with its own (a cache's
        append, or training's earlier steps); `mask` [B or 1, 1, n, keys] says which it sees."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        b, n, _ = x.shape
        s = self.shape
        attn = self.self_attn
        q = attn.q_proj(x).view(b, n, s.heads, s.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
        cos, sin = rotary
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = extend(k, v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=s.heads != s.kv_heads)
        return attn.o_proj(out.transpose(1, 2).reshape(b, n, s.heads * s.head_dim))

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self.post_attention_layernorm(h)
        return h + self.mlp.down_proj(F.silu(self.mlp.gate_proj(x)) * self.mlp.up_proj(x))


class EagleHead(nn.Module):
    """An EAGLE (kind "eagle") or EAGLE-3 (kind "eagle3") draft layer with the published keys.

    `step` maps (embeddings of the tokens, the hidden each is paired with) to the layer's outputs;
    `project` turns the target's features into that hidden (EAGLE-3: fc; EAGLE: as they are)."""

    def __init__(self, kind: str, shape: HeadShape, rope_config):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.kind = kind
        self.shape = shape
        h = shape.hidden
        self.fc = nn.Linear(shape.feature_dim, h, bias=shape.fc_bias)
        layer = EagleLayer(shape, 2 * h if kind == "eagle3" else h, input_norms=kind == "eagle3")
        if kind == "eagle3":
            self.midlayer = layer
            self.norm = RMSNorm(h, shape.eps)
            self.lm_head = nn.Linear(h, shape.draft_vocab, bias=False)
            self.register_buffer("d2t", torch.zeros(shape.draft_vocab, dtype=torch.long))
            self.register_buffer("t2d", torch.ones(shape.vocab, dtype=torch.bool))
        else:
            self.layers = nn.ModuleList([layer])
        self.rotary = LlamaRotaryEmbedding(rope_config)
        self.own_embeddings: nn.Embedding | None = None  # EAGLE-3 heads narrower than their target

    @property
    def layer(self) -> EagleLayer:
        return self.midlayer if self.kind == "eagle3" else self.layers[0]

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features [.., F] as the hidden a committed token is paired with."""
        return self.fc(features) if self.kind == "eagle3" else features

    def step(
        self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, extend: Callable, mask: torch.Tensor
    ) -> torch.Tensor:
        """The layer's outputs [B, n, H] for tokens' embeddings [B, n, H] and hiddens [B, n, H] at
        `positions` [B, n]; keys and mask as in EagleLayer.attend."""
        rotary = self.rotary(embeds, positions)
        if self.kind == "eagle3":
            x = torch.cat([self.layer.input_layernorm(embeds), self.layer.hidden_norm(hidden)], dim=-1)
            h = hidden + self.layer.attend(x, rotary, extend, mask)
        else:
            x = self.fc(torch.cat([embeds, hidden], dim=-1))
            h = x + self.layer.attend(x, rotary, extend, mask)
        return self.layer.feed_forward(h)

    def logits(self, outputs: torch.Tensor, target_lm_head: nn.Module) -> torch.Tensor:
        """Logits over the target's vocabulary (EAGLE-3: tokens outside the draft vocabulary get -inf)."""
        if self.kind != "eagle3":
            return target_lm_head(outputs)
        draft = self.lm_head(self.norm(outputs))
        if self.shape.draft_vocab == self.shape.vocab and not bool(self.d2t.any()):
            return draft
        return full_vocabulary(draft, torch.arange(self.shape.draft_vocab, device=draft.device) + self.d2t, self.shape.vocab)

    def draft_logits(self, outputs: torch.Tensor) -> torch.Tensor:
        """EAGLE-3 logits over its draft vocabulary (what training scores)."""
        return self.lm_head(self.norm(outputs))


class HeadCache:
    """An EAGLE layer's keys and values [1, kv_heads, positions, head_dim], grown by concatenation;
    `length` positions are committed-or-drafted, rolled back by cropping."""

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[2])

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys = k if self.keys is None else torch.cat([self.keys, k], dim=2)
        self.values = v if self.values is None else torch.cat([self.values, v], dim=2)
        return self.keys, self.values

    def truncate(self, length: int) -> None:
        if self.keys is not None and length < self.length:
            self.keys = self.keys[:, :, :length]
            self.values = self.values[:, :, :length]
