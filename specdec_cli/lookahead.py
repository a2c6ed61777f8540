"""How many tokens to draft each step: a fixed k, or `k: auto`.

`k: auto` stops drafting when one more token no longer pays for itself, judged from what this run
has measured. After i drafted tokens whose acceptance is estimated at a_1..a_i (calibrated, per
drafter, from the draft's confidence max q against what the target actually kept; for a drafter
with no confidence, such as prompt lookup, from how often each draft position was kept), one more draft
token adds P = a_1 * ... * a_i * a_next expected tokens and costs t_draft + t_verify_per_token
seconds. At the current throughput R (tokens/s) a token is worth 1/R seconds, so drafting goes on
while  P >= (t_draft + t_verify_per_token) * R.  This is the per-step form of the analytic model
of Leviathan et al. (tokens per step (1 - a^(k+1)) / (1 - a) against cost k*c + v(k)), with the
confidence-dependent acceptance of DISCO / SpecDec++ and the online costs of the actual machine.
Until a few steps are measured the profile's `adaptive.threshold` stands in for the right side.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .stats import judged_drafts

BINS = 10
WARMUP_STEPS = 3
PRIOR_WEIGHT = 2.0  # pseudo-counts pulling a sparse confidence bin toward the drafter's mean


class FixedLookahead:
    def __init__(self, k: int):
        self.k = k

    def plan(self) -> tuple[int, None]:
        return self.k, None

    def observe(self, *args, **kwargs) -> None:
        pass


@dataclass
class _DrafterRecord:
    """What one drafter's drafts have done so far, counted only where the target really judged them
    (up to and including the first rejection of each step), so every rate is conditional on the
    drafts before it having been kept."""

    bin_judged: list[float] = field(default_factory=lambda: [0.0] * BINS)
    bin_kept: list[float] = field(default_factory=lambda: [0.0] * BINS)
    position_judged: list[float] = field(default_factory=list)
    position_kept: list[float] = field(default_factory=list)
    judged: int = 0
    kept: int = 0
    drafted: int = 0
    draft_seconds: float = 0.0

    def mean_acceptance(self) -> float:
        return (self.kept + 0.7 * PRIOR_WEIGHT) / (self.judged + PRIOR_WEIGHT)

    def by_confidence(self, confidence: float) -> float:
        b = min(int(confidence * BINS), BINS - 1)
        return (self.bin_kept[b] + PRIOR_WEIGHT * self.mean_acceptance()) / (self.bin_judged[b] + PRIOR_WEIGHT)

    def by_position(self, position: int) -> float:
        """For drafters with no confidence of their own (prompt lookup): acceptance at this position."""
        if position >= len(self.position_judged):
            return self.mean_acceptance()
        prior = self.mean_acceptance()
        return (self.position_kept[position] + PRIOR_WEIGHT * prior) / (self.position_judged[position] + PRIOR_WEIGHT)

    def seconds_per_draft(self) -> float:
        return self.draft_seconds / self.drafted if self.drafted else 0.0

    def record(self, confidences: list[float | None], drafted: int, accepted: int, seconds: float) -> None:
        self.drafted += drafted
        self.draft_seconds += seconds
        judged = judged_drafts(drafted, accepted)
        while len(self.position_judged) < judged:
            self.position_judged.append(0.0)
            self.position_kept.append(0.0)
        for position in range(judged):
            kept = position < accepted
            self.judged += 1
            self.kept += kept
            self.position_judged[position] += 1
            self.position_kept[position] += kept
            confidence = confidences[position] if position < len(confidences) else None
            if confidence is not None:
                b = min(int(confidence * BINS), BINS - 1)
                self.bin_judged[b] += 1
                self.bin_kept[b] += kept


class _StepBudget:
    """Asked by a drafter after each token: is one more worth drafting?"""

    def __init__(self, policy: "AdaptiveLookahead"):
        self.policy = policy
        self.p_all_kept = 1.0
        self.confidences: list[float | None] = []

    def allows_more(self, drafter: str, confidence: float | None) -> bool:
        record = self.policy.record(drafter)
        position = len(self.confidences)
        self.confidences.append(confidence)
        kept = record.by_position(position) if confidence is None else record.by_confidence(confidence)
        self.p_all_kept *= kept
        next_kept = record.by_position(position + 1) if confidence is None else record.mean_acceptance()
        return self.p_all_kept * next_kept >= self.policy.threshold(record)


class AdaptiveLookahead:
    def __init__(self, k_max: int, initial_threshold: float):
        self.k_max = k_max
        self.initial_threshold = initial_threshold
        self.records: dict[str, _DrafterRecord] = {}
        self.steps = 0
        self.emitted = 0
        self.step_seconds = 0.0
        # least squares of verify seconds on tokens verified: the slope is the cost per extra token
        self._n = self._sx = self._sy = self._sxx = self._sxy = 0.0

    def record(self, drafter: str) -> _DrafterRecord:
        return self.records.setdefault(drafter, _DrafterRecord())

    def plan(self) -> tuple[int, _StepBudget]:
        return self.k_max, _StepBudget(self)

    def verify_seconds_per_token(self) -> float:
        denominator = self._n * self._sxx - self._sx * self._sx
        if self._n < 2 or denominator <= 1e-12:
            return 0.0
        return max(0.0, (self._n * self._sxy - self._sx * self._sy) / denominator)

    def threshold(self, record: _DrafterRecord) -> float:
        if self.steps < WARMUP_STEPS or self.step_seconds <= 0:
            return self.initial_threshold
        throughput = self.emitted / self.step_seconds
        return (record.seconds_per_draft() + self.verify_seconds_per_token()) * throughput

    def observe(
        self,
        drafter: str | None,
        budget: _StepBudget | None,
        drafted: int,
        accepted: int,
        emitted: int,
        draft_seconds: float,
        verify_seconds: float,
        step_seconds: float,
    ) -> None:
        self.steps += 1
        self.emitted += emitted
        self.step_seconds += step_seconds
        x = drafted + 1
        self._n += 1
        self._sx += x
        self._sy += verify_seconds
        self._sxx += x * x
        self._sxy += x * verify_seconds
        if not drafter or not drafted:
            return
        self.record(drafter).record(budget.confidences if budget else [], drafted, accepted, draft_seconds)


def make_lookahead(k: int | str, k_max: int, threshold: float):
    return AdaptiveLookahead(k_max, threshold) if k == "auto" else FixedLookahead(int(k))
