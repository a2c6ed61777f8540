"""Medusa: heads over the target's last hidden state, head h guessing the token h + 2 places
after the one that state belongs to, so a draft costs no forward of any model but the heads.

The tree: depth d's candidates are head d-1's best guesses (top q at temperature 0, top q / e
with the target's noise above it), the same for every node of that depth; which nodes get how many children is chosen
by path value (TreeGrower), so the tree is Medusa's top-k combination pruned to the budget.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..errors import UsageError
from ..primitives.sampling import PositionNoise, fit_vocab
from ..specs import DrafterSpec, SamplingSpec, TreeSpec
from .base import Draft, DraftContext, Drafter
from .growth import Level, TreeGrower


class MedusaDrafter(TreeGrower, Drafter):
    draft_model = None  # no model of its own

    def __init__(self, heads, context: DraftContext, name: str = "medusa"):
        from .head_files import feature_layers

        self.name = name
        self.lm_head = context.target.get_output_embeddings()
        self.heads = heads.to(self.lm_head.weight.device)  # beside the LM head (the last GPU of a spread target)
        self.vocab = context.vocab
        self.out_device = context.device
        self.feature_layers = feature_layers("medusa", context.target)
        self.feature: torch.Tensor | None = None
        self.noise = None

    def begin(self, prompt_ids: torch.Tensor, sampling: SamplingSpec, noise: PositionNoise | None) -> None:
        self.sampling = sampling
        self.feature = None
        self.noise = noise

    def take_features(self, features: torch.Tensor) -> None:
        """The target's states of the tokens just committed but the newest: the last one drafts."""
        self.feature = features[-1]

    def propose(self, shape: TreeSpec, budget=None) -> Draft | None:
        if self.feature is None:  # a one-token prompt: no state read yet
            return None
        with torch.inference_mode():
            feature = self.feature.to(self.lm_head.weight.device)
            logits = fit_vocab(self.heads.logits(feature, self.lm_head), self.vocab)  # [heads, V]

        def next_level(levels: list[Level], nodes: list[int], depth: int) -> torch.Tensor | None:
            return logits[depth : depth + 1].expand(len(nodes), -1) if depth < len(logits) else None

        return self.grow(shape, budget, logits[:1], next_level)

    def accept(self, new_tokens: Sequence[int], path: Sequence[int]) -> None:
        """Nothing to keep: the next state arrives with take_features."""


def build(spec: DrafterSpec, context: DraftContext) -> MedusaDrafter:
    from .head_files import load_head

    reference = spec.options.get("heads")
    if not reference:
        raise UsageError("drafter.heads: give the folder (or hub id) of the Medusa heads, e.g. heads: ~/.cache/specdec/heads/NAME")
    heads, _ = load_head(reference, context.target, kind="medusa", allow_pickle=context.allow_pickle)
    if heads.kind != "medusa":
        raise UsageError(f"drafter.heads: '{reference}' holds an EAGLE head; use kind: eagle with head: {reference}")
    return MedusaDrafter(heads, context)
