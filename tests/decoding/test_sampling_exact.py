"""Temperature > 0: the whole loop's first two tokens follow the target's exact distribution, and
one seed gives one text whatever is drafted.

A 12-token vocabulary makes the exact joint distribution of two tokens small enough to write down
(12 x 12 cells, from transformers' own warpers on full forwards without a cache); thousands of
seeded samples from the engine are compared with it by a chi-square test, at a significance that
a deliberately broken verifier fails.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from profile_helpers import model_profile
from specdec_cli import Pipeline, SamplingSpec
import specdec_cli.decoding.batched as core_module
from specdec_cli.specs import TreeSpec

from exact_distribution import PROMPT_WORDS, chi_square_pvalue, exact_two_token_distribution, texts_by_shape


def sample_two_tokens(
    pipe: Pipeline, ids: list[int], sampling: SamplingSpec, n: int, k: int | str = 3, tree: TreeSpec | None = None
) -> np.ndarray:
    counts = np.zeros((pipe.vocab, pipe.vocab))
    decoder = pipe.decoder(k=k, tree=tree)
    for seed in range(n):
        result = pipe.generate(ids, decoder=decoder, sampling=sampling, max_new_tokens=2, seed=seed)
        t1, t2 = result.token_ids
        counts[t1, t2] += 1
    return counts


DRAFTERS = {
    "model": lambda pair: {"kind": "model", "model": str(pair["draft"])},
    "ngram": lambda pair: {"kind": "ngram", "max_ngram": 2},
    "early-exit": lambda pair: {"kind": "early-exit", "layers": 1},
    "chain": lambda pair: {"kind": "chain", "drafters": [{"kind": "ngram"}, {"kind": "model", "model": str(pair["draft"])}]},
    "auto": lambda pair: {"kind": "auto", "candidates": [{"kind": "ngram"}, {"kind": "model", "model": str(pair["draft"])}]},
}
SAMPLES = 1200  # plain decoding's sample: the anchor every drafted run is held to
# Drafted runs: a right engine emits plain decoding's seeded text whatever it drafts (tested below, token
# for token), so these samples are plain's; their test guards the whole loop end to end. A broken
# verifier scores p = 0.0 from 400 samples on, a right one 0.56-0.98 at 400-1200 (measured).
DRAFTED_SAMPLES = 600


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
    counts = sample_two_tokens(pipe, ids, sampling, DRAFTED_SAMPLES)
    assert chi_square_pvalue(counts, joint) > 1e-3


def test_top_k_top_p_and_adaptive_k_follow_the_target_exactly(word_pipeline):
    pipe = word_pipeline("model")
    ids = pipe.encode(PROMPT_WORDS)
    sampling = SamplingSpec(temperature=0.8, top_k=6, top_p=0.9)
    joint = exact_two_token_distribution(pipe, ids, sampling)
    counts = sample_two_tokens(pipe, ids, sampling, DRAFTED_SAMPLES, k="auto")
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


def test_a_tree_follows_the_target_exactly(word_pipeline):
    pipe = word_pipeline("model")
    ids = pipe.encode(PROMPT_WORDS)
    sampling = SamplingSpec(temperature=1.0)
    joint = exact_two_token_distribution(pipe, ids, sampling)
    counts = sample_two_tokens(pipe, ids, sampling, DRAFTED_SAMPLES, tree=TreeSpec(6, 3, 2))
    assert chi_square_pvalue(counts, joint) > 1e-3


def keep_the_first_line(draft_ids, parents, choices):
    """A broken verifier: in each row keeps every node's first child whatever the target chose (a
    chain: every draft), then adds the target's choice where that line ends."""
    ns, ends = [], []
    for row in parents:
        first_child: dict[int, int] = {}
        for node, parent in enumerate(row):
            first_child.setdefault(parent, node)
        end, n = -1, 0
        while end in first_child:
            end, n = first_child[end], n + 1
        ns.append(n)
        ends.append(end)
    end = torch.tensor(ends)
    return torch.tensor(ns), end, choices.gather(1, (end + 1)[:, None])[:, 0]


@pytest.mark.parametrize("tree", [None, TreeSpec(6, 3, 2)], ids=["chain", "tree"])
def test_a_broken_verifier_fails_the_same_test(word_pipeline, monkeypatch, tree):
    """Keeping the draft's guesses unchecked emits argmax(q / e), a draw from q: the test must notice."""
    monkeypatch.setattr(core_module, "accept_rows", keep_the_first_line)
    pipe = word_pipeline("model")
    ids = pipe.encode(PROMPT_WORDS)
    sampling = SamplingSpec(temperature=1.0)
    joint = exact_two_token_distribution(pipe, ids, sampling)
    counts = sample_two_tokens(pipe, ids, sampling, DRAFTED_SAMPLES, tree=tree)
    assert chi_square_pvalue(counts, joint) < 1e-3


# --------------------------------------------------------------------------- one seed, one text

REPRODUCED = {
    "model": lambda pair: {"kind": "model", "model": str(pair["draft"])},
    "ngram": lambda pair: {"kind": "ngram"},
    "early-exit": lambda pair: {"kind": "early-exit", "layers": 2},
    "chain": lambda pair: {"kind": "chain", "drafters": [{"kind": "ngram", "solo_ngram": 2}, {"kind": "model", "model": str(pair["draft"])}]},
    "auto": lambda pair: {"kind": "auto", "candidates": [{"kind": "ngram"}, {"kind": "model", "model": str(pair["draft"])}]},
}


@pytest.mark.parametrize("drafter", list(REPRODUCED))
def test_one_seed_gives_one_text_for_every_k_tree_and_drafter(tmp_path, llama_pair, drafter):
    """float32: the ids equal plain decoding's with the same seed for k = 1, 2, 4, auto, a tree
    and tree: auto; another seed gives another text."""
    profile = model_profile(tmp_path, llama_pair, drafter=REPRODUCED[drafter](llama_pair), chat=False)
    pipe = Pipeline.from_profile(str(profile))
    sampling = SamplingSpec(temperature=0.8, top_p=0.95)
    prompt = "def add(a, b): return a + b  # def add(a, b):"
    texts = texts_by_shape(pipe, prompt, sampling, seed=42)
    assert len(texts["plain"]) == 24
    assert all(ids == texts["plain"] for ids in texts.values()), {n: ids[:12] for n, ids in texts.items()}
    other = pipe.generate(prompt, decoder=pipe.decoder(drafter=None), sampling=sampling, seed=43, max_new_tokens=24)
    assert other.token_ids != texts["plain"]


def test_what_a_drafter_proposes_changes_acceptance_never_the_text(tmp_path, llama_pair, monkeypatch):
    """A model drafter that ranks its guesses backwards (the least likely by q / e first) is kept
    less often, and the text is still the seed's."""
    import specdec_cli.drafters.growth as growth

    pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, chat=False)))
    sampling, prompt = SamplingSpec(temperature=0.8), "def add(a, b):"
    plain = pipe.generate(prompt, decoder=pipe.decoder(drafter=None), sampling=sampling, seed=9, max_new_tokens=24)
    good = pipe.generate(prompt, decoder=pipe.decoder(k=4), sampling=sampling, seed=9, max_new_tokens=24)
    monkeypatch.setattr(growth, "race", lambda q, noise: -q / noise.clamp_min(1e-30))
    bad = pipe.generate(prompt, decoder=pipe.decoder(k=4), sampling=sampling, seed=9, max_new_tokens=24)
    assert good.token_ids == bad.token_ids == plain.token_ids
    assert good.stats.accepted > 5 and bad.stats.accepted < good.stats.accepted / 2, (good.stats.accepted, bad.stats.accepted)


def test_same_seed_same_output(tmp_path, llama_pair):
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair)))
    sampling = SamplingSpec(temperature=0.9, top_p=0.95)
    first = pipe.generate("def add(a, b):", sampling=sampling, seed=42, max_new_tokens=30)
    again = pipe.generate("def add(a, b):", sampling=sampling, seed=42, max_new_tokens=30)
    other = pipe.generate("def add(a, b):", sampling=sampling, seed=43, max_new_tokens=30)
    assert first.token_ids == again.token_ids
    assert first.token_ids != other.token_ids
