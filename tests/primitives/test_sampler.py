"""The sampler alone: warps, the seeded choice argmax(p / e), and the acceptance rule."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as scistats

from specdec_cli.decoding.acceptance import accept_rows
from specdec_cli.primitives.sampling import (
    PositionNoise,
    choose,
    fit_vocab,
    position_seed,
    probabilities,
    race,
    warp_logits,
)
from specdec_cli.primitives.tree import chain_parents
from specdec_cli.profile import SamplingSpec

DRAWS = 4000
LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
WARPS = {
    "temperature 1": SamplingSpec(1.0),
    "temperature 0.6": SamplingSpec(0.6),
    "top-k 3 (zeros)": SamplingSpec(1.3, top_k=3),
    "top-p 0.8 (zeros)": SamplingSpec(0.9, top_p=0.8),
}


def position_noise_rows(vocab: int, draws: int, index: int = 0) -> torch.Tensor:
    """The noise each of `draws` seeds gives token `index` (the engine's own PositionNoise)."""
    return torch.stack([PositionNoise(seed, vocab, torch.device("cpu")).row(index) for seed in range(draws)])


def chi_square_pvalue(tokens: torch.Tensor, p: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=p.shape[0]).double()
    assert counts[p == 0].sum() == 0, "a token the warps removed was chosen"
    support = p > 0
    expected = p[support].double() / p[support].double().sum() * counts.sum()  # (float32 rounding of p)
    return float(scistats.chisquare(counts[support].numpy(), expected.numpy()).pvalue)


@pytest.mark.parametrize("warp", WARPS)
def test_the_seeded_choice_is_a_draw_from_the_warped_p(warp):
    """argmax(p / e) over many seeds' noise: chi-square against p, the warps' zeros never chosen."""
    sampling = WARPS[warp]
    p = probabilities(LOGITS, sampling)
    noise = position_noise_rows(p.shape[0], DRAWS)
    chosen = choose(LOGITS.expand(DRAWS, -1), sampling, noise)
    assert chi_square_pvalue(chosen, p) > 1e-3


WRONG_RULES = {
    "argmax(p + e)": lambda logits, sampling, noise: (probabilities(logits, sampling) + noise).argmax(-1),
    "unwarped p": lambda logits, sampling, noise: race(logits.softmax(-1), noise).argmax(-1),
    "p * e": lambda logits, sampling, noise: (probabilities(logits, sampling) * noise).argmax(-1),
}


@pytest.mark.parametrize("rule", WRONG_RULES)
def test_the_same_check_catches_a_wrong_rule(rule):
    sampling = WARPS["temperature 0.6"]
    p = probabilities(LOGITS, sampling)
    chosen = WRONG_RULES[rule](LOGITS.expand(DRAWS, -1), sampling, position_noise_rows(p.shape[0], DRAWS))
    assert chi_square_pvalue(chosen, p) < 1e-6


def test_position_noise_is_keyed_by_seed_and_position_alone():
    """A row depends on (seed, position) only: not on the order rows are asked for, the rows
    asked before, or which object asks; (seed + 1, t) and (seed, t + 1) differ (--samples uses seed + i)."""
    cpu = torch.device("cpu")
    first = PositionNoise(7, 50, cpu)
    rows = [first.row(t).clone() for t in range(4)]
    second = PositionNoise(7, 50, cpu)
    second.move_to(2)
    assert torch.equal(second.ahead([2, 1, 2]), torch.stack([rows[3], rows[2], rows[3]]))
    assert torch.equal(PositionNoise(7, 50, cpu).row(1), rows[1])
    assert not torch.equal(PositionNoise(8, 50, cpu).row(0), rows[1])
    assert len({position_seed(s, t) for s in range(30) for t in range(30)}) == 900
    second.move_to(3)
    assert sorted(second.rows) == [3]  # rows behind the committed tokens are dropped


def test_accept_keeps_matching_prefix_and_adds_the_choice():
    choices = torch.tensor([1, 2, 0, 3]).expand(3, 4)  # the target's token at the root and after each node
    drafts = torch.tensor([[1, 2, 3], [1, 2, 0], [2, 2, 0]])  # three rows judged at once
    n, _, token = accept_rows(drafts, [chain_parents(3)] * 3, choices)
    assert (int(n[0]), int(token[0])) == (2, 0)  # third draft 3 != choice 0: corrected to 0
    assert (int(n[1]), int(token[1])) == (3, 3)  # all kept: bonus from the last row
    assert (int(n[2]), int(token[2])) == (0, 1)


def test_greedy_choice_is_the_argmax_whatever_the_noise():
    logits = torch.tensor([[0.0, 5.0, 0.0], [3.0, 0.0, 0.0]])
    assert choose(logits, SamplingSpec(), None).tolist() == [1, 0]


def test_warps_match_transformers_processors():
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    for temperature, top_k, top_p in [(0.7, 0, 1.0), (1.3, 10, 1.0), (1.0, 0, 0.8), (0.5, 7, 0.6)]:
        ours = warp_logits(logits, SamplingSpec(temperature, top_k, top_p)).softmax(-1)
        theirs = TemperatureLogitsWarper(temperature)(None, logits.clone())
        if top_k:
            theirs = TopKLogitsWarper(top_k)(None, theirs)
        if top_p < 1:
            theirs = TopPLogitsWarper(top_p)(None, theirs)
        assert torch.allclose(ours, theirs.softmax(-1), atol=1e-6)


def test_greedy_probabilities_are_one_hot_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0]])
    assert probabilities(logits, SamplingSpec()).tolist() == [[0.0, 1.0, 0.0]]


def test_fit_vocab_cuts_padding_and_pads_narrow_heads():
    wide = torch.tensor([1.0, 2.0, 3.0, 9.0])  # the last row is embedding padding
    assert fit_vocab(wide, 3).tolist() == [1.0, 2.0, 3.0]
    narrow = fit_vocab(torch.tensor([1.0, 2.0]), 3)
    assert narrow[:2].tolist() == [1.0, 2.0] and narrow[2] == float("-inf")
    assert torch.softmax(narrow, -1)[2] == 0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(2, 300), st.integers(0, 2**31 - 1),
       st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_first_max_is_argmax_ties_included(rows, vocab, seed, dtype):
    """The greedy token is argmax's (the first of equal maxima): scores drawn from few values tie often."""
    from specdec_cli.primitives.sampling import first_max

    generator = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 4, (rows, vocab), generator=generator).to(dtype)
    assert torch.equal(first_max(scores), scores.argmax(dim=-1))
