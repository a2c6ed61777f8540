"""Prompt lookup across requests: the pool's search and bound, a later prompt drafting from an
earlier answer (`ngram/pool`) with the target's tokens unchanged, `pool_tokens: 0` turning it
off, and bench's generations each standing alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from profile_helpers import model_profile

from specdec_cli import Pipeline
from specdec_cli.drafters import lookup_pool
from specdec_cli.drafters.lookup_pool import LookupPool
from specdec_cli.drafters.ngram import NgramDrafter
from specdec_cli.specs import SamplingSpec, TreeSpec

CHAIN_OF_4 = TreeSpec(nodes=4, width=1, depth=4)


def test_the_longest_ngram_with_a_continuation_wins_and_only_one_longer_than_the_askers():
    pool = LookupPool()
    pool.open([1, 2, 3, 4, 5, 6, 7, 8])
    assert pool.find(np.array([9, 1, 2, 3, 4]), 3, shorter_than=0)[1] == 4
    assert pool.find(np.array([9, 9, 2, 3, 4]), 3, shorter_than=0)[0].tolist() == [5, 6, 7]
    assert pool.find(np.array([9, 9, 2, 3, 4]), 3, shorter_than=3)[1] == 0  # the asker's own 3-gram is as long
    assert pool.find(np.array([6, 7, 8]), 3, shorter_than=0)[1] == 0  # nothing followed 7, 8 yet
    later = pool.open([7, 8, 9, 10])
    pool.extend(later, [11])
    assert pool.find(np.array([5, 7, 8]), 3, shorter_than=0)[0].tolist() == [9, 10, 11]  # the latest occurrence


def test_a_hash_shared_by_another_ngram_is_never_proposed(monkeypatch):
    monkeypatch.setattr(lookup_pool, "_hashes", lambda tokens, n: np.zeros(len(tokens) - n + 1, dtype=np.uint64))
    pool = LookupPool()
    pool.open([1, 2, 3, 4, 5])
    assert pool.find(np.array([3, 4]), 3, shorter_than=0)[0].tolist() == [5]  # the latest entry: its tokens match
    assert pool.find(np.array([8, 9]), 3, shorter_than=0)[1] == 0  # the same hash, other tokens


def test_the_oldest_sequences_leave_past_the_bound_with_their_entries():
    pool = LookupPool(limit=30)
    first = pool.open(list(range(100, 120)))
    second = pool.open(list(range(200, 215)))  # 35 tokens: the first leaves
    assert list(pool.sequences) == [second] and pool.tokens == 15
    assert pool.find(np.array([101, 102, 103]), 3, shorter_than=0)[1] == 0
    assert all(hit >> 32 == second for hit in pool.index.values())
    pool.extend(first, [1, 2, 3])  # a sequence that left takes no more tokens
    assert pool.tokens == 15
    pool.extend(second, list(range(300, 340)))  # the one sequence left stays, however long
    assert list(pool.sequences) == [second] and pool.tokens == 55


def test_a_second_drafter_proposes_what_followed_in_the_firsts_sequence(tiny_context):
    pool = LookupPool()
    sampling = SamplingSpec()
    first, second = (NgramDrafter(tiny_context, pool=pool) for _ in range(2))
    first.begin(torch.tensor([5, 6, 7]), sampling, None)
    first.accept([40, 41, 42, 43, 44, 45], [])
    second.begin(torch.tensor([9, 9, 41, 42, 43]), sampling, None)
    draft = second.propose(CHAIN_OF_4)
    assert draft.drafter == "ngram/pool" and draft.token_ids.tolist() == [44, 45]
    alone = NgramDrafter(tiny_context)
    alone.begin(torch.tensor([9, 9, 41, 42, 43]), sampling, None)
    assert alone.propose(CHAIN_OF_4) is None


@pytest.fixture
def tiny_context(tmp_path, llama_pair):
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, drafter={"kind": "ngram"})))
    return _context(pipe)


def _context(pipe: Pipeline):
    from specdec_cli.drafters.base import DraftContext

    return DraftContext(target=pipe.target, tokenizer=pipe.tokenizer, vocab=pipe.vocab, device=pipe.device,
                        load_model=pipe.load_draft_model, load_tokenizer=pipe.load_draft_tokenizer, target_name="t")


def _pipe(tmp_path, llama_pair, **ngram) -> Pipeline:
    return Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, drafter={"kind": "ngram", **ngram},
                                                   k=4, max_new_tokens=20)))


@pytest.mark.parametrize("batch_size", [1, 3])
def test_later_prompts_draft_from_earlier_answers_and_keep_the_targets_tokens(tmp_path, llama_pair, batch_size):
    prompts = ["def reverse(items):", "class Stack:", "def reverse(items):", "class Stack:"]
    pooled = _pipe(tmp_path, llama_pair)
    results = list(pooled.generate_many(prompts, batch_size=batch_size, chat=False))
    plain = pooled.decoder(drafter=None)
    for prompt, result in zip(prompts, results):
        assert result.token_ids == pooled.generate(prompt, decoder=plain, chat=False).token_ids
    alone = list(_pipe(tmp_path, llama_pair, pool_tokens=0).generate_many(prompts, batch_size=batch_size, chat=False))
    assert alone[0].token_ids == results[0].token_ids
    assert "ngram/pool" not in {n for r in alone for n in r.stats.per_drafter}
    # the repeated prompts' answers come from the pool: fewer target forwards than alone
    assert sum(r.stats.per_drafter.get("ngram/pool", {}).get("accepted", 0) for r in results[2:]) > 0
    assert sum(r.stats.target_forwards for r in results[2:]) < sum(r.stats.target_forwards for r in alone[2:])


def test_bench_repeats_read_no_earlier_answer(tmp_path, llama_pair):
    from specdec_cli.bench.engine_methods import EngineMethod

    pipe = _pipe(tmp_path, llama_pair)
    method = EngineMethod("specdec", pipe, k=4)
    ids = pipe.encode("def reverse(items):", chat=False)
    runs = [method.run(ids, 20, SamplingSpec(), 0) for _ in range(2)]
    assert runs[0]["target_forwards"] == runs[1]["target_forwards"]
    assert runs[0]["accepted"] == runs[1]["accepted"]
