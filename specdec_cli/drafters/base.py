"""The Drafter protocol: begin(prompt) / propose(k) -> Draft / accept(new tokens)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from ..specs import SamplingSpec


@dataclass
class Draft:
    """Drafted ids [m] (on the target's device) and, for drafters that have them, q [m, V].

    `probs` None means a point mass on each drafted id (prompt lookup), or greedy drafting where
    the target checks argmax matches and q is not needed.
    """

    token_ids: torch.Tensor
    probs: torch.Tensor | None
    drafter: str

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass(frozen=True)
class DraftContext:
    """What every drafter is built from."""

    target: torch.nn.Module
    tokenizer: object
    vocab: int  # ids that are real tokens; q is cut or padded to this width
    device: torch.device  # where drafted ids must end up (the target's input device)
    load_model: object  # callable(ModelSpec, quantize) -> nn.Module, so drafters share the profile's loading
    load_tokenizer: object  # callable(ModelSpec) -> tokenizer
    target_name: str
    compile: str = "off"  # a draft model's steps: "on" static cache and compiled steps (lm.make_lm)


class DraftBudget(Protocol):
    def allows_more(self, drafter: str, confidence: float | None) -> bool:
        """Given the confidence (max q, or None if the drafter has none) of the token `drafter`
        just drafted: draft another one?"""


class Drafter(Protocol):
    name: str
    # the separate draft model this drafter runs (one transformers can take as an assistant);
    # None for drafters without one of their own (prompt lookup, the target's own layers)
    draft_model: torch.nn.Module | None

    def begin(self, prompt_ids: torch.Tensor, sampling: SamplingSpec, seed: int) -> None:
        """Start a new sequence from the prompt (prefill a draft model's cache); `seed` for its sampling."""

    def propose(self, k: int, budget: "DraftBudget | None" = None) -> Draft | None:
        """Up to k tokens that continue the committed sequence; None when there is no guess.

        `budget` (adaptive k) is asked after each drafted token whether drafting one more pays.
        """

    def accept(self, new_tokens: Sequence[int], n_from_draft: int) -> None:
        """The tokens committed this step: `n_from_draft` accepted drafts of this drafter's
        proposal (0 if it did not propose), then the target's own token(s)."""
