"""Pipeline.generate_many: input order, a PromptError in place of a prompt that cannot run, seed + i,
the kept decoder carried across prompts, and the batch-size seam."""

from __future__ import annotations

import random

import pytest

from profile_helpers import model_profile
from specdec_cli import Generation, Pipeline, PromptError, UsageError
from specdec_cli.prompt_runs import in_order, resolve_batch_size

PROMPTS = ["def reverse(items):", "class Stack:", "import os"]


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


def test_batch_sizes(pipe):
    assert resolve_batch_size(1) == resolve_batch_size("auto") == 1
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(UsageError, match="not a whole number of at least 1 or 'auto'"):
            resolve_batch_size(bad)
    with pytest.raises(UsageError, match="batched decoding is not in this build yet"):
        pipe.generate_many(PROMPTS, batch_size=2)  # refused at the call, before any prompt runs


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
