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

from .tree import ancestry


def _end_of_path(ok: torch.Tensor, parents: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """From ok[i] (node i is the child accepted at its parent): (the accepted path's length, its
    last node, -1 for the root). A row's choice is one token, so the accepted nodes whose ancestors
    are all accepted spell one path (two equal siblings would spell the same tokens); the deepest
    of them ends it."""
    m = len(parents)
    if m == 0:
        zero = torch.zeros((), dtype=torch.long, device=ok.device)
        return zero, zero - 1
    lineage = ancestry(parents).to(ok.device, non_blocking=True)
    on_path = ~(lineage & ~ok[None, :]).any(dim=1)
    depth = torch.where(on_path, lineage.sum(dim=1), 0)
    n_accepted = depth.max()
    end = torch.where(n_accepted > 0, depth.argmax(), -1)
    return n_accepted, end


def accept(
    draft_ids: torch.Tensor, parents: Sequence[int], choices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(n accepted, end node, next token). draft_ids [m]; choices [m + 1]: the target's token at
    each row (row 0 the root's)."""
    parent_rows = torch.tensor(parents, dtype=torch.long).add_(1).to(choices.device, non_blocking=True)
    ok = draft_ids == choices[parent_rows]
    n_accepted, end = _end_of_path(ok, parents)
    return n_accepted, end, choices[end + 1]
