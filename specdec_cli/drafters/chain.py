"""Several drafters in order: each step, the first one that proposes wins (e.g. ngram, then a model).

Every drafter sees every committed token, so a model drafter that sat out a step (because prompt
lookup proposed) catches up in the first forward of its next proposal. Members that read the
target's hidden states (Medusa, EAGLE) get them every step, winners or not: the chain asks the
target for the union of their layers and hands each member its own columns.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..specs import DrafterSpec, SamplingSpec, TreeSpec
from .base import Draft, DraftContext, Drafter


class ChainDrafter:
    def __init__(self, drafters: Sequence[Drafter]):
        self.drafters = list(drafters)
        self.name = "chain"
        self.winner: Drafter | None = None
        readers = [d for d in self.drafters if getattr(d, "feature_layers", ())]
        self.feature_layers: tuple[int, ...] = tuple(dict.fromkeys(layer for d in readers for layer in d.feature_layers))
        self.readers = [(d, [self.feature_layers.index(layer) for layer in d.feature_layers]) for d in readers]

    @property
    def draft_model(self) -> torch.nn.Module | None:
        """The first member's own draft model, if any member has one."""
        return next((d.draft_model for d in self.drafters if d.draft_model is not None), None)

    def reserve(self, positions: int) -> None:
        for drafter in self.drafters:
            if hasattr(drafter, "reserve"):
                drafter.reserve(positions)

    def warmup(self) -> None:
        for drafter in self.drafters:
            if hasattr(drafter, "warmup"):
                drafter.warmup()

    def begin(self, prompt_ids: torch.Tensor, sampling: SamplingSpec, seed: int) -> None:
        for offset, drafter in enumerate(self.drafters):
            drafter.begin(prompt_ids, sampling, seed + offset)
        self.winner = None

    def take_features(self, features: torch.Tensor) -> None:
        """features [n, layers * hidden] at self.feature_layers: each reader gets its layers' columns."""
        width = features.shape[-1] // len(self.feature_layers)
        for drafter, blocks in self.readers:
            columns = features.view(features.shape[0], -1, width)[:, blocks]
            drafter.take_features(columns.reshape(features.shape[0], -1))

    def propose(self, shape: TreeSpec, budget=None) -> Draft | None:
        for drafter in self.drafters:
            draft = drafter.propose(shape, budget)
            if draft is not None and len(draft):
                self.winner = drafter
                return draft
        self.winner = None
        return None

    def accept(self, new_tokens: Sequence[int], path: Sequence[int]) -> None:
        for drafter in self.drafters:
            drafter.accept(new_tokens, path if drafter is self.winner else ())
        self.winner = None


def build(spec: DrafterSpec, context: DraftContext) -> ChainDrafter:
    from . import build_drafter

    members = [build_drafter(child, context) for child in spec.drafters]
    seen: dict[str, int] = {}
    for member in members:  # statistics are kept per name: make names unique
        count = seen.get(member.name, 0)
        seen[member.name] = count + 1
        if count:
            member.name = f"{member.name}#{count + 1}"
    return ChainDrafter(members)
