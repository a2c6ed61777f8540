"""The verification rule: which drafted tokens the target keeps, and the one token it adds.

Pure tensor functions. Each returns device tensors (n accepted, next token) so that the engine
reads both back to the host in a single transfer per step.

Sampling (Leviathan et al. 2023, Chen et al. 2023): draft token x_i (drawn from q_i) is kept with
probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection the target's token is drawn from
norm(max(p_i - q_i, 0)); when all k are kept, a bonus token is drawn from p_{k+1}. The emitted
sequence then follows p exactly. A drafter with no probabilities (prompt lookup) is a point mass:
q_i = one-hot(x_i), which gives acceptance p_i(x_i) and the residual p_i with x_i removed.
"""

from __future__ import annotations

import torch


def greedy_verify(draft_ids: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature 0: keep the longest prefix that equals the target's argmax, then its argmax.

    draft_ids [k], target_logits [k+1, V] (row i scores the token after draft i-1).
    """
    choice = target_logits.argmax(dim=-1)
    k = draft_ids.shape[0]
    n_accepted = (choice[:k] == draft_ids).int().cumprod(dim=0).sum()
    return n_accepted, choice[n_accepted]


def accept_probabilities(
    draft_ids: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor
) -> torch.Tensor:
    """min(1, p_i(x_i) / q_i(x_i)) for each drafted x_i; q None means a point mass on x_i."""
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


def _draft_row(draft_ids: torch.Tensor, draft_probs: torch.Tensor | None, index: torch.Tensor, vocab: int) -> torch.Tensor:
    """q at position `index` (a device scalar); all zeros at index k (the bonus position)."""
    if draft_probs is None:
        ids = torch.cat([draft_ids, draft_ids.new_full((1,), -1)])
        return (torch.arange(vocab, device=draft_ids.device) == ids[index]).float()
    padded = torch.cat([draft_probs, draft_probs.new_zeros(1, vocab)])
    return padded[index]


def speculative_verify(
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature > 0: the rejection sampler. draft_probs [k, V] or None, target_probs [k+1, V]."""
    k = draft_ids.shape[0]
    vocab = target_probs.shape[-1]
    accept_p = accept_probabilities(draft_ids, draft_probs, target_probs)
    uniforms = torch.rand(k, generator=generator, device=target_probs.device)
    kept = (uniforms < accept_p).int()
    n_accepted = kept.cumprod(dim=0).sum()
    # one row is needed: the residual at the first rejection, or p_{k+1} when all were kept
    # (there q is all zero, so the residual is p itself)
    row = residual_distribution(target_probs[n_accepted], _draft_row(draft_ids, draft_probs, n_accepted, vocab))
    next_token = torch.multinomial(row, 1, generator=generator)[0]
    return n_accepted, next_token
