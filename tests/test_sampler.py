"""The sampler alone: warps, and the exact output distribution of one verification step."""

from __future__ import annotations

import pytest
import torch

from specdec_cli.tree import chain_parents
from scipy import stats as scistats

from specdec_cli.profile import SamplingSpec
from specdec_cli.sampling import fit_vocab, probabilities, warp_logits
from specdec_cli.acceptance import (
    accept_probabilities,
    accept_greedy,
    accept_sampled,
    residual_distribution,
)


def exact_step_distribution(p: torch.Tensor, q: torch.Tensor, accept=accept_probabilities,
                            residual_of=residual_distribution) -> torch.Tensor:
    """P(first emitted token = y) for one step with one draft x ~ q, from the code's own pieces.

    Sum over x: kept with `accept` (the code's accept_probabilities), else the token comes from
    `residual_of` (its residual_distribution). Exact arithmetic over the vocabulary, no sampling.
    """
    out = torch.zeros(p.shape[0], dtype=torch.float64)
    residual = residual_of(p, q).double()
    for x in range(p.shape[0]):
        if q[x] == 0:
            continue
        a = float(accept(torch.tensor([x]), q[None], p[None])[0])
        out[x] += float(q[x]) * a
        out += float(q[x]) * (1 - a) * residual
    return out


def point_mass_distribution(p: torch.Tensor, x: int) -> torch.Tensor:
    ids = torch.tensor([x])
    a = float(accept_probabilities(ids, None, p[None])[0])
    residual = residual_distribution(p, torch.nn.functional.one_hot(ids[0], p.shape[0]).float()).double()
    out = (1 - a) * residual
    out[x] += a
    return out


def normalised(values) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.float32)
    return t / t.sum()


CASES = {
    "random": (normalised([0.1, 0.3, 0.2, 0.05, 0.35]), normalised([0.3, 0.1, 0.1, 0.4, 0.1])),
    "q zero where p positive": (normalised([0.2, 0.2, 0.2, 0.2, 0.2]), normalised([0.5, 0.5, 0, 0, 0])),
    "p zero where q positive": (normalised([0, 0, 0.5, 0.5, 0]), normalised([0.4, 0.3, 0.1, 0.1, 0.1])),
    "p equals q": (normalised([0.1, 0.2, 0.3, 0.4, 0.0]), normalised([0.1, 0.2, 0.3, 0.4, 0.0])),
    "disjoint": (normalised([1, 1, 0, 0, 0]), normalised([0, 0, 0, 1, 1])),
}


@pytest.mark.parametrize("name", CASES)
def test_one_step_emits_exactly_p(name):
    p, q = CASES[name]
    assert torch.allclose(exact_step_distribution(p, q), p.double(), atol=1e-6)


@pytest.mark.parametrize("x", range(5))
def test_point_mass_draft_emits_exactly_p(x):
    p = normalised([0.1, 0.3, 0.2, 0.05, 0.35])
    assert torch.allclose(point_mass_distribution(p, x), p.double(), atol=1e-6)


def test_random_distributions_emit_exactly_p():
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        p = torch.rand(7, generator=generator) ** 3
        q = torch.rand(7, generator=generator) ** 3
        p[torch.rand(7, generator=generator) < 0.3] = 0
        q[torch.rand(7, generator=generator) < 0.3] = 0
        if p.sum() == 0 or q.sum() == 0:
            continue
        p, q = p / p.sum(), q / q.sum()
        assert torch.allclose(exact_step_distribution(p, q), p.double(), atol=1e-5)


def keep_every_draft(draft_ids, draft_probs, target_probs):
    return torch.ones(draft_ids.shape[0])


def correct_from_p(target_row, draft_row):
    return target_row  # the correction drawn from p itself instead of norm(max(p - q, 0))


WRONG_RULES = {
    "keeps every draft": (keep_every_draft, residual_distribution),
    "corrects from p": (accept_probabilities, correct_from_p),
}


@pytest.mark.parametrize("rule", WRONG_RULES)
@pytest.mark.parametrize("name", ["random", "q zero where p positive"])
def test_a_wrong_rule_is_caught_by_the_exact_check(rule, name):
    """The check can fail: the same exact computation over a wrong rule does not give p."""
    p, q = CASES[name]
    accept, residual_of = WRONG_RULES[rule]
    assert not torch.allclose(exact_step_distribution(p, q, accept, residual_of), p.double(), atol=1e-3)


def test_accept_sampled_chain_first_token_follows_p():
    """The full function (cumprod, gathering, residual row) sampled many times: chi-square against p."""
    torch.manual_seed(0)
    vocab, k, trials = 6, 3, 20000
    p = torch.softmax(torch.randn(k + 1, vocab) * 1.5, dim=-1)
    q = torch.softmax(torch.randn(k, vocab) * 1.5, dim=-1)
    generator = torch.Generator().manual_seed(1)
    counts = torch.zeros(vocab)
    for _ in range(trials):
        drafts = torch.multinomial(q, 1, generator=generator)[:, 0]
        n, _, token = accept_sampled(drafts, chain_parents(k), q, p, generator)
        first = int(drafts[0]) if int(n) >= 1 else int(token)
        counts[first] += 1
    result = scistats.chisquare(counts.numpy(), (p[0] * trials).numpy())
    assert result.pvalue > 1e-3, result


def test_accept_sampled_bonus_when_all_kept():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    q = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    n, _, token = accept_sampled(torch.tensor([1, 2]), chain_parents(2), q, p, torch.Generator().manual_seed(0))
    assert (int(n), int(token)) == (2, 0)


def test_accept_greedy_keeps_matching_prefix_and_adds_argmax():
    logits = torch.tensor([[0, 5, 0, 0], [0, 0, 5, 0], [5, 0, 0, 0], [0, 0, 0, 5.0]])
    n, _, token = accept_greedy(torch.tensor([1, 2, 3]), chain_parents(3), logits)
    assert (int(n), int(token)) == (2, 0)  # third draft 3 != argmax 0: corrected to 0
    n, _, token = accept_greedy(torch.tensor([1, 2, 0]), chain_parents(3), logits)
    assert (int(n), int(token)) == (3, 3)  # all kept: bonus from the last row
    n, _, token = accept_greedy(torch.tensor([2, 2, 0]), chain_parents(3), logits)
    assert (int(n), int(token)) == (0, 1)


def test_warps_match_transformers_processors():
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

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
