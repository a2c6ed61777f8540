"""Chains of drafters and token trees in a batch: every row's text is its prompt's own batch-1 text
(greedy and seeded), each row drafts what it drafts alone, rows end at EOS and at their limits
inside an accepted tree, both caches hold exactly each row's committed tokens after every step,
and the sampled rows follow the target's distribution exactly."""

from __future__ import annotations

import numpy as np
import pytest
from batch_rows import CACHES, LIMITS, SAMPLED, alone, assert_row_holds, batched, prompt_ids, run_all
from cache_checks import assert_cache_holds, assert_static_cache_holds
from exact_distribution import PROMPT_WORDS, chi_square_pvalue, exact_two_token_distribution
from profile_helpers import model_profile

from specdec_cli import Pipeline, SamplingSpec
from specdec_cli.decoding.batched import Request
from specdec_cli.drafters.batched import RowDrafters
from specdec_cli.drafters.model import ModelDrafter
from specdec_cli.runtime.lm import CachedLM
from specdec_cli.specs import TreeSpec

TREE = TreeSpec(8, 2, 4)


def chain_spec(pair) -> dict:
    """Prompt lookup, then the draft model: a weak match's guess and the model's share one tree.
    Lookup reads its own row alone (pool_tokens 0: no lookup across requests), so that a row drafts
    what it drafts alone (test_each_row_drafts_what_it_drafts_alone)."""
    lookup = {"kind": "ngram", "max_ngram": 3, "pool_tokens": 0}
    return {"kind": "chain", "drafters": [lookup, {"kind": "model", "model": str(pair["draft"])}]}


# case -> (the profile's drafter, the tree each row drafts; None: chains of k)
CASES = {
    "chain": (chain_spec, None),
    "model-tree": (lambda pair: {"kind": "model", "model": str(pair["draft"])}, TREE),
    "chain-tree": (chain_spec, TREE),
    "ngram-tree": (lambda pair: {"kind": "ngram", "max_ngram": 3}, TreeSpec(6, 2, 3)),
    "tree-auto": (lambda pair: {"kind": "model", "model": str(pair["draft"])}, TreeSpec(12, 3, 5, auto=True)),
    "drafter-auto": (lambda pair: {"kind": "auto", "candidates": [{"kind": "ngram"}, {"kind": "model", "model": str(pair["draft"])}]},
                     None),
}


@pytest.fixture(scope="module")
def pipes(tmp_path_factory, llama_pair) -> dict[str, Pipeline]:
    made = {}
    for name, (drafter, _) in CASES.items():
        folder = tmp_path_factory.mktemp(name)
        made[name] = Pipeline.from_profile(str(model_profile(folder, llama_pair, drafter=drafter(llama_pair))))
    return made


def decoder_for(pipes, case: str, **options):
    return batched(pipes[case], case, tree=CASES[case][1], **options)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("batch_size", [1, 2, 3, 8])
@pytest.mark.parametrize("compile", CACHES)
def test_greedy_rows_equal_their_own_batch_one_decoding(pipes, case, batch_size, compile):
    """8 prompts of different lengths and limits; below 8 rows, finished rows' slots are refilled."""
    pipe = pipes[case]
    prompts = prompt_ids(pipe)
    decoder = decoder_for(pipes, case, batch_size=batch_size, compile=compile)
    assert isinstance(decoder.drafter, RowDrafters)
    finished = run_all(decoder, [Request(i, ids, limit) for i, (ids, limit) in enumerate(zip(prompts, LIMITS))])
    for i, (ids, limit) in enumerate(zip(prompts, LIMITS)):
        assert (finished[i].token_ids, finished[i].finish_reason) == alone(pipe, ids, limit), (i, case, batch_size)
    steps = [step for f in finished.values() for step in f.stats.steps]
    assert sum(step.accepted for step in steps) > 0  # the drafts were really used
    if CASES[case][1] is not None and case != "ngram-tree":
        assert any(step.judged is not None for step in steps)  # and some were trees


@pytest.mark.parametrize("case", ["chain", "model-tree", "chain-tree"])
def test_each_row_drafts_what_it_drafts_alone(pipes, case):
    """A row's drafter reads its own row only: per row, the same drafts are kept in as many target
    forwards as at batch size 1 with the same drafter and tree."""
    pipe = pipes[case]
    prompts = prompt_ids(pipe)
    finished = run_all(decoder_for(pipes, case, batch_size=3), [Request(i, ids, 24) for i, ids in enumerate(prompts)])
    single = pipe.decoder(k=4, tree=CASES[case][1])
    for i, ids in enumerate(prompts):
        stats = pipe.generate(ids, decoder=single, max_new_tokens=24).stats
        assert finished[i].stats.accept_length_histogram == stats.accept_length_histogram, i
        assert finished[i].stats.drafted == stats.drafted, i


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("compile", CACHES)
def test_sampled_rows_equal_their_own_seeded_batch_one_text(pipes, case, compile):
    """Temperature 0.8, a seed per prompt: each row is its prompt's batch-1 text of that seed."""
    pipe = pipes[case]
    prompts = prompt_ids(pipe)
    jobs = [(ids, limit, 100 + i) for i, (ids, limit) in enumerate(zip(prompts, LIMITS))]
    for batch_size in (3, 8):
        requests = [Request(i, ids, limit, SAMPLED, seed) for i, (ids, limit, seed) in enumerate(jobs)]
        finished = run_all(decoder_for(pipes, case, batch_size=batch_size, compile=compile), requests)
        for i, (ids, limit, seed) in enumerate(jobs):
            assert finished[i].token_ids == alone(pipe, ids, limit, SAMPLED, seed)[0], (i, batch_size)


@pytest.mark.parametrize("case", ["chain", "model-tree"])
@pytest.mark.parametrize("compile", CACHES)
def test_rows_stop_at_eos_inside_an_accepted_tree(pipes, case, compile):
    """A token that one prompt's greedy text emits mid-run is made the EOS: that row ends there,
    while the others go on."""
    pipe = pipes[case]
    prompts = prompt_ids(pipe)
    eos = alone(pipe, prompts[0], 30)[0][12]
    decoder = decoder_for(pipes, case, batch_size=4, compile=compile)
    decoder.eos_ids = frozenset({eos})
    original, pipe.eos_ids = pipe.eos_ids, frozenset({eos})
    try:
        finished = run_all(decoder, [Request(i, ids, 30) for i, ids in enumerate(prompts)])
        for i, ids in enumerate(prompts):
            assert (finished[i].token_ids, finished[i].finish_reason) == alone(pipe, ids, 30), i
        assert finished[0].finish_reason == "eos" and len(finished[0].token_ids) <= 13
    finally:
        pipe.eos_ids = original


@pytest.mark.parametrize("case", ["chain", "model-tree"])
@pytest.mark.parametrize("compile", CACHES)
def test_rows_stop_at_max_new_tokens_mid_tree(pipes, case, compile):
    pipe = pipes[case]
    ids = prompt_ids(pipe)[1]
    limits = [1, 2, 3, 5, 7]
    finished = run_all(decoder_for(pipes, case, batch_size=5, compile=compile), [Request(n, ids, n) for n in limits])
    for n in limits:
        assert finished[n].token_ids == alone(pipe, ids, n)[0]
        assert finished[n].finish_reason == "length" and finished[n].stats.new_tokens == n


def assert_drafter_holds(drafter: ModelDrafter, committed: list[int]) -> None:
    """A row's model drafter: its cache plus its pending tokens spell the committed sequence."""
    pending = drafter.pending.tolist()
    assert committed[len(committed) - len(pending):] == pending
    check = assert_cache_holds if isinstance(drafter.lm, CachedLM) else assert_static_cache_holds
    check(drafter.lm, committed[: len(committed) - len(pending)])


@pytest.mark.parametrize("compile", CACHES)
def test_both_caches_hold_each_rows_committed_tokens_after_every_step(pipes, compile):
    """Trees in a batch of 3 over 8 prompts: after every step the target's row holds its committed
    tokens but the newest (the accepted path gathered, the rejected branches gone) and each row's
    draft model holds them too, with what it has not read yet pending."""
    pipe = pipes["model-tree"]
    prompts = prompt_ids(pipe)
    decoder = decoder_for(pipes, "model-tree", batch_size=3, compile=compile)
    step, checked = decoder._step, []

    def checked_step(rows, **options):
        events = step(rows, **options)
        for b, row in enumerate(rows):
            committed = list(prompts[row.key]) + row.generated
            assert_row_holds(decoder.lm, b, committed[:-1])  # the newest token waits to be fed
            assert committed[-1] == row.pending
            assert_drafter_holds(decoder.drafter.drafters[b], committed)
        checked.append(any(s.judged is not None for row in rows for s in row.stats.steps[-1:]))
        return events

    decoder._step = checked_step
    run_all(decoder, [Request(i, ids, 16) for i, ids in enumerate(prompts)])
    assert len(checked) > 10 and any(checked)  # steps that verified trees were checked


def test_sampled_rows_follow_the_target_exactly_with_trees(tmp_path, small_vocab_pair):
    """Temperature 1, one prompt with 600 seeds in batches of 8, each row drafting a tree: the two
    tokens of each row follow the target's exact joint distribution (chi-square)."""
    spec = {"kind": "model", "model": str(small_vocab_pair["draft"])}
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, small_vocab_pair, drafter=spec, chat=False)))
    pipe.eos_ids = frozenset()  # every row has two tokens
    ids = pipe.encode(PROMPT_WORDS)
    sampling = SamplingSpec(temperature=1.0)
    counts = np.zeros((pipe.vocab, pipe.vocab))
    decoder = batched(pipe, "model", tree=TreeSpec(6, 3, 2), batch_size=8)
    for _, event in decoder.run(Request(s, ids, 2, sampling, s) for s in range(600)):
        counts[event.token_ids] += 1
    assert chi_square_pvalue(counts, exact_two_token_distribution(pipe, ids, sampling)) > 1e-3
