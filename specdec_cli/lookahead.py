"""How many tokens to draft each step: a fixed k, or `k: auto`.

`k: auto` stops drafting when one more token no longer pays for itself, judged from what this run
has measured. After i drafted tokens whose acceptance is estimated at a_1..a_i (calibrated from
the draft's confidence max q, per drafter, against what the target actually kept), one more draft
token adds P = a_1 * ... * a_i * a_next expected tokens and costs t_draft + t_verify_per_token
seconds. At the current throughput R (tokens/s) a token is worth 1/R seconds, so drafting goes on
while  P >= (t_draft + t_verify_per_token) * R.  This is the per-step form of the analytic model
of Leviathan et al. (tokens per step (1 - a^(k+1)) / (1 - a) against cost k*c + v(k)), with the
confidence-dependent acceptance of DISCO / SpecDec++ and the online costs of the actual machine.
Until a few steps are measured the profile's `adaptive.threshold` stands in for the right side.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    bin_drafted: list[float] = field(default_factory=lambda: [0.0] * BINS)
    bin_accepted: list[float] = field(default_factory=lambda: [0.0] * BINS)
    drafted: int = 0
    accepted: int = 0
    draft_seconds: float = 0.0

    def mean_acceptance(self) -> float:
        return (self.accepted + 0.7 * PRIOR_WEIGHT) / (self.drafted + PRIOR_WEIGHT)

    def calibrated(self, confidence: float) -> float:
        b = min(int(confidence * BINS), BINS - 1)
        prior = self.mean_acceptance()
        return (self.bin_accepted[b] + PRIOR_WEIGHT * prior) / (self.bin_drafted[b] + PRIOR_WEIGHT)

    def seconds_per_draft(self) -> float:
        return self.draft_seconds / self.drafted if self.drafted else 0.0


class _StepBudget:
    """Asked by a drafter after each token: is one more worth drafting?"""

    def __init__(self, policy: "AdaptiveLookahead"):
        self.policy = policy
        self.p_all_kept = 1.0
        self.confidences: list[float] = []

    def allows_more(self, drafter: str, confidence: float) -> bool:
        record = self.policy.record(drafter)
        self.confidences.append(confidence)
        self.p_all_kept *= record.calibrated(confidence)
        return self.p_all_kept * record.mean_acceptance() >= self.policy.threshold(record)


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
        record = self.record(drafter)
        record.drafted += drafted
        record.accepted += accepted
        record.draft_seconds += draft_seconds
        for position, confidence in enumerate(budget.confidences if budget else ()):
            b = min(int(confidence * BINS), BINS - 1)
            record.bin_drafted[b] += 1
            record.bin_accepted[b] += position < accepted


def make_lookahead(k: int | str, k_max: int, threshold: float):
    return AdaptiveLookahead(k_max, threshold) if k == "auto" else FixedLookahead(int(k))
