"""Temperature > 0: the whole loop's first two tokens follow the target's exact distribution.

A 12-token vocabulary makes the exact joint distribution of two tokens small enough to write down
(12 x 12 cells, from transformers' own warpers on full forwards without a cache); thousands of
seeded samples from the engine are compared with it by a chi-square test, at a significance that
a deliberately broken sampler fails.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats as scistats

from conftest import model_profile
from specdec_cli import Pipeline, SamplingSpec
import specdec_cli.engine as engine_module

PROMPT_WORDS = "alpha beta gamma alpha beta"


def exact_two_token_distribution(pipe: Pipeline, ids: list[int], sampling: SamplingSpec) -> np.ndarray:
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    warpers = LogitsProcessorList([TemperatureLogitsWarper(sampling.temperature)])
    if sampling.top_k:
        warpers.append(TopKLogitsWarper(sampling.top_k))
    if sampling.top_p < 1:
        warpers.append(TopPLogitsWarper(sampling.top_p))

    def next_distribution(sequence: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            logits = pipe.target(torch.tensor([sequence], device=pipe.target.device)).logits[0, -1].float()
        return warpers(None, logits[None])[0].softmax(-1).double().cpu()

    vocab = pipe.vocab
    first = next_distribution(ids)
    joint = np.zeros((vocab, vocab))
    for t1 in range(vocab):
        if first[t1] > 0:
            joint[t1] = (first[t1] * next_distribution(ids + [t1])).numpy()
    return joint


def sample_two_tokens(pipe: Pipeline, ids: list[int], sampling: SamplingSpec, n: int, k: int | str = 3) -> np.ndarray:
    counts = np.zeros((pipe.vocab, pipe.vocab))
    decoder = pipe.decoder(k=k)
    for seed in range(n):
        result = pipe.generate(ids, decoder=decoder, sampling=sampling, max_new_tokens=2, seed=seed)
        t1, t2 = result.token_ids
        counts[t1, t2] += 1
    return counts


def chi_square_pvalue(counts: np.ndarray, joint: np.ndarray) -> float:
    expected = joint.ravel() * counts.sum()
    observed = counts.ravel()
    assert observed[expected == 0].sum() == 0, "a sample fell where the target puts no mass"
    big = expected >= 5  # pool sparse cells into one, as chi-square needs
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    exp = exp * obs.sum() / exp.sum()  # float rounding of the exact probabilities
    return float(scistats.chisquare(obs, exp).pvalue)


DRAFTERS = {
    "model": lambda pair: {"kind": "model", "model": str(pair["draft"])},
    "ngram": lambda pair: {"kind": "ngram", "max_ngram": 2},
    "early-exit": lambda pair: {"kind": "early-exit", "layers": 1},
    "chain": lambda pair: {"kind": "chain", "drafters": [{"kind": "ngram"}, {"kind": "model", "model": str(pair["draft"])}]},
}
SAMPLES = 2500


@pytest.fixture
def word_pipeline(tmp_path, small_vocab_pair):
    def make(drafter: str) -> Pipeline:
        pipe = Pipeline.from_profile(str(model_profile(tmp_path, small_vocab_pair, drafter=DRAFTERS[drafter](small_vocab_pair), chat=False)))
        pipe.eos_ids = frozenset()  # every sample has two tokens
        return pipe

    return make


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_two_tokens_follow_the_target_exactly(word_pipeline, drafter):
    pipe = word_pipeline(drafter)
    ids = pipe.encode(PROMPT_WORDS)
    sampling = SamplingSpec(temperature=1.0)
    joint = exact_two_token_distribution(pipe, ids, sampling)
    counts = sample_two_tokens(pipe, ids, sampling, SAMPLES)
    assert chi_square_pvalue(counts, joint) > 1e-3


def test_top_k_top_p_and_adaptive_k_follow_the_target_exactly(word_pipeline):
    pipe = word_pipeline("model")
    ids = pipe.encode(PROMPT_WORDS)
    sampling = SamplingSpec(temperature=0.8, top_k=6, top_p=0.9)
    joint = exact_two_token_distribution(pipe, ids, sampling)
    counts = sample_two_tokens(pipe, ids, sampling, SAMPLES, k="auto")
    assert chi_square_pvalue(counts, joint) > 1e-3


def test_plain_decoding_follows_the_target_exactly(word_pipeline):
    pipe = word_pipeline("model")
    ids = pipe.encode(PROMPT_WORDS)
    sampling = SamplingSpec(temperature=1.0)
    joint = exact_two_token_distribution(pipe, ids, sampling)
    counts = np.zeros_like(joint)
    plain = pipe.decoder(drafter=None)
    for seed in range(SAMPLES):
        t1, t2 = pipe.generate(ids, decoder=plain, sampling=sampling, max_new_tokens=2, seed=seed).token_ids
        counts[t1, t2] += 1
    assert chi_square_pvalue(counts, joint) > 1e-3


def test_a_broken_sampler_fails_the_same_test(word_pipeline, monkeypatch):
    """Keeping every draft (no rejection) samples from q: the test must notice."""

    def keep_everything(draft_ids, parents, draft_probs, target_probs, generator):
        k = draft_ids.shape[0]
        bonus = torch.multinomial(target_probs[k], 1, generator=generator)[0]
        return torch.tensor(k), torch.tensor(k - 1), bonus

    monkeypatch.setattr(engine_module, "accept_sampled", keep_everything)
    pipe = word_pipeline("model")
    ids = pipe.encode(PROMPT_WORDS)
    sampling = SamplingSpec(temperature=1.0)
    joint = exact_two_token_distribution(pipe, ids, sampling)
    counts = sample_two_tokens(pipe, ids, sampling, SAMPLES)
    assert chi_square_pvalue(counts, joint) < 1e-3


def test_same_seed_same_output(tmp_path, llama_pair):
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair)))
    sampling = SamplingSpec(temperature=0.9, top_p=0.95)
    first = pipe.generate("def add(a, b):", sampling=sampling, seed=42, max_new_tokens=30)
    again = pipe.generate("def add(a, b):", sampling=sampling, seed=42, max_new_tokens=30)
    other = pipe.generate("def add(a, b):", sampling=sampling, seed=43, max_new_tokens=30)
    assert first.token_ids == again.token_ids
    assert first.token_ids != other.token_ids
