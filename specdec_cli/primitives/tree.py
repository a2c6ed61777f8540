"""Token trees: the shape of a draft, and the attention that lets one forward score every branch.

A draft is a tree of nodes 0..m-1 given by `parents` (a node's parent's index, -1 for the root,
which is the last committed token). Parents come before their children. A chain is the tree whose
every parent is the node before it: [-1, 0, 1, ...]. Node i sits at depth 1 + depth(parent), and
is scored at position (root position + depth): every branch continues the same committed prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


def chain_parents(m: int) -> tuple[int, ...]:
    return tuple(range(-1, m - 1))


def is_chain(parents: Sequence[int]) -> bool:
    return all(parent == i - 1 for i, parent in enumerate(parents))


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node (a root's child is at depth 1)."""
    out: list[int] = []
    for parent in parents:
        out.append(1 if parent < 0 else out[parent] + 1)
    return out


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """The nodes from the root's child down to `node` (empty for the root, -1)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def ancestry(parents: Sequence[int]) -> torch.Tensor:
    """Bool [m, m]: [i, j] is True where node j is node i or one of its ancestors."""
    m = len(parents)
    seen = torch.zeros(m, m, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            seen[i] = seen[parent]
        seen[i, i] = True
    return seen


def row_block(parents: Sequence[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch row's verify of the root and a tree's nodes, padded to `width` columns: (visible
    [width, width] bool, offsets [width] long). The root and every node see the root and their own
    ancestors; a node sits `depth` positions after the root. Pads see everything before them and
    repeat the last node's offset."""
    m = len(parents)
    visible = torch.ones(width, width, dtype=torch.bool).tril_()
    visible[1 : 1 + m, 1 : 1 + m] = ancestry(parents)
    offsets = torch.zeros(width, dtype=torch.long)
    offsets[1 : 1 + m] = torch.tensor(depths(parents), dtype=torch.long)
    offsets[1 + m :] = offsets[m]
    return visible, offsets


@dataclass(frozen=True)
class TreeAttention:
    """How the n tokens of one forward attend when they are branches of a tree, not a sequence.

    Slots before `base` hold the committed prefix, which every token sees. Among the speculative
    slots base .. base + span - 1 (the new tokens are the last n of them), token i sees the slots
    where `visible[i]` is True. `positions` are the tokens' position ids (prefix length + depth).
    """

    base: int
    positions: torch.Tensor  # long [n]
    visible: torch.Tensor  # bool [n, span]

    @staticmethod
    def for_nodes(base: int, parents: Sequence[int], root_position: int, with_root: bool) -> "TreeAttention":
        """The target's verify: the root (the last committed token, at slot `base`, if `with_root`)
        then every node, each seeing the root and its own ancestors."""
        tree = ancestry(parents)
        node_depths = torch.tensor(depths(parents), dtype=torch.long)
        if not with_root:
            return TreeAttention(base, root_position + node_depths, tree)
        m = len(parents)
        visible = torch.zeros(m + 1, m + 1, dtype=torch.bool)
        visible[:, 0] = True
        visible[1:, 1:] = tree
        positions = torch.cat([torch.tensor([root_position]), root_position + node_depths])
        return TreeAttention(base, positions, visible)


def additive_mask(
    rows: int, columns: int, start: int, tree: TreeAttention | None, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A 4D additive mask [1, 1, rows, columns] for a forward whose first token goes to slot `start`:
    0 where a token attends, the dtype's minimum where it does not (finite, so that no row is
    ever all -inf). Without a tree, and for rows past the tree's tokens (pads), it is causal."""
    slots = torch.arange(columns, device=device)
    row_slots = torch.arange(start, start + rows, device=device)
    allowed = slots[None, :] <= row_slots[:, None]
    if tree is not None:
        n, span = tree.visible.shape
        allowed[:n, tree.base : tree.base + span] = tree.visible.to(device, non_blocking=True)
    mask = torch.zeros(rows, columns, dtype=dtype, device=device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min).view(1, 1, rows, columns)
