"""The two cost models, on hand-made inputs with answers worked out by hand:
`k: auto` (lookahead.py) deciding whether one more draft pays, and tune-k's measured c and v(k)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from specdec_cli.bench.local import RunResult
from specdec_cli.drafters.growth import Growth
from specdec_cli.decoding.lookahead import AdaptiveLookahead, FixedLookahead, make_lookahead
from specdec_cli.decoding.events import Verified
from specdec_cli.specs import TreeSpec
from specdec_cli.decoding.stats import DecodeStats, StepRecord, judged_drafts
from specdec_cli.bench.tune import TuneResult, expected_tokens, predicted_speedup
from specdec_cli.bench.workload import BenchPrompt

# --------------------------------------------------------------------------- k: auto


def chain_step(drafted: int, accepted: int, draft_seconds: float, verify_seconds: float,
               confidences: list[float | None] | None = None) -> Verified:
    """The event of a chain step of drafter "m": drafts up to the first rejection were judged."""
    confidences = confidences or [None] * drafted
    judged = tuple((confidences[i], i, i < accepted, True) for i in range(judged_drafts(drafted, accepted)))
    return Verified("m", (1,) * drafted, accepted, 2, (1,) * (accepted + 1), draft_seconds + verify_seconds,
                    nodes=drafted, judged=judged, draft_seconds=draft_seconds, verify_seconds=verify_seconds)


def chain(k: int) -> TreeSpec:
    return TreeSpec.chain(k)


def observed(policy: AdaptiveLookahead, accepted_all: bool) -> AdaptiveLookahead:
    """Four steps of drafter "m" drafting 1, 2, 3, 4 tokens: 10 ms a draft, verify 100 ms + 10 ms a
    position. Then: cost per draft 10 ms, verify slope 10 ms a token, and per step time 0.64 s in all."""
    for drafted in (1, 2, 3, 4):
        accepted = drafted if accepted_all else 0
        policy.observe(chain_step(drafted, accepted, 0.01 * drafted, 0.1 + 0.01 * (drafted + 1)))
    return policy


def test_fixed_k_plans_k_without_a_budget():
    assert FixedLookahead(chain(3)).plan() == (chain(3), None)
    assert isinstance(make_lookahead(3, 10, 0.4), FixedLookahead)
    assert isinstance(make_lookahead("auto", 10, 0.4), AdaptiveLookahead)


def test_only_judged_drafts_count():
    """Drafts after the first rejection were never judged: 5 drafted, 2 kept -> 3 judged."""
    policy = AdaptiveLookahead(chain(8), 0.4)
    policy.observe(chain_step(5, 2, 0.05, 0.1))
    record = policy.record("m")
    assert (record.judged, record.kept, record.drafted) == (3, 2, 5)
    assert record.position_judged == [1, 1, 1] and record.position_kept == [1, 1, 0]
    assert record.mean_acceptance() == pytest.approx((2 + 1.4) / (3 + 2))  # prior: 0.7 with weight 2
    assert record.seconds_per_forward() == pytest.approx(0.01)


def test_acceptance_is_calibrated_by_confidence_bin():
    policy = AdaptiveLookahead(chain(8), 0.4)
    policy.observe(chain_step(2, 1, 0.0, 0.1, [0.95, 0.15]))  # bin 9 kept, bin 1 rejected
    record = policy.record("m")
    mean = (1 + 1.4) / (2 + 2)
    assert record.mean_acceptance() == pytest.approx(0.6)
    assert record.by_confidence(0.95) == pytest.approx((1 + 2 * mean) / (1 + 2))  # 0.733
    assert record.by_confidence(0.15) == pytest.approx((0 + 2 * mean) / (1 + 2))  # 0.4
    assert record.by_confidence(0.55) == pytest.approx(mean)  # an empty bin is the drafter's mean


def test_measured_costs():
    policy = observed(AdaptiveLookahead(chain(8), 0.4), accepted_all=True)
    assert policy.verify_seconds_per_token() == pytest.approx(0.01)  # the least-squares slope
    assert policy.record("m").seconds_per_forward() == pytest.approx(0.01)
    # 14 tokens in 0.64 s: a token is worth 1/21.875 s; one more draft costs 0.02 s
    assert policy.threshold(policy.record("m")) == pytest.approx((0.01 + 0.01) * 14 / 0.64)


def test_describe_states_what_the_rule_judges_by():
    """The -v line after a k: auto generation: the measured costs above and the bar they set."""
    line = observed(AdaptiveLookahead(chain(8), 0.4), accepted_all=True).describe()
    assert "after 4 steps: 21.8" in line  # 14 tokens in 0.64 s: 21.875 tok/s
    assert "verify +10.0 ms a token" in line
    assert "m: 2.50 drafted a step, 10.0 ms a draft" in line
    assert f"P(kept) >= {(0.01 + 0.01) * 14 / 0.64:.2f}" in line  # 0.44


def test_the_profile_threshold_stands_in_until_warmed_up():
    policy = AdaptiveLookahead(chain(8), 0.4)
    policy.observe(chain_step(2, 2, 0.02, 0.13))
    policy.observe(chain_step(3, 3, 0.03, 0.14))
    assert policy.threshold(policy.record("m")) == 0.4


def test_drafting_goes_on_while_the_expected_gain_pays_for_it():
    """Acceptance 0.95 (all 10 judged drafts kept, pulled toward 0.7 by the prior: 11.4/12) against
    a threshold of 0.4375: the k-th more draft pays while 0.95^(k+1) >= 0.4375, i.e. for k <= 15."""
    policy = observed(AdaptiveLookahead(chain(64), 0.4), accepted_all=True)
    threshold = policy.threshold(policy.record("m"))
    assert threshold == pytest.approx(0.4375)
    _, budget = policy.plan()
    allowed = 0
    while allowed < 100 and budget.allows_more("m", 0.95):
        allowed += 1
    assert allowed == math.floor(math.log(0.4375) / math.log(0.95)) - 1 == 15


def test_a_drafter_the_target_rejects_stops_at_once():
    """Nothing kept: acceptance (0 + 1.4) / (4 + 2) = 0.233, so P = 0.233^2 = 0.054 is below the
    threshold (0.02 s * 4 tokens / 0.64 s = 0.125) already for the second draft."""
    policy = observed(AdaptiveLookahead(chain(64), 0.4), accepted_all=False)
    assert policy.threshold(policy.record("m")) == pytest.approx(0.125)
    _, budget = policy.plan()
    assert budget.allows_more("m", 0.1) is False
    assert budget.p_all_kept == pytest.approx(1.4 / 6)


def test_a_drafter_without_confidence_is_judged_by_position():
    """Prompt lookup: position i's own keep rate (pulled toward the mean), not a confidence bin."""
    policy = observed(AdaptiveLookahead(chain(64), 0.4), accepted_all=True)
    record = policy.record("m")
    assert record.position_judged == [4, 3, 2, 1]
    mean = 11.4 / 12
    assert record.by_position(0) == pytest.approx((4 + 2 * mean) / (4 + 2))
    assert record.by_position(3) == pytest.approx((1 + 2 * mean) / (1 + 2))
    assert record.by_position(7) == pytest.approx(mean)  # never drafted there
    _, budget = policy.plan()
    assert budget.allows_more("m", None) is True
    assert budget.p_all_kept == pytest.approx(record.by_position(0))



def after_a_slow_stretch(accepted: bool) -> AdaptiveLookahead:
    """The trap behind short-drafting runs: the machine ran slow (0.62 s a verify instead of 0.36)
    for the six steps in which drafts first grew to two tokens, then drafting fell back to one
    token a step for eight steps, which all verify two tokens and so say nothing about the slope.
    Draft forwards cost 0.1 s a token."""
    policy = AdaptiveLookahead(chain(32), 0.4)
    for _ in range(3):
        policy.observe(chain_step(1, int(accepted), 0.1, 0.36, [0.95]))
    for _ in range(6):
        policy.observe(chain_step(2, 2 * int(accepted), 0.2, 0.62, [0.95, 0.95]))
    for _ in range(8):
        policy.observe(chain_step(1, int(accepted), 0.1, 0.36, [0.95]))
    return policy


def drafted_with(policy: AdaptiveLookahead, confidence: float) -> int:
    """How long a chain the rule lets a drafter draft whose every token has this confidence."""
    _, budget = policy.plan()
    drafted = 1
    while drafted < 32 and budget.allows_more("m", confidence):
        drafted += 1
    return drafted


def test_a_slow_stretch_does_not_lock_drafting_short():
    """The stretch reads as a verify cost of about 0.26 s a token, which alone stops every chain
    after one draft; drafts that are always kept must still get long again, and soon: a chain
    one token deeper than the rule asks, once the fit has seen only one width for a while,
    measures what a second token really costs (0.005 s)."""
    policy = after_a_slow_stretch(accepted=True)
    assert policy.verify_seconds_per_token() > 0.2
    assert policy.threshold(policy.record("m")) > 1.0  # no chain could pay
    lengths = []
    for step in range(25):
        drafted = drafted_with(policy, 0.95)
        lengths.append(drafted)
        policy.observe(chain_step(drafted, drafted, 0.1 * drafted, 0.36 + 0.005 * (drafted - 1), [0.95] * drafted))
    assert lengths[0] == 2  # the exploring token
    assert max(lengths) >= 8, lengths
    assert policy.verify_seconds_per_token() < 0.02


def test_exploring_is_one_token_and_only_where_verify_cost_stops_the_chain():
    """Explore only where the draft forward alone would pay: a drafter whose drafts are all
    rejected gets no extra token, however stale the fit."""
    assert drafted_with(after_a_slow_stretch(accepted=True), 0.95) == 2
    rejected = after_a_slow_stretch(accepted=False)
    assert rejected.slope_is_stale()
    assert drafted_with(rejected, 0.95) == 1


# --------------------------------------------------------------------------- tree: auto


def tree_step(levels: int) -> Verified:
    """A tree of 4 nodes a level, `levels` deep, every first child kept and every sibling rejected
    (4 judged a level); 10 ms a draft forward (one per level), verify 100 ms + 1 ms a token."""
    judged = tuple((None, depth, rank == 0, rank == 0) for depth in range(levels) for rank in range(4))
    nodes = 4 * levels
    return Verified("m", (1,) * levels, levels, 2, (1,) * (levels + 1), 0.01 * levels + 0.1 + 0.001 * (nodes + 1),
                    nodes=nodes, tree=True, judged=judged, levels=levels,
                    draft_seconds=0.01 * levels, verify_seconds=0.1 + 0.001 * (nodes + 1))


def grown_tree_policy() -> tuple[AdaptiveLookahead, Growth]:
    """After trees 1..4 levels deep: 14 tokens in 0.544 s (25.7 tok/s), a draft forward 10 ms, a
    verified token 1 ms; 10 of 40 judged nodes kept (mean acceptance (10 + 1.4) / 42 = 0.271), but
    every first child was: (10 + 2 * 0.271) / 12 = 0.878."""
    policy = AdaptiveLookahead(TreeSpec(32, 4, 10, auto=True), 0.4)
    for levels in (1, 2, 3, 4):
        policy.observe(tree_step(levels))
    _, budget = policy.plan()
    return policy, Growth(policy.shape, budget, "m")


def test_a_tree_level_costs_one_draft_forward_and_its_main_line_is_judged_by_first_children():
    policy, _ = grown_tree_policy()
    record = policy.record("m")
    assert record.seconds_per_forward() == pytest.approx(0.01)  # not per node (0.0025)
    assert record.mean_acceptance() == pytest.approx(11.4 / 42)
    assert record.first_child_acceptance() == pytest.approx((10 + 2 * 11.4 / 42) / 12)
    assert policy.throughput() == pytest.approx(14 / 0.544)


def test_tree_auto_expands_the_main_line_where_only_siblings_were_rejected():
    """A node whose path is kept with chance 0.5: its first child adds 0.5 * 0.878 = 0.44 tokens
    against a bar of (10 + 1 ms) * 25.7 tok/s = 0.28. (Judged by the mean acceptance, 0.5 * 0.271
    = 0.14, it would not be expanded, and trees would stay as shallow as chains.)"""
    policy, growth = grown_tree_policy()
    assert growth.budget.bar("m") == pytest.approx(0.011 * 14 / 0.544)
    assert growth.expand([0.5]) == [0]
    assert growth.expand([0.2]) == []  # 0.18 < 0.28


def test_one_draft_forward_expands_a_level_when_its_nodes_pay_for_it_together():
    """Three nodes whose first children add 0.18, 0.18 and 0.13 tokens: none pays the 0.28 bar
    alone, but together, less the 0.026 a further node's verification costs, they do (0.43);
    0.09 and 0.04 do not (0.11)."""
    policy, growth = grown_tree_policy()
    verify_bar = growth.budget.bar("m", drafts=False)
    assert verify_bar == pytest.approx(0.001 * 14 / 0.544)
    assert sorted(growth.expand([0.15, 0.2, 0.2])) == [0, 1, 2]
    assert growth.expand([0.1, 0.05]) == []


# --------------------------------------------------------------------------- tune-k: c and v(k)


P1, P2 = BenchPrompt("p1", "one"), BenchPrompt("p2", "two")


def run(method: str, prompt: BenchPrompt, steps: list[tuple[int, int]], draft_seconds: float,
        verify_seconds: float) -> RunResult:
    """A finished run whose engine statistics are `steps` (drafted, accepted) and these timings."""
    stats = DecodeStats(k=0, k_limit=8, draft_seconds=draft_seconds, verify_seconds=verify_seconds)
    stats.steps = [StepRecord("m" if d else None, d, a, a + 1) for d, a in steps]
    return RunResult(method, prompt, 0, (), 0.0, 1.0, 1, stats=stats)


def tuned() -> TuneResult:
    """plain: 20 steps in 2.2 s (0.11 s a step). k=2: 5 steps of 2 drafts (1 kept) in 0.66 s of
    verification and 0.33 s of drafting. k=4: p1 keeps everything, p2 nothing, 4 steps in all,
    16 drafts, 0.704 s verifying and 0.528 s drafting. k=auto drafts slowly, and must not count in c."""
    results = [
        run("plain", P1, [(0, 0)] * 10, 0.0, 1.0),
        run("plain", P2, [(0, 0)] * 10, 0.0, 1.2),
        run("k=2", P1, [(2, 1)] * 5, 0.33, 0.66),
        run("k=4", P1, [(4, 4)] * 2, 0.264, 0.352),
        run("k=4", P2, [(4, 0)] * 2, 0.264, 0.352),
        run("k=auto", P1, [(4, 4)] * 2, 5.0, 0.352),
    ]
    return TuneResult(SimpleNamespace(results=results), ks=[2, 4], include_auto=True)


def test_plain_step_is_verify_time_per_target_forward():
    assert tuned().plain_step_seconds() == pytest.approx(2.2 / 20)


def test_c_is_draft_time_per_drafted_token_over_a_plain_step():
    # (0.33 + 0.528) s / (10 + 16) drafts = 0.033 s, over 0.11 s
    assert tuned().draft_cost_ratio() == pytest.approx(0.3)


def test_v_is_verify_time_per_target_forward_over_a_plain_step():
    result = tuned()
    assert result.verify_cost_ratio(2) == pytest.approx(0.66 / 5 / 0.11)  # 1.2
    assert result.verify_cost_ratio(4) == pytest.approx(0.704 / 4 / 0.11)  # 1.6
    assert result.verify_cost_ratio(3) is None  # never run


def test_alpha_and_prediction_are_per_prompt_then_the_median():
    result = tuned()
    assert result.alpha(2, [P1]) == pytest.approx(0.5)  # 5 kept of 10 judged
    assert result.alpha(4, [P1]) == 1.0 and result.alpha(4, [P2]) == 0.0
    assert result.alpha(4, [P1, P2]) == pytest.approx(8 / 10)  # 2 steps x 4 kept; 2 x 1 judged
    assert result.predicted(2, [P1], 0.3, 1.2) == pytest.approx(expected_tokens(0.5, 2) / (2 * 0.3 + 1.2))
    # k=4: the median of p1's 5 tokens a step and p2's 1, over a cost of 4 * 0.3 + 1.6 = 2.8
    median = result.predicted(4, [P1, P2], 0.3, 1.6)
    assert median == pytest.approx((5 / 2.8 + 1 / 2.8) / 2)
    assert median != pytest.approx(predicted_speedup(0.8, 4, 0.3, 1.6))  # not from the pooled alpha
    assert result.predicted(4, [P1, P2], None, 1.6) is None
