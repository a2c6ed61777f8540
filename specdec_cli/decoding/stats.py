"""Decode statistics: one record per target forward is the raw data; every rate is derived from it.

acceptance rate        = accepted drafted tokens / drafted tokens
mean accepted length   = tokens emitted per target forward (tau), the correction or bonus included
alpha                  = accepted / judged drafts, where a step's drafts past its first rejection
                         were never judged: the per-token acceptance "a" of Leviathan et al., given
                         that the drafts before it were kept (its maximum-likelihood estimate)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .events import Prefilled, Verified


@dataclass(frozen=True)
class StepRecord:
    drafter: str | None
    drafted: int  # tokens verified beside the root: a chain's length, a tree's nodes
    accepted: int
    emitted: int
    judged: int | None = None  # drafts the target judged; None: a chain's (judged_drafts)
    depth: int | None = None  # the drafted line's length (per-position counts); None: drafted
    draft_seconds: float = 0.0  # the step's drafting
    forced: int = 0  # a constraint's forced tokens verified after the drafted ones (not in drafted)
    forced_kept: int = 0  # of them, those the target kept
    cut: int = 0  # drafted tokens the constraint cut before the verify
    mask_seconds: float = 0.0


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def _position_counts(steps: list[StepRecord], width: int) -> tuple[list[int], list[int]]:
    """Per draft position i: how often a token was drafted there, and how often it was kept."""
    drafted, accepted = [0] * width, [0] * width
    for step in steps:
        for i in range(step.drafted if step.depth is None else step.depth):
            drafted[i] += 1
            accepted[i] += i < step.accepted
    return drafted, accepted


def judged_drafts(drafted: int, accepted: int) -> int:
    """Drafts the target really judged in a chain: up to and including the first rejection."""
    return min(drafted, accepted + 1)


def _judged(step: StepRecord) -> int:
    return judged_drafts(step.drafted, step.accepted) if step.judged is None else step.judged


def alpha(steps: list[StepRecord]) -> float | None:
    """Accepted over judged: for a tree, over every sibling judged at each accepted node."""
    return _ratio(sum(s.accepted for s in steps), sum(_judged(s) for s in steps))


def _acceptance_summary(steps: list[StepRecord], width: int) -> dict[str, Any]:
    drafted, accepted = _position_counts(steps, width)
    total_drafted = sum(s.drafted for s in steps)
    total_accepted = sum(s.accepted for s in steps)
    return {
        "calls": sum(1 for s in steps if s.drafted),
        "drafted": total_drafted,
        "accepted": total_accepted,
        "acceptance_rate": _ratio(total_accepted, total_drafted),
        "per_position_acceptance": [_ratio(a, d) for a, d in zip(accepted, drafted)],
        "draft_seconds": sum(s.draft_seconds for s in steps),
    }


@dataclass
class DecodeStats:
    k: int | str
    k_limit: int
    prompt_tokens: int = 0
    steps: list[StepRecord] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0  # from the first step to the last, prefill excluded
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    constraint_complete: bool | None = None  # constrained: whether the text satisfies it (None: none)

    def observe(self, event: object) -> None:
        if isinstance(event, Prefilled):
            self.prompt_tokens = event.prompt_tokens
            self.prefill_seconds = event.seconds
        elif isinstance(event, Verified):
            judged = len(event.judged) if event.tree else None
            depth = len(event.drafted) if event.tree else None
            own = event.nodes - event.forced  # a constraint's forced tokens follow the drafter's (a chain)
            accepted = min(event.n_accepted, own)
            self.steps.append(StepRecord(event.drafter if own else None, own, accepted, len(event.emitted), judged,
                                         depth, event.draft_seconds, event.forced, event.n_accepted - accepted,
                                         event.cut, event.mask_seconds))
            self.decode_seconds += event.seconds

    # --- derived
    @property
    def new_tokens(self) -> int:
        return sum(s.emitted for s in self.steps)

    @property
    def target_forwards(self) -> int:
        return len(self.steps)

    @property
    def drafted(self) -> int:
        return sum(s.drafted for s in self.steps)

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.steps)

    @property
    def acceptance_rate(self) -> float | None:
        return _ratio(self.accepted, self.drafted)

    @property
    def alpha(self) -> float | None:
        return alpha(self.steps)

    @property
    def mean_accepted_length(self) -> float | None:
        return _ratio(self.new_tokens, self.target_forwards)

    @property
    def tokens_per_second(self) -> float | None:
        return _ratio(self.new_tokens, self.decode_seconds)

    @property
    def accept_length_histogram(self) -> list[int]:
        """Index n: how many target forwards kept exactly n drafted tokens."""
        histogram = [0] * (self.k_limit + 1)
        for s in self.steps:
            histogram[min(s.accepted, self.k_limit)] += 1
        return histogram

    @property
    def per_position_acceptance(self) -> list[float | None]:
        return _acceptance_summary(self.steps, self.k_limit)["per_position_acceptance"]

    @property
    def plain_steps(self) -> int:
        """Target forwards with nothing drafted (no guess, or no drafter expected to pay: k = 0)."""
        return sum(1 for s in self.steps if not s.drafted)

    def constraint_summary(self) -> dict[str, Any] | None:
        """What a constraint did (None where none ran): whether the text satisfies it, the forced
        tokens (drafted free) verified and kept, drafted tokens it cut, and its time per step."""
        if self.constraint_complete is None:
            return None
        mask_seconds = sum(s.mask_seconds for s in self.steps)
        return {
            "complete": self.constraint_complete,
            "forced_tokens": sum(s.forced for s in self.steps),
            "forced_kept": sum(s.forced_kept for s in self.steps),
            "cut_drafts": sum(s.cut for s in self.steps),
            "mask_seconds": mask_seconds,
            "mask_seconds_per_step": _ratio(mask_seconds, len(self.steps)),
        }

    @property
    def per_drafter(self) -> dict[str, dict[str, Any]]:
        names = sorted({s.drafter for s in self.steps if s.drafter})
        return {
            name: _acceptance_summary([s for s in self.steps if s.drafter == name], self.k_limit)
            for name in names
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "alpha": self.alpha,
            "mean_accepted_length": self.mean_accepted_length,
            "target_forwards": self.target_forwards,
            "plain_steps": self.plain_steps,
            "tokens_per_second": self.tokens_per_second,
            "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "accept_length_histogram": self.accept_length_histogram,
            "per_position_acceptance": self.per_position_acceptance,
            "per_drafter": self.per_drafter,
            **({"constraint": summary} if (summary := self.constraint_summary()) is not None else {}),
        }
