"""How much to draft each step: a fixed chain of k or tree, or `k: auto` / `tree: auto`.

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

The verify cost per token is the slope of verify time on tokens verified, fitted over recent steps
(older ones weigh less, so a slow start after compiling fades). A slope needs steps of different
widths: if the machine ran slow for a while just as drafts grew, the fit reads a steep slope, the
rule then drafts one token a step, and steps of one width can never correct it. So after
STALE_AFTER steps in a row of one width, a chain goes one token deeper than the rule asks (where
the draft forward alone would pay for it), which shows the fit what one more token costs.

`tree: auto` is the same rule per node (Sequoia's sizing, done online): a child is drafted when
its path probability (the product of its ancestors' calibrated acceptances) pays for one more
verified token, and a level is expanded when the first children it promises pay, together, for
the one draft forward that scores all of them (its cost is measured per forward, not per node;
a first child's acceptance is counted apart, since a tree's rejected siblings would make the
drafter's mean acceptance understate its main line). So the tree is as large as this machine's
v(n), the draft's cost and this pair's acceptance justify, within the profile's bounds.

Both observe each step's Verified event: which nodes the target judged, which it kept, and the
step's timings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..specs import TreeSpec
from .events import JudgedNode, Verified

BINS = 10
WARMUP_STEPS = 3
PRIOR_WEIGHT = 2.0  # pseudo-counts pulling a sparse confidence bin toward the drafter's mean
FORGET = 0.9  # a step's weight in the verify-cost fit decays by this each step (memory ~10 steps)
STALE_AFTER = 8  # steps of one width in a row: the fit has nothing fresh to tell one more token's cost by


class FixedLookahead:
    def __init__(self, shape: TreeSpec):
        self.shape = shape

    def plan(self) -> tuple[TreeSpec, None]:
        return self.shape, None

    def observe(self, event: Verified) -> None:
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
    first_judged: int = 0  # nodes that were their parent's first choice (a tree's main line)
    first_kept: int = 0
    drafted: int = 0
    levels: int = 0  # draft forwards: a chain runs one per token, a tree one per depth
    draft_seconds: float = 0.0

    def mean_acceptance(self) -> float:
        return (self.kept + 0.7 * PRIOR_WEIGHT) / (self.judged + PRIOR_WEIGHT)

    def first_child_acceptance(self) -> float:
        """The chance that a node's first child is kept, given the node was: what expanding it
        promises. A tree's mean acceptance is lower (most siblings are rejected), a chain's the same."""
        prior = self.mean_acceptance()
        return (self.first_kept + PRIOR_WEIGHT * prior) / (self.first_judged + PRIOR_WEIGHT)

    def by_confidence(self, confidence: float) -> float:
        b = min(int(confidence * BINS), BINS - 1)
        return (self.bin_kept[b] + PRIOR_WEIGHT * self.mean_acceptance()) / (self.bin_judged[b] + PRIOR_WEIGHT)

    def by_position(self, position: int) -> float:
        """For drafters with no confidence of their own (prompt lookup): acceptance at this position."""
        if position >= len(self.position_judged):
            return self.mean_acceptance()
        prior = self.mean_acceptance()
        return (self.position_kept[position] + PRIOR_WEIGHT * prior) / (self.position_judged[position] + PRIOR_WEIGHT)

    def seconds_per_forward(self) -> float:
        """What one more draft forward costs: a chain's token, or a whole level of a tree (its
        nodes go through the draft in one forward, which costs about what one token does)."""
        return self.draft_seconds / self.levels if self.levels else 0.0

    def record(
        self, judged: tuple[JudgedNode, ...], drafted: int, seconds: float, levels: int = 0
    ) -> None:
        """`judged`: every node the target judged this step; `levels`: the depths the draft spans (0: a chain, one per node)."""
        self.drafted += drafted
        self.levels += levels or drafted
        self.draft_seconds += seconds
        for confidence, position, kept, first in judged:
            self.first_judged += first
            self.first_kept += first and kept
            while len(self.position_judged) <= position:
                self.position_judged.append(0.0)
                self.position_kept.append(0.0)
            self.judged += 1
            self.kept += kept
            self.position_judged[position] += 1
            self.position_kept[position] += kept
            if confidence is not None:
                b = min(int(confidence * BINS), BINS - 1)
                self.bin_judged[b] += 1
                self.bin_kept[b] += kept


class _CostFit:
    """Least squares of verify seconds on tokens verified, each older step weighing FORGET times less."""

    def __init__(self):
        self.w = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def add(self, x: float, y: float) -> None:
        self.w, self.sx, self.sy, self.sxx, self.sxy = (
            FORGET * self.w + 1, FORGET * self.sx + x, FORGET * self.sy + y,
            FORGET * self.sxx + x * x, FORGET * self.sxy + x * y,
        )

    def slope(self) -> float:
        """Seconds per extra token verified; 0 until two widths are seen (and never below 0)."""
        spread = max(0.0, self.sxx / self.w - (self.sx / self.w) ** 2) if self.w else 0.0
        if spread <= 1e-12:
            return 0.0
        return max(0.0, (self.sxy / self.w - self.sx * self.sy / self.w ** 2) / spread)


class _StepBudget:
    """Asked by a drafter while it drafts: is one more token (chain) or node (tree) worth it?"""

    def __init__(self, policy: "AdaptiveLookahead"):
        self.policy = policy
        self.p_all_kept = 1.0
        self.confidences: list[float | None] = []
        self.explore = policy.slope_is_stale()  # a chain one token deeper than the rule asks

    def fresh(self) -> "_StepBudget":
        """A budget for another drafter's proposal in this step (a chain merging proposals)."""
        return _StepBudget(self.policy)

    def estimate(self, drafter: str, confidence: float | None, position: int) -> float:
        """The chance that a node is kept, given that its parent was: calibrated from its draft
        probability, or (no confidence) from how often this draft position has been kept."""
        record = self.policy.record(drafter)
        return record.by_position(position) if confidence is None else record.by_confidence(confidence)

    def bar(self, drafter: str, drafts: bool = True) -> float:
        """The expected tokens a node must add to pay for its verify cost and, where it needs a
        draft forward of its own (`drafts`), for that too; a tree's sibling rides along in a
        forward that is run anyway."""
        return self.policy.threshold(self.policy.record(drafter), drafts)

    def pays(self, drafter: str, expected_tokens: float, drafts: bool = True) -> bool:
        return expected_tokens >= self.bar(drafter, drafts)

    def allows_more(self, drafter: str, confidence: float | None) -> bool:
        """A chain: given the confidence of the token just drafted, draft another one?"""
        position = len(self.confidences)
        self.confidences.append(confidence)
        self.p_all_kept *= self.estimate(drafter, confidence, position)
        record = self.policy.record(drafter)
        next_kept = record.by_position(position + 1) if confidence is None else record.mean_acceptance()
        expected = self.p_all_kept * next_kept
        if self.pays(drafter, expected):
            return True
        # exploring: only where the verify cost is what stops it (the draft alone would pay)
        explore, self.explore = self.explore, False
        return explore and expected >= self.policy.threshold(record, drafts=True, verifies=False)


class AdaptiveLookahead:
    def __init__(self, shape: TreeSpec, initial_threshold: float):
        self.shape = shape  # the bounds: k_max for a chain, the largest tree for tree: auto
        self.initial_threshold = initial_threshold
        self.records: dict[str, _DrafterRecord] = {}
        self.steps = 0
        self.emitted = 0
        self.step_seconds = 0.0
        self.verify_fit = _CostFit()  # its slope: the cost of one more token verified
        self.width = 0  # tokens the last step verified, and how many steps in a row verified as many
        self.same_width_steps = 0

    def record(self, drafter: str) -> _DrafterRecord:
        return self.records.setdefault(drafter, _DrafterRecord())

    def plan(self) -> tuple[TreeSpec, _StepBudget]:
        return self.shape, _StepBudget(self)

    def verify_seconds_per_token(self) -> float:
        return self.verify_fit.slope()

    def slope_is_stale(self) -> bool:
        """Recent steps all verified about as many tokens: the fit cannot tell what one more costs."""
        return self.steps >= WARMUP_STEPS and self.same_width_steps >= STALE_AFTER

    def throughput(self) -> float:
        """Tokens emitted per second of steps so far (0 before any)."""
        return self.emitted / self.step_seconds if self.step_seconds > 0 else 0.0

    def threshold(self, record: _DrafterRecord, drafts: bool = True, verifies: bool = True) -> float:
        """The expected tokens a node must add to pay for its draft forward (`drafts`) and its
        share of the verify (`verifies`), at this run's throughput."""
        if self.steps < WARMUP_STEPS or self.step_seconds <= 0:
            return self.initial_threshold
        draft_seconds = record.seconds_per_forward() if drafts else 0.0
        verify_seconds = self.verify_seconds_per_token() if verifies else 0.0
        return (draft_seconds + verify_seconds) * self.throughput()

    def describe(self) -> str:
        """What the rule has measured so far and the bar a draft token must clear (for -v logs)."""
        rule = "k: auto" if self.shape.is_chain else "tree: auto"
        parts = [f"{rule} after {self.steps} steps: {self.throughput():.2f} tok/s",
                 f"verify +{1e3 * self.verify_seconds_per_token():.1f} ms a token"]
        for name, record in self.records.items():
            drafted = record.drafted / self.steps if self.steps else 0.0
            parts.append(
                f"{name}: {drafted:.2f} drafted a step, {1e3 * record.seconds_per_forward():.1f} ms a draft forward, "
                f"{record.mean_acceptance():.0%} kept, drafts on while P(kept) >= {self.threshold(record):.2f}"
            )
        return "; ".join(parts)

    def observe(self, event: Verified) -> None:
        self.steps += 1
        self.emitted += len(event.emitted)
        self.step_seconds += event.seconds
        width = event.nodes + 1
        self.verify_fit.add(width, event.verify_seconds)
        self.same_width_steps = self.same_width_steps + 1 if width == self.width else 1
        self.width = width
        own = event.nodes - event.forced  # a constraint's forced tokens cost no draft forward
        if event.parts:  # a merged tree: each drafter learns from its own nodes
            for part in event.parts:
                self.record(part.drafter).record(part.judged, part.nodes, part.seconds, part.levels)
        elif event.drafter and own:
            self.record(event.drafter).record(event.judged, own, event.draft_seconds, event.levels - event.forced)


def fit_shape(shape: TreeSpec, room: int) -> TreeSpec | None:
    """`shape` cut to `room` levels (the tokens a sequence may still emit, less the target's own);
    None where nothing is to be drafted."""
    if room < 1 or shape.nodes < 1:
        return None
    if shape.depth > room:
        nodes = room if shape.is_chain else shape.nodes
        shape = TreeSpec(nodes, shape.width, room, shape.auto)
    return shape


def make_lookahead(k: int | str, k_max: int, threshold: float, tree: TreeSpec | None = None):
    """A chain of k (or `k: auto` up to k_max), or a tree (fixed, or `tree: auto` within its bounds)."""
    if tree is not None:
        return AdaptiveLookahead(tree, threshold) if tree.auto else FixedLookahead(tree)
    if k == "auto":
        return AdaptiveLookahead(TreeSpec.chain(k_max), threshold)
    return FixedLookahead(TreeSpec.chain(int(k)))
