"""The acceptance rule: which drafted nodes the target keeps, and the one token it adds.

A draft is a tree (tree.py; a chain is the tree whose parents are the previous nodes). Row 0 of
the target's output scores the token after the root (the last committed token), row i + 1 the
token after node i. Each rule decides, for every row, which child (if any) the target accepts;
the accepted path runs from the root through accepted children, and the token added is drawn at
the row where it ends. All of it is computed on the device: the engine reads (n accepted, end
node, next token) back in a single transfer per step.

Temperature 0: a child is accepted when it equals the target's argmax at its parent.

Temperature > 0: recursive rejection sampling over a node's children in the order drafted
(SpecInfer's multi-step speculative sampling; one child is Leviathan et al.'s rule). Child c_j was
drawn from q_j (its row of the draft's probabilities; a drafter with none proposes deterministic
guesses, q_j = one-hot(c_j)). Start from r_0 = p. Child c_j is accepted with probability
min(1, r_{j-1}(c_j) / q_j(c_j)); if rejected, r_j = norm(max(r_{j-1} - q_j, 0)). If every child is
rejected, the token is drawn from the last r. Exact: one rejection step with target r and proposal
q_j emits c_j or, on rejection, a draw from norm(max(r - q_j, 0)), and the whole step then follows
r (Leviathan et al., Theorem 1), PROVIDED the rejection branch draws from that residual; the rest
of the siblings are that draw, so by induction from the last (a plain draw from r_m) each row's
token follows p. The proof needs each c_j to be drawn from q_j independently of the others and
of the target, given the tree's shape up to its parent: drafters sample a node's children i.i.d.
and never prune by their values (drafters/model.py). For deterministic children the rule is
sibling elimination: accept c_j with probability p'(c_j), p' = p without the rejected siblings.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .tree import ancestry, children_table


def accept_probabilities(
    draft_ids: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor
) -> torch.Tensor:
    """min(1, p_i(x_i) / q_i(x_i)) for each drafted x_i, row i of p against row i of q; q None
    means a point mass on x_i."""
    rows = torch.arange(draft_ids.shape[0], device=draft_ids.device)
    p_x = target_probs[rows, draft_ids]
    if draft_probs is None:
        return p_x
    q_x = draft_probs[rows, draft_ids]
    return torch.where(q_x > 0, (p_x / q_x.clamp_min(1e-30)).clamp(max=1.0), torch.ones_like(p_x))


def residual_distribution(target_row: torch.Tensor, draft_row: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)); where that is all zero (p == q up to rounding) p itself."""
    residual = (target_row - draft_row).clamp_min(0.0)
    total = residual.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, residual / total.clamp_min(1e-30), target_row)


def _end_of_path(ok: torch.Tensor, parents: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """From ok[i] (node i is the child accepted at its parent): (the accepted path's length, its
    last node, -1 for the root). Accepted nodes form one path: a row accepts at most one child."""
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


def _parent_rows(parents: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(parents, dtype=torch.long).add_(1).to(device, non_blocking=True)


def accept_greedy(
    draft_ids: torch.Tensor, parents: Sequence[int], target_logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Temperature 0: (n accepted, end node, next token). draft_ids [m], target_logits [m + 1, V]."""
    choice = target_logits.argmax(dim=-1)
    ok = draft_ids == choice[_parent_rows(parents, choice.device)]
    n_accepted, end = _end_of_path(ok, parents)
    return n_accepted, end, choice[end + 1]


def _proposal(draft_ids: torch.Tensor, draft_probs: torch.Tensor | None, nodes: torch.Tensor, vocab: int) -> torch.Tensor:
    """The distributions the given nodes were drawn from [len(nodes), V] (one-hot where the drafter has none)."""
    if draft_probs is None:
        return torch.nn.functional.one_hot(draft_ids[nodes], vocab).float()
    return draft_probs[nodes]


def accept_sampled(
    draft_ids: torch.Tensor,
    parents: Sequence[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Temperature > 0: (n accepted, end node, next token) by recursive rejection sampling.

    draft_probs [m, V] (row i: the q node i was drawn from) or None; target_probs [m + 1, V].
    The tree's shape is on the host, so the loops below are over sibling ranks (a few), and only
    rows with a later sibling to judge carry a residual.
    """
    m = len(parents)
    device, vocab = target_probs.device, target_probs.shape[-1]
    table = children_table(parents)
    counts = (table >= 0).sum(dim=1).tolist()
    uniforms = torch.rand(m, generator=generator, device=device)
    accepted = torch.full((m + 1,), -1, dtype=torch.long, device=device)
    residuals: dict[int, torch.Tensor] = {}  # row -> r after its rejected children so far
    for rank in range(table.shape[1] if m else 0):
        rows = [row for row in range(m + 1) if counts[row] > rank]
        child = table[rows, rank].to(device, non_blocking=True)
        r = target_probs[rows] if rank == 0 else torch.stack([residuals[row] for row in rows])
        q = _proposal(draft_ids, draft_probs, child, vocab)
        ratio = accept_probabilities(draft_ids[child], q, r)
        active = accepted[rows] < 0
        take = active & (uniforms[child] < ratio)
        accepted[rows] = torch.where(take, child, accepted[rows])
        for i, row in enumerate(rows):
            if counts[row] > rank + 1:  # a later sibling is judged against the residual
                residuals[row] = torch.where(active[i] & ~take[i], residual_distribution(r[i], q[i]), r[i])
    ok = accepted[_parent_rows(parents, device)] == torch.arange(m, device=device)
    n_accepted, end = _end_of_path(ok, parents)
    # the row where the path ends rejected all its children (or has none): draw from what is left
    row = target_probs[end + 1]
    children = table.to(device, non_blocking=True)[end + 1]
    for rank in range(table.shape[1] if m else 0):
        node = children[rank]
        q = _proposal(draft_ids, draft_probs, node.clamp_min(0).view(1), vocab)[0]
        row = torch.where(node >= 0, residual_distribution(row, q), row)
    next_token = torch.multinomial(row, 1, generator=generator)[0]
    return n_accepted, end, next_token
