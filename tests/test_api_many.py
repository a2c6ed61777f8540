"""Pipeline.generate_many: input order, a PromptError in place of a prompt that cannot run, seed + i,
the kept decoder carried across prompts, and batches: each row its prompt's batch-1 generation."""

from __future__ import annotations

import random

import pytest

from profile_helpers import model_profile
from specdec_cli import Generation, Pipeline, PromptError, SamplingSpec, UsageError
from specdec_cli.prompt_runs import in_order, resolve_batch_size

PROMPTS = ["def reverse(items):", "class Stack:", "import os"]
BATCH_PROMPTS = PROMPTS + ["x", "The quick brown fox jumps over the lazy dog", "for i in range(10):\n    print(i)\n"]


@pytest.fixture
def pipe(tmp_path, llama_pair) -> Pipeline:
    return Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, k="auto", max_new_tokens=12,
                                                   adaptive={"k_max": 8, "threshold": 0.3})))


def test_results_in_input_order_with_errors_in_place(pipe):
    ids = pipe.encode(PROMPTS[1], chat=False)
    prompts = [PROMPTS[0], "   ", ids, "word " * 600, PROMPTS[2]]
    results = list(pipe.generate_many(prompts, chat=False))
    assert [type(r) for r in results] == [Generation, PromptError, Generation, PromptError, Generation]
    assert results[1] == PromptError(1, "the prompt is empty")
    assert results[3].index == 3 and "context" in results[3].message
    for result, prompt in zip(results[::2], prompts[::2]):
        assert result.token_ids == pipe.generate(prompt, chat=False).token_ids  # temperature 0
    assert results[2].prompt_tokens == len(ids)


def test_the_kept_decoder_carries_what_k_auto_learned(pipe):
    results = list(pipe.generate_many(PROMPTS, chat=False))
    assert pipe.kept_decoder.lookahead.steps == sum(len(r.stats.steps) for r in results)


def test_prompt_i_draws_with_seed_plus_i(pipe):
    from specdec_cli.specs import SamplingSpec

    sampling = SamplingSpec(temperature=0.9)
    results = list(pipe.generate_many([PROMPTS[0]] * 3, seed=40, sampling=sampling, chat=False))
    assert [r.seed for r in results] == [40, 41, 42]
    for i, result in enumerate(results):
        assert result.token_ids == pipe.generate(PROMPTS[0], seed=40 + i, sampling=sampling, chat=False).token_ids
    assert len({r.token_ids for r in results}) == 3  # one prompt three times: three draws
    unseeded = list(pipe.generate_many(PROMPTS[:2], sampling=sampling, chat=False))
    assert unseeded[1].seed == unseeded[0].seed + 1  # a fresh base, still one seed a prompt


def test_batch_sizes():
    assert resolve_batch_size(1) == 1 and resolve_batch_size(256) == 256 and resolve_batch_size("auto") == "auto"
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(UsageError, match="not a whole number of at least 1 or 'auto'"):
            resolve_batch_size(bad)
    with pytest.raises(UsageError, match="batch size 257: at most 256 prompts are decoded at once"):
        resolve_batch_size(257)


@pytest.mark.parametrize("sampling", [SamplingSpec(), SamplingSpec(temperature=0.8)], ids=["greedy", "seeded"])
def test_a_batch_of_4_gives_each_prompt_its_batch_one_generation(pipe, sampling, monkeypatch):
    """k: auto in a batch (GoodputK, k = 0 among its choices): the tokens do not depend on it."""
    prompts = BATCH_PROMPTS
    batched = list(pipe.generate_many(prompts, batch_size=4, seed=9, sampling=sampling, chat=False, max_new_tokens=10))
    assert [r.seed for r in batched] == ([None] * 6 if sampling.greedy else list(range(9, 15)))
    for i, (result, prompt) in enumerate(zip(batched, prompts)):
        alone = pipe.generate(prompt, seed=9 + i, sampling=sampling, chat=False, max_new_tokens=10)
        assert (result.token_ids, result.text, result.finish_reason) == \
            (alone.token_ids, alone.text, alone.finish_reason), prompt
        assert result.stats.k == "auto" and result.prompt_tokens == alone.prompt_tokens
    chooser = pipe._batch_k[4]  # what the run learned stays for the next run at this size
    assert sum(len(samples) for samples in chooser.samples.values()) > 0
    # the next run at this size steps the same chooser (not its sample count: a new round clears samples)
    recorded = []
    record = chooser.record
    monkeypatch.setattr(chooser, "record", lambda *args, **kwargs: (recorded.append(args), record(*args, **kwargs))[1])
    list(pipe.generate_many(prompts[:2], batch_size=4, chat=False, max_new_tokens=4))
    assert pipe._batch_k[4] is chooser and recorded


def test_errors_in_a_batch_take_their_place_and_the_rest_run(pipe):
    prompts = [BATCH_PROMPTS[0], "   ", "word " * 600, [], BATCH_PROMPTS[1], BATCH_PROMPTS[2]]
    results = list(pipe.generate_many(prompts, batch_size=2, chat=False, stop=("\n",)))
    assert [type(r) for r in results] == [Generation, PromptError, PromptError, PromptError, Generation, Generation]
    assert results[1] == PromptError(1, "the prompt is empty")
    assert "context" in results[2].message and results[3] == PromptError(3, "the prompt has no tokens")
    for result, prompt in zip(results[4:], prompts[4:]):
        alone = pipe.generate(prompt, chat=False, stop=("\n",))
        assert (result.token_ids, result.text, result.finish_reason) == (alone.token_ids, alone.text, alone.finish_reason)


def test_a_tree_profile_runs_in_a_batch_and_under_auto(tmp_path, llama_pair):
    tree = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, tree={"nodes": 6, "width": 2, "depth": 3})))
    prompts = ["class Stack:", "def add(a, b):", "x"]
    alone = [tree.generate(p, chat=False, max_new_tokens=12).token_ids for p in prompts]
    for size in (2, "auto"):
        assert [r.token_ids for r in tree.generate_many(prompts, batch_size=size, chat=False, max_new_tokens=12)] == alone


def test_in_order_yields_each_result_once_all_before_it_are_in():
    order = list(range(20))
    random.Random(3).shuffle(order)
    seen: list[int] = []
    arrived: list[int] = []

    def arriving():
        for index in order:
            arrived.append(index)
            yield index, f"row {index}"

    for result in in_order(arriving()):
        index = int(result.split()[1])
        assert index == len(seen)
        # yielded the moment it and every one before it had arrived, not one arrival later
        assert len(arrived) == 1 + max(order.index(i) for i in range(index + 1))
        seen.append(index)
    assert seen == list(range(20))


def test_in_order_refuses_to_end_short():
    with pytest.raises(RuntimeError, match="no result for prompt 1"):
        list(in_order([(0, "a"), (2, "c")]))


def test_a_k_by_batch_size_table_sets_the_batch_k(tmp_path, llama_pair):
    """tune-k --batch-sizes' table: its k for the batch size runs (0: plain, no draft forward),
    over the profile's k; below its first entry the profile's k applies. Rows stay exact."""
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, k=3, max_new_tokens=8,
                                                   k_by_batch_size={2: 2, 4: 0})))
    assert pipe.batched_decoder(3).k == 2 and pipe.batched_decoder(4).k == 0 and pipe.batched_decoder(8).k == 0
    batched = list(pipe.generate_many(BATCH_PROMPTS, batch_size=4, chat=False))
    for result, prompt in zip(batched, BATCH_PROMPTS):
        assert result.token_ids == pipe.generate(prompt, chat=False).token_ids
        assert result.stats.drafted == 0  # plain at this size
