"""Growing a draft tree level by level (EAGLE-2's dynamic tree), shared by every drafter that
scores a level of children in one go: a draft model, a draft head over the target's features
(EAGLE), or heads that each score one depth (Medusa)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..constraints.matcher import RowMatcher, mask_logits
from ..primitives.device_calls import to_host
from ..primitives.sampling import PositionNoise, first_max, probabilities, race
from ..specs import SamplingSpec, TreeSpec
from .base import Draft


@dataclass
class Level:
    """The nodes drawn at one depth: their ids on the device, and per node its parent, its draft
    probability (None where not read) and the product of those down its path."""

    ids: torch.Tensor
    parents: list[int]
    confidences: list[float | None]
    path_values: list[float]


class Growth:
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
        """Children for each frontier node, from the top values of each one's q (rank j's value
        stands for its j-th guess): the level's most valuable (node, rank) pairs by path value, at
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
        most valuable first. Under tree: auto, one draft forward expands them together, so the
        nodes whose first child pays for its verification are expanded if, together, their
        first children also pay for that forward (none are, where they do not)."""
        order = sorted(range(len(path_values)), key=lambda i: -path_values[i])[: self.shape.width]
        if not self.auto:
            return order
        first_kept = self.budget.policy.record(self.drafter).first_child_acceptance()
        gains = {i: path_values[i] * first_kept for i in order}
        verify_bar = self.budget.bar(self.drafter, drafts=False)
        chosen = [i for i in order if gains[i] >= verify_bar]
        # together they pay for the one forward and the first child's verification (the bar of a
        # node that drafts), and each further node for its own child's verification
        needed = self.budget.bar(self.drafter) + (len(chosen) - 1) * verify_bar
        return chosen if chosen and sum(gains[i] for i in chosen) >= needed else []


class TreeGrower:
    """The growth loop. Subclasses set `name`, `sampling`, `noise` and `out_device`, and give
    `grow` the first level's logits and a `feed(levels, nodes, depth)` that returns the logits of
    the chosen nodes' children (row r: the token after nodes[r]), or None when it cannot go deeper.

    Each node's children are its best guesses: the most probable under q at temperature 0, above
    it the largest q / e with the target's noise e of that depth (the first is argmax(q / e), the
    target's own choice when q = p). A chain is the tree of width 1. Under a constraint (follow),
    each node's children are drawn from q restricted to what the constraint allows after its path,
    so that structured output's drafts are not cut (a host read of each level's tokens)."""

    name: str
    sampling: SamplingSpec
    noise: PositionNoise | None
    out_device: torch.device
    guide: RowMatcher | None = None

    def follow(self, constraint: RowMatcher | None) -> None:
        """Draw the next proposals' guesses within `constraint` (None: freely)."""
        self.guide = constraint

    def grow(self, shape: TreeSpec, budget, logits: torch.Tensor, feed: Callable) -> Draft | None:
        """A chain (shape.width 1) or a tree within `shape`. With a budget, a chain stops when one
        more token no longer pays (k: auto), a tree expands only the nodes that pay (tree: auto)."""
        read_values = shape.width > 1 or budget is not None  # a plain chain never waits for the device
        grow = Growth(shape, budget if not shape.is_chain else None, self.name)
        levels: list[Level] = []
        frontier, frontier_values = [-1], [1.0]  # the nodes whose children are drawn next (-1: the root)
        paths: dict[int, list[int]] = {-1: []}  # under a constraint: each node's tokens from the root
        for depth in range(1, shape.depth + 1):
            if self.guide is not None:
                logits = mask_logits(logits, self.guide.masks_after([paths[node] for node in frontier]))
            level = self._draw(logits, frontier, frontier_values, grow, depth, read_values)
            first = grow.drawn
            grow.drawn += len(level.parents)
            if not level.parents:
                break
            levels.append(level)
            if self.guide is not None:
                for i, (token, parent) in enumerate(zip(to_host(level.ids), level.parents)):
                    paths[first + i] = paths[parent] + [token]
            if depth == shape.depth or grow.drawn >= shape.nodes:
                break
            if budget is not None and shape.is_chain:  # k: auto, as ever: one more token while it pays
                chosen = [0] if budget.allows_more(self.name, level.confidences[0]) else []
            else:
                chosen = grow.expand(level.path_values)
            if self.guide is not None:  # nothing follows the end of a text the constraint allows
                chosen = [i for i in chosen if not self.guide.ends(paths[first + i])]
            if not chosen:
                break
            logits = feed(levels, [first + i for i in chosen], depth)
            if logits is None:
                break
            frontier = [first + i for i in chosen]
            frontier_values = [level.path_values[i] for i in chosen]
        return self._draft(levels) if levels else None

    def _draw(self, logits, frontier, frontier_values, grow: "Growth", depth: int, read_values: bool) -> Level:
        """Children of every frontier node (row r of `logits` scores the token after frontier[r]):
        how many is settled from q's top values, then each node's best guesses are taken."""
        width = grow.shape.width
        noise = None if self.sampling.greedy else self.noise.ahead([depth])  # one row: every node is at `depth`
        if width == 1 and not read_values:  # a plain chain: the first guess, nothing read back (no device sync)
            score = logits if noise is None else race(probabilities(logits, self.sampling), noise)
            ids = first_max(score)[: grow.room()]
            return Level(ids, list(frontier[: len(ids)]), [None] * len(ids), list(frontier_values[: len(ids)]))
        q = torch.softmax(logits.float(), dim=-1) if noise is None else probabilities(logits, self.sampling)
        top_values, ids = q.topk(width, dim=-1)
        if noise is not None:
            ids = race(q, noise).topk(width, dim=-1).indices
        confidences = q.gather(1, ids)
        read_tops = width > 1 or grow.auto
        if read_tops and read_values:  # both in one device -> host read: a sync a level, not two
            tops, guessed = to_host(torch.stack([top_values, confidences]))
        else:
            tops = to_host(top_values) if read_tops else [[1.0]] * len(frontier)
            guessed = to_host(confidences) if read_values else None
        counts = grow.child_counts(frontier_values, tops, depth)
        if self.guide is not None:  # no child the constraint forbids (q = 0: fewer allowed than `width`)
            counts = [min(count, sum(value > 0 for value in top)) for count, top in zip(counts, tops)]
        rows = [r for r, count in enumerate(counts) for _ in range(count)]
        columns = [j for count in counts for j in range(count)]
        index = (torch.tensor(rows, dtype=torch.long), torch.tensor(columns, dtype=torch.long))
        values = [guessed[r][c] for r, c in zip(rows, columns)] if guessed is not None else [None] * len(rows)
        return Level(
            ids[index],
            [frontier[r] for r in rows],
            values,
            [grow.path_value(frontier_values[r], v, depth) for r, v in zip(rows, values)],
        )

    def _draft(self, levels: list[Level]) -> Draft:
        parents = tuple(p for lv in levels for p in lv.parents)
        confidences = tuple(c for lv in levels for c in lv.confidences)
        return Draft(
            torch.cat([lv.ids for lv in levels]).to(self.out_device),
            self.name,
            parents=parents,
            confidences=None if all(c is None for c in confidences) else confidences,
        )
