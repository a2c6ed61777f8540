"""The acceptance rule: which drafted nodes the target keeps, and the one token it adds.

A draft is a tree (tree.py; a chain is the tree whose parents are the previous nodes). Row 0 of
the target's output scores the token after the root (the last committed token), row i + 1 the
token after node i. From each row the target makes its own choice (sampling.choose): the argmax
at temperature 0, above it argmax(p / e) with the noise of that row's position, a draw from p. A
drafted node is kept when it equals the choice at its parent's row; the kept nodes form one path
from the root, and the token added is the choice at the row where the path ends.

So every token emitted is the token the target would have chosen at that position with no draft
at all: exact at any temperature, and the same text whatever was drafted (drafts decide only how
many tokens one target forward yields). All of it is computed on the device: the engine reads
(n accepted, end node, next token) back in a single transfer per step.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..primitives.tree import ancestry, is_chain


def _row_shapes(parents: Sequence[Sequence[int]], m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, padded to m nodes: (each node's parent's row of choices [B, m], its lineage
    [B, m, m]: [b, i, j] where node j is node i or an ancestor). A pad node is its own parent-less
    lineage and is never accepted (the caller masks it). Chains, the common case, need no loop."""
    rows = len(parents)
    if all(is_chain(p) for p in parents):
        lineage = torch.ones(m, m, dtype=torch.bool).tril_().expand(rows, m, m)
        return torch.arange(m).expand(rows, m), lineage
    parent_rows = torch.zeros(rows, m, dtype=torch.long)
    lineage = torch.eye(m, dtype=torch.bool).repeat(rows, 1, 1)
    for b, row in enumerate(parents):
        if row:
            parent_rows[b, : len(row)] = torch.tensor(row).add_(1)
            lineage[b, : len(row), : len(row)] = ancestry(row)
    return parent_rows, lineage


def accept_rows(
    draft_ids: torch.Tensor, parents: Sequence[Sequence[int]], choices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The acceptance rule for B rows at once: (n accepted [B], end node [B] (-1: the root), next
    token [B]). draft_ids [B, m]: row b's nodes first, then anything; parents[b]: row b's tree
    (len(parents[b]) <= m); choices [B, m + 1]: the target's token at each row of the verify.

    A drafted node is kept when it equals the choice at its parent's row; a row's accepted nodes
    whose ancestors are all accepted spell one path (a row's choice is one token), and the deepest
    of them ends it."""
    rows, m = draft_ids.shape
    device = choices.device
    if m == 0:
        zero = torch.zeros(rows, dtype=torch.long, device=device)
        return zero, zero - 1, choices[:, 0]
    parent_rows, lineage = (t.to(device, non_blocking=True) for t in _row_shapes(parents, m))
    real = torch.arange(m) < torch.tensor([len(p) for p in parents])[:, None]
    ok = (draft_ids.to(device) == choices.gather(1, parent_rows)) & real.to(device, non_blocking=True)
    on_path = ~(lineage & ~ok[:, None, :]).any(dim=2)
    depth = torch.where(on_path, lineage.sum(dim=2), 0)
    n_accepted = depth.max(dim=1).values
    end = torch.where(n_accepted > 0, depth.argmax(dim=1), -1)
    return n_accepted, end, choices.gather(1, (end + 1)[:, None])[:, 0]
