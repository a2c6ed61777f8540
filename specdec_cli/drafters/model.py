"""A draft model (a smaller model with the target's tokenizer) that drafts with its own KV cache:
a chain of k tokens, or a token tree grown level by level (EAGLE-2's dynamic tree)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import torch

from ..lm import make_lm
from ..models import check_tokenizers_match
from ..sampling import probabilities
from ..specs import DrafterSpec, SamplingSpec, TreeSpec
from ..tree import TreeAttention
from .base import Draft, DraftContext


@dataclass
class _Level:
    """The nodes drawn at one depth: their ids on the device, and per node its parent, its draft
    probability (None where not read), the product of those down its path, and q (sampling)."""

    ids: torch.Tensor
    parents: list[int]
    confidences: list[float | None]
    path_values: list[float]
    probs: torch.Tensor | None


class _Growth:
    """How far one proposal's tree grows: the node budget, and under tree: auto the rule that a
    node (or a child of it) is added only when its expected contribution pays for it."""

    def __init__(self, shape: TreeSpec, budget, drafter: str):
        self.shape = shape
        self.budget = budget if shape.auto else None
        self.auto = self.budget is not None
        self.drafter = drafter
        self.drawn = 0

    def room(self) -> int:
        return max(0, self.shape.nodes - self.drawn)

    def path_value(self, parent_value: float, confidence: float | None, depth: int) -> float:
        """A node's rank: its path's draft probability (EAGLE-2), or under tree: auto the chance
        that the target keeps its whole path (each node's acceptance calibrated online)."""
        if self.auto:
            return parent_value * self.budget.estimate(self.drafter, confidence, depth - 1)
        return parent_value * (confidence if confidence is not None else 1.0)

    def child_counts(self, frontier_values: list[float], top_values: list[list[float]], depth: int) -> list[int]:
        """Children for each frontier node, fixed from q alone before any is drawn (the acceptance
        rule's proof needs that): the level's most valuable (node, rank) pairs by path value, at
        most `width` of them and no more than an even share of the nodes left over the levels
        left, so that a budget reaches the tree's depth; under tree: auto only pairs that pay."""
        levels_left = self.shape.depth - depth + 1
        budget = min(self.shape.width, self.room(), max(1, self.room() // levels_left))
        if self.auto:
            budget = min(self.shape.width, self.room())
        pairs = sorted(
            ((self.path_value(value, top, depth), r, j)
             for r, value in enumerate(frontier_values) for j, top in enumerate(top_values[r])),
            key=lambda pair: (-pair[0], pair[1], pair[2]),
        )[:budget]
        counts = [0] * len(frontier_values)
        for value, r, _ in pairs:
            # their q is already computed: a child costs its verification only (expanding a node,
            # in `expand`, is what costs a draft forward)
            if not self.auto or self.budget.pays(self.drafter, value, drafts=False):
                counts[r] += 1
        return counts

    def expand(self, path_values: list[float]) -> list[int]:
        """Which of the newest level's nodes get children: all of them (at most `width`), the
        most valuable first; under tree: auto only those whose first child is expected to pay."""
        order = sorted(range(len(path_values)), key=lambda i: -path_values[i])[: self.shape.width]
        if not self.auto:
            return order
        mean = self.budget.policy.record(self.drafter).mean_acceptance()
        return [i for i in order if self.budget.pays(self.drafter, path_values[i] * mean)]


class ModelDrafter:
    """Drafts with a draft LM, recording the q each token was sampled from.

    A tree grows one level per draft forward: the chosen nodes of the newest level (the most
    probable by cumulative draft probability; under tree: auto those expected to pay) are fed
    together, each seeing the committed prefix and its own ancestors (a 4D mask), and each gets
    its most probable children (temperature 0) or children sampled i.i.d. from its q (above 0: the
    acceptance rule's proof needs independent draws and a child count fixed before drawing them).
    A chain is the tree of width 1: one node a level, fed like any token.

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
        self.committed = 0  # committed tokens, = lm.length + len(pending)
        self.slot_of: dict[int, int] | None = None  # the last proposal's nodes that were fed, and their slots

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
        self.slot_of = None
        self.committed = int(ids.shape[0])

    # --- drafting
    def propose(self, shape: TreeSpec, budget=None) -> Draft | None:
        """A chain (shape.width 1) or a tree within `shape`. With a budget, a chain stops when one
        more token no longer pays (k: auto), a tree expands only the nodes that pay (tree: auto)."""
        read_values = shape.width > 1 or budget is not None  # a plain chain never waits for the device
        grow = _Growth(shape, budget if not shape.is_chain else None, self.name)
        logits = self.lm.forward(self.pending, keep=1)
        self.pending = self.pending[:0]
        self.base = self.lm.length  # the first speculative slot
        self.slot_of = {}
        levels: list[_Level] = []
        frontier, frontier_values = [-1], [1.0]  # the nodes whose children are drawn next (-1: the root)
        for depth in range(1, shape.depth + 1):
            level = self._draw(logits, frontier, frontier_values, grow, depth, read_values)
            first = grow.drawn
            grow.drawn += len(level.parents)
            if not level.parents:
                break
            levels.append(level)
            if depth == shape.depth or grow.drawn >= shape.nodes:
                break
            if budget is not None and shape.is_chain:  # k: auto, as ever: one more token while it pays
                chosen = [0] if budget.allows_more(self.name, level.confidences[0]) else []
            else:
                chosen = grow.expand(level.path_values)
            if not chosen:
                break
            logits = self._feed(levels, [first + i for i in chosen], depth)
            frontier = [first + i for i in chosen]
            frontier_values = [level.path_values[i] for i in chosen]
        return self._draft(levels) if levels else None

    def _draw(self, logits, frontier, frontier_values, grow: "_Growth", depth: int, read_values: bool) -> _Level:
        """Children of every frontier node (row r of `logits` scores the token after frontier[r]):
        how many is settled from q alone, then they are taken (top ones at temperature 0) or
        drawn i.i.d. from q."""
        width = grow.shape.width
        if self.sampling.greedy and width == 1 and not read_values:
            ids = logits.argmax(dim=-1)[: grow.room()]
            return _Level(ids, list(frontier[: len(ids)]), [None] * len(ids), list(frontier_values[: len(ids)]), None)
        q = None if self.sampling.greedy else probabilities(logits, self.sampling)
        top_values, top_ids = (torch.softmax(logits.float(), dim=-1) if q is None else q).topk(width, dim=-1)
        if q is None:
            ids, confidences = top_ids, top_values
        else:
            ids = torch.multinomial(q, width, replacement=True, generator=self.generator)
            confidences = q.gather(1, ids)
        # a plain chain takes one child without reading q back (no device sync)
        tops = top_values.tolist() if width > 1 or grow.auto else [[1.0]] * len(frontier)
        counts = grow.child_counts(frontier_values, tops, depth)
        rows = [r for r, count in enumerate(counts) for _ in range(count)]
        columns = [j for count in counts for j in range(count)]
        index = (torch.tensor(rows, dtype=torch.long), torch.tensor(columns, dtype=torch.long))
        values = confidences[index].tolist() if read_values else [None] * len(rows)
        return _Level(
            ids[index],
            [frontier[r] for r in rows],
            values,
            [grow.path_value(frontier_values[r], v, depth) for r, v in zip(rows, values)],
            None if q is None else q[index[0]],
        )

    def _feed(self, levels: list[_Level], nodes: list[int], depth: int) -> torch.Tensor:
        """One draft forward over the chosen nodes of the newest level; their children's logits."""
        level = levels[-1]
        first = sum(len(lv.parents) for lv in levels[:-1])
        chosen = [node - first for node in nodes]
        ids = level.ids[chosen[0] : chosen[0] + 1] if len(chosen) == 1 else level.ids[torch.tensor(chosen)]
        parent = level.parents[chosen[0]]
        continues_chain = len(chosen) == 1 and self.slot_of.get(parent, self.base - 1) == self.lm.length - 1
        tree = None if continues_chain else self._attention(levels, nodes, depth)
        start = self.lm.length
        logits = self.lm.forward(ids, keep=len(nodes), tree=tree)
        for offset, node in enumerate(nodes):
            self.slot_of[node] = start + offset
        return logits

    def _attention(self, levels: list[_Level], nodes: list[int], depth: int) -> TreeAttention:
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

    def _draft(self, levels: list[_Level]) -> Draft:
        parents = tuple(p for lv in levels for p in lv.parents)
        confidences = tuple(c for lv in levels for c in lv.confidences)
        probs = None if self.sampling.greedy else torch.cat([lv.probs for lv in levels])
        return Draft(
            torch.cat([lv.ids for lv in levels]).to(self.out_device),
            probs,
            self.name,
            parents=parents,
            confidences=None if all(c is None for c in confidences) else confidences,
        )

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
    model = context.load_model(spec.model, spec.options.get("quantize"))
    draft_tokenizer = context.load_tokenizer(spec.model)
    check_tokenizers_match(context.tokenizer, draft_tokenizer, context.target_name, spec.model.model)
    if spec.options.get("quantize"):  # int8 Linear layers are torch.ao ops, which inductor does not compile
        context = replace(context, compile="off")
    return ModelDrafter(model, context, name="model")
