"""A draft model (a smaller model with the target's tokenizer) that drafts with its own KV cache."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch

from ..lm import make_lm
from ..models import check_tokenizers_match
from ..sampling import probabilities
from ..specs import DrafterSpec, SamplingSpec
from .base import Draft, DraftContext


class ModelDrafter:
    """Drafts k tokens with k forwards of a draft LM, recording the q it sampled each token from.

    The cache plus `pending` always spell the committed sequence: tokens the draft has not seen yet
    (the target's correction or bonus, and after a full acceptance the last draft) wait in
    `pending` and go in with the next proposal's first forward, so no forward is spent on catch-up.
    """

    def __init__(self, model: torch.nn.Module, context: DraftContext, name: str = "model", separate_model: bool = True):
        """`separate_model` False: `model` is a view of the target (early exit), not a draft model of its own."""
        self.name = name
        self.lm = make_lm(model, context.vocab, context.compile)
        self.draft_model = model if separate_model else None
        self.out_device = context.device
        self.pending = torch.empty(0, dtype=torch.long)
        self.proposed = 0
        self.committed = 0  # committed tokens, = lm.length + len(pending)

    def reserve(self, positions: int) -> None:
        """Room in a static cache for a generation of `positions` tokens (drafts included)."""
        self.lm.reserve(positions)

    def warmup(self) -> None:
        """Compile the draft's steps ahead: it reads one new token a forward, two after a full acceptance."""
        self.lm.warmup([(1, 1), (2, 1)])

    def begin(self, prompt_ids: torch.Tensor, sampling: SamplingSpec, seed: int) -> None:
        self.sampling = sampling
        self.generator = None
        if not sampling.greedy:
            self.generator = torch.Generator(device=self.lm.device).manual_seed(seed)
        ids = prompt_ids.to(self.lm.device)
        self.lm.reset()
        self.lm.prefill(ids[:-1])
        self.pending = ids[-1:]
        self.proposed = 0
        self.committed = int(ids.shape[0])

    def propose(self, k: int, budget=None) -> Draft | None:
        tokens, dists = [], []
        step_input = self.pending
        for i in range(k):
            logits = self.lm.forward(step_input, keep=1)[0]
            if self.sampling.greedy:
                token = logits.argmax(dim=-1, keepdim=True)
                q = None
            else:
                q = probabilities(logits, self.sampling)
                token = torch.multinomial(q, 1, generator=self.generator)
            tokens.append(token)
            dists.append(q)
            step_input = token
            if budget is not None and i + 1 < k:
                confidence = q.max() if q is not None else torch.softmax(logits.float(), dim=-1).max()
                if not budget.allows_more(self.name, float(confidence)):
                    break
        self.pending = self.pending[:0]
        self.proposed = len(tokens)  # the cache now holds all but the last drafted token
        probs = None if self.sampling.greedy else torch.stack(dists)
        return Draft(torch.cat(tokens).to(self.out_device), probs, self.name)

    def accept(self, new_tokens: Sequence[int], n_from_draft: int) -> None:
        keep = min(n_from_draft, self.proposed - 1) if self.proposed else 0
        self.lm.truncate(self.committed + keep)
        tail = torch.tensor(list(new_tokens[keep:]), dtype=torch.long, device=self.lm.device)
        self.pending = torch.cat([self.pending, tail]) if self.pending.numel() else tail
        self.committed += len(new_tokens)
        self.proposed = 0


def build(spec: DrafterSpec, context: DraftContext) -> ModelDrafter:
    model = context.load_model(spec.model, spec.options.get("quantize"))
    draft_tokenizer = context.load_tokenizer(spec.model)
    check_tokenizers_match(context.tokenizer, draft_tokenizer, context.target_name, spec.model.model)
    if spec.options.get("quantize"):  # int8 Linear layers are torch.ao ops, which inductor does not compile
        context = replace(context, compile="off")
    return ModelDrafter(model, context, name="model")
