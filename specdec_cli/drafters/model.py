"""A draft model (a smaller model with the target's tokenizer) that drafts with its own KV cache:
a chain of k tokens, or a token tree grown level by level (EAGLE-2's dynamic tree). A draft with
another tokenizer: other_vocab.py."""

from __future__ import annotations

from typing import Sequence

import torch

from ..models.pair_checks import check_tokenizers_match
from ..primitives.sampling import PositionNoise
from ..primitives.tree import TreeAttention
from ..runtime.lm import LM, make_lm
from ..specs import DrafterSpec, SamplingSpec, TreeSpec
from .base import Draft, DraftContext, Drafter
from .growth import Level, TreeGrower


class ModelDrafter(TreeGrower, Drafter):
    """Drafts with a draft LM.

    A tree grows one level per draft forward: the chosen nodes of the newest level (the most
    probable by cumulative draft probability; under tree: auto those expected to pay) are fed
    together, each seeing the committed prefix and its own ancestors (a 4D mask), and each gets
    its best guesses as children (TreeGrower: top q at temperature 0, top q / e above it).
    A chain is the tree of width 1: one node a level, fed like any token.

    The cache plus `pending` always spell the committed sequence: tokens the draft has not seen yet
    (the target's correction or bonus, and after a full acceptance the last draft) wait in
    `pending` and go in with the next proposal's first forward, so no forward is spent on catch-up.
    """

    def __init__(
        self, model: torch.nn.Module, context: DraftContext, name: str = "model", separate_model: bool = True,
        lm: LM | None = None,
    ):
        """`separate_model` False: `model` is a view of the target (early exit) or a head over it, not
        a draft model of its own. `lm`: the LM to draft with (default: `model` behind make_lm)."""
        self.name = name
        self.lm = lm if lm is not None else make_lm(model, context.vocab, context.compile)
        self.draft_model = model if separate_model else None
        self.out_device = context.device
        self.pending = torch.empty(0, dtype=torch.long)
        self.committed = 0  # committed tokens, = lm.length + len(pending)
        self.slot_of: dict[int, int] | None = None  # the last proposal's nodes that were fed, and their slots

    def reserve(self, positions: int) -> None:
        """Room in a static cache for a generation of `positions` tokens (drafts included)."""
        self.lm.reserve(positions)

    def warmup(self) -> None:
        """Compile the draft's steps ahead: it reads one new token a forward, two after a full acceptance."""
        self.lm.warmup([(1, 1), (2, 1)])

    def begin(self, prompt_ids: torch.Tensor, sampling: SamplingSpec, noise: PositionNoise | None) -> None:
        self.sampling = sampling
        self.noise = noise
        ids = prompt_ids.to(self.lm.device)
        self.lm.reset()
        self.lm.prefill(ids[:-1])
        self.pending = ids[-1:]
        self.slot_of = None
        self.committed = int(ids.shape[0])

    # --- drafting
    def propose(self, shape: TreeSpec, budget=None) -> Draft | None:
        """A chain or a tree within `shape` (TreeGrower.grow); the first forward reads what the
        draft has not seen yet of the committed sequence."""
        logits = self.lm.forward(self.pending, keep=1)
        self.pending = self.pending[:0]
        self.base = self.lm.length  # the first speculative slot
        self.slot_of = {}
        return self.grow(shape, budget, self._scores(logits), self._feed)

    def _scores(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft's logits over the target's ids (a draft with another vocabulary maps them)."""
        return logits

    def _feed(self, levels: list[Level], nodes: list[int], depth: int) -> torch.Tensor:
        """One draft forward over the chosen nodes of the newest level; their children's logits."""
        level = levels[-1]
        first = sum(len(lv.parents) for lv in levels[:-1])
        chosen = [node - first for node in nodes]
        ids = level.ids[chosen[0] : chosen[0] + 1] if len(chosen) == 1 else level.ids[torch.tensor(chosen)]
        parent = level.parents[chosen[0]]
        continues_chain = len(chosen) == 1 and self.slot_of.get(parent, self.base - 1) == self.lm.length - 1
        tree = None if continues_chain else self._attention(levels, nodes, depth)
        start = self.lm.length
        logits = self._forward_nodes(levels, nodes, ids, tree)
        for offset, node in enumerate(nodes):
            self.slot_of[node] = start + offset
        return logits

    def _forward_nodes(self, levels: list[Level], nodes: list[int], ids: torch.Tensor, tree) -> torch.Tensor:
        """The draft forward over the chosen nodes (a head drafter pairs each with its parent's output)."""
        return self.lm.forward(ids, keep=len(nodes), tree=tree)

    def _attention(self, levels: list[Level], nodes: list[int], depth: int) -> TreeAttention:
        parents = [p for lv in levels for p in lv.parents]
        span = self.lm.length - self.base + len(nodes)
        visible = torch.zeros(len(nodes), span, dtype=torch.bool)
        for row, node in enumerate(nodes):
            visible[row, self.lm.length - self.base + row] = True
            ancestor = parents[node]
            while ancestor >= 0:
                visible[row, self.slot_of[ancestor] - self.base] = True
                ancestor = parents[ancestor]
        positions = torch.full((len(nodes),), self.base - 1 + depth, dtype=torch.long)
        return TreeAttention(self.base, positions, visible)

    def accept(self, new_tokens: Sequence[int], path: Sequence[int]) -> None:
        """Keep the accepted nodes this cache holds (moved next to the committed prefix); the rest
        of the committed tokens wait in `pending`."""
        if self.slot_of is not None:
            fed = [self.slot_of[node] for node in path if node in self.slot_of]
            self.lm.keep_path(self.base, fed)
            new_tokens = list(new_tokens)[len(fed) :]
        tail = torch.tensor(list(new_tokens), dtype=torch.long, device=self.lm.device)
        self.pending = torch.cat([self.pending, tail]) if self.pending.numel() else tail
        self.committed = self.lm.length + self.pending.numel()
        self.slot_of = None


def build(spec: DrafterSpec, context: DraftContext) -> ModelDrafter:
    """A draft sharing the target's tokenizer (vocab: shared); model_choice.py picks the rule."""
    model = context.load_model(spec.model)
    draft_tokenizer = context.load_tokenizer(spec.model)
    check_tokenizers_match(context.tokenizer, draft_tokenizer, context.target_name, spec.model.model)
    return ModelDrafter(model, context, name="model")
