"""Batched decoding: every row's text is its prompt's own batch-1 text, whatever shares its batch
(chains of drafters and token trees in a batch: test_batched_trees.py).

Batch-1 decoding is proven exact elsewhere (greedy identity, the sampler's exact tests), so each
row is compared with its prompt decoded alone by plain SpeculativeDecoder: at temperature 0 the
target's greedy text, above it the same seed's sampled text (float32, token for token).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
from batch_rows import CACHES, LIMITS, SAMPLED, ScheduledK, alone, assert_row_holds, batched, prompt_ids, run_all
from exact_distribution import PROMPT_WORDS, chi_square_pvalue, exact_two_token_distribution
from profile_helpers import model_profile
from tiny_models import build_model, gpt2_config, llama_config, qwen2_config, save_pair

from specdec_cli import Pipeline, SamplingSpec
from specdec_cli.decoding.batch_k import GoodputK
from specdec_cli.decoding.batched import Request
from specdec_cli.decoding.stop_texts import StopTexts
from specdec_cli.drafters.batched import BatchedModelDrafter
from specdec_cli.errors import UsageError
from specdec_cli.runtime.batched_lm import BatchedLM

DRAFTERS = {
    "none": None,
    "model": lambda pair: {"kind": "model", "model": str(pair["draft"])},
    "early-exit": lambda pair: {"kind": "early-exit", "layers": 2},
    # lookup reads its own row alone (no pool): a row drafts what it drafts alone, and the tests say so
    "ngram": lambda pair: {"kind": "ngram", "max_ngram": 3, "pool_tokens": 0},
}


@pytest.fixture(scope="module")
def pipes(tmp_path_factory, llama_pair) -> dict[str, Pipeline]:
    """A pipeline per drafter (plain decoding uses the model drafter's pipeline with no drafter)."""
    made = {}
    for name, drafter in DRAFTERS.items():
        if drafter is not None:
            folder = tmp_path_factory.mktemp(name)
            made[name] = Pipeline.from_profile(str(model_profile(folder, llama_pair, drafter=drafter(llama_pair))))
    made["none"] = made["model"]
    return made


@pytest.mark.parametrize("drafter", list(DRAFTERS))
@pytest.mark.parametrize("batch_size", [1, 2, 3, 8])  # 3: an odd, ragged batch
@pytest.mark.parametrize("compile", CACHES)
def test_greedy_rows_equal_their_own_batch_one_decoding(pipes, drafter, batch_size, compile):
    """8 prompts of different lengths and limits: below 8 rows, finished rows' slots are refilled."""
    pipe = pipes[drafter]
    prompts = prompt_ids(pipe)
    requests = [Request(i, ids, limit) for i, (ids, limit) in enumerate(zip(prompts, LIMITS))]
    decoder = batched(pipe, drafter, batch_size=batch_size, compile=compile)
    finished = run_all(decoder, requests)
    for i, (ids, limit) in enumerate(zip(prompts, LIMITS)):
        assert (finished[i].token_ids, finished[i].finish_reason) == alone(pipe, ids, limit), (i, drafter, batch_size)
        assert finished[i].stats.new_tokens == len(finished[i].token_ids)
    if drafter in ("model", "early-exit"):
        assert sum(f.stats.accepted for f in finished.values()) > 0  # the drafts were really used


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_each_row_drafts_what_it_drafts_alone(pipes, drafter):
    """A row's drafter reads its own row only: per row, the same drafts are kept in as many target
    forwards as at batch size 1 (where a mixed-up row would still be exact, only slower)."""
    pipe = pipes[drafter]
    prompts = prompt_ids(pipe)
    finished = run_all(batched(pipe, drafter, batch_size=3), [Request(i, ids, 24) for i, ids in enumerate(prompts)])
    single = pipe.decoder(k=4)
    for i, ids in enumerate(prompts):
        stats = pipe.generate(ids, decoder=single, max_new_tokens=24).stats
        assert finished[i].stats.accept_length_histogram == stats.accept_length_histogram, i
        assert finished[i].stats.drafted == stats.drafted, i


@pytest.mark.parametrize("compile", CACHES)
def test_one_token_prompts_first_in_an_empty_cache(pipes, compile):
    """A one-token prompt prefills nothing: as the first row, no cache layer exists yet."""
    pipe = pipes["model"]
    prompts = prompt_ids(pipe)
    one = prompts[3]
    assert len(one) == 1
    jobs = [one, prompts[0], one]
    finished = run_all(batched(pipe, "model", batch_size=2, compile=compile), [Request(i, ids, 12) for i, ids in enumerate(jobs)])
    for i, ids in enumerate(jobs):
        assert finished[i].token_ids == alone(pipe, ids, 12)[0], i


def test_rows_finish_in_completion_order_and_refill_keeps_the_batch_full(pipes):
    pipe = pipes["none"]
    prompts = prompt_ids(pipe)
    limits = [20, 3, 30, 5]
    requests = [Request(f"p{i}", prompts[i], limit) for i, limit in enumerate(limits)]
    order = [key for key, _ in batched(pipe, "none", batch_size=2).run(requests)]
    # p2 took p1's slot after step 3, p3 took p0's after step 20 and ends at step 25, p2 at 33
    assert order == ["p1", "p0", "p3", "p2"]


@pytest.mark.parametrize("drafter", ["model", "ngram"])
@pytest.mark.parametrize("compile", CACHES)
def test_rows_stop_at_eos_inside_an_accepted_draft(pipes, drafter, compile):
    """A token that one prompt's greedy text emits mid-run is made the EOS: that row ends there,
    with nothing after it, while the others go on (and the decoder counts what rows emitted)."""
    pipe = pipes[drafter]
    prompts = prompt_ids(pipe)
    eos = alone(pipe, prompts[0], 30)[0][12]
    decoder = batched(pipe, drafter, batch_size=4, compile=compile)
    decoder.eos_ids = frozenset({eos})
    original, pipe.eos_ids = pipe.eos_ids, frozenset({eos})
    try:
        finished = run_all(decoder, [Request(i, ids, 30) for i, ids in enumerate(prompts)])
        reasons = set()
        for i, ids in enumerate(prompts):
            assert (finished[i].token_ids, finished[i].finish_reason) == alone(pipe, ids, 30), i
            reasons.add(finished[i].finish_reason)
        assert reasons == {"eos", "length"}
        assert finished[0].finish_reason == "eos" and len(finished[0].token_ids) <= 13
        # k: auto's charge for the draft's prompt reads counts prompt tokens per token emitted:
        # the rows that stopped early are counted at what they emitted, not at their 30
        assert decoder.prompt_tokens == sum(len(ids) for ids in prompts)
        assert decoder.budget_tokens == sum(len(f.token_ids) for f in finished.values()) < 30 * len(prompts)
    finally:
        pipe.eos_ids = original


def test_rows_stop_at_their_own_stop_texts(pipes):
    """A stop text from one prompt's greedy text ends that row at the token completing it, as at
    batch size 1; the other rows have none."""
    pipe = pipes["model"]
    prompts = prompt_ids(pipe)
    text = pipe.decode(alone(pipe, prompts[2], 30)[0][8:11])
    check = StopTexts((text,), pipe.decode).check
    requests = [Request(i, ids, 30, stop=check if i == 2 else None) for i, ids in enumerate(prompts)]
    finished = run_all(batched(pipe, "model", batch_size=4), requests)
    single = pipe.generate(prompts[2], decoder=pipe.decoder(drafter=None), max_new_tokens=30, stop=(text,))
    assert (finished[2].token_ids, finished[2].finish_reason) == (single.token_ids, "stop")
    assert len(finished[2].token_ids) <= 11
    for i, ids in enumerate(prompts):
        if i != 2:
            assert finished[i].token_ids == alone(pipe, ids, 30)[0], i


@pytest.mark.parametrize("drafter", ["model", "ngram"])
@pytest.mark.parametrize("compile", CACHES)
def test_rows_stop_at_max_new_tokens_mid_draft(pipes, drafter, compile):
    pipe = pipes[drafter]
    ids = prompt_ids(pipe)[1]
    limits = [1, 2, 5, 7, 11]
    finished = run_all(batched(pipe, drafter, k=8, batch_size=5, compile=compile), [Request(n, ids, n) for n in limits])
    for n in limits:
        assert finished[n].token_ids == alone(pipe, ids, n)[0]
        assert finished[n].finish_reason == "length" and finished[n].stats.new_tokens == n


@pytest.mark.parametrize("drafter", ["model", "ngram"])
@pytest.mark.parametrize("sampling", [SamplingSpec(), SAMPLED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("compile", CACHES)
def test_k_switching_between_steps_leaves_every_row_as_it_is_alone(pipes, drafter, sampling, compile):
    """k: auto's chooser (here one that runs a fixed pseudo-random schedule of 0-4, a few steps
    each) changes a row's k from step to step, and its tokens do not."""
    pipe = pipes[drafter]
    rng = random.Random(0)
    schedule = [(rng.choice([0, 1, 2, 4]), rng.randint(1, 3)) for _ in range(40)]
    prompts = prompt_ids(pipe)
    requests = [Request(i, ids, limit, sampling, 100 + i) for i, (ids, limit) in enumerate(zip(prompts, LIMITS))]
    finished = run_all(batched(pipe, drafter, k=ScheduledK(schedule), batch_size=3, compile=compile), requests)
    for i, (ids, limit) in enumerate(zip(prompts, LIMITS)):
        assert (finished[i].token_ids, finished[i].finish_reason) == alone(pipe, ids, limit, sampling, 100 + i), i
    drafted = [s.drafted for f in finished.values() for s in f.stats.steps]
    assert 0 in drafted and max(drafted) >= 2  # plain steps and drafting steps ran
    assert all(f.stats.k == "auto" for f in finished.values())


class MeasuredFlags(GoodputK):
    """GoodputK that notes, step by step, whether the decoder let the step count."""

    def __init__(self):
        super().__init__()
        self.flags: list[bool] = []

    def next_k(self, measured: bool = True) -> int:
        self.flags.append(measured)
        return super().next_k(measured)


def test_k_auto_counts_neither_a_runs_first_step_nor_a_draining_batch(pipes):
    pipe = pipes["model"]
    chooser = MeasuredFlags()
    run_all(batched(pipe, "model", k=chooser, batch_size=3),
            [Request(i, ids, limit) for i, (ids, limit) in enumerate(zip(prompt_ids(pipe), LIMITS))])
    flags = chooser.flags
    assert flags[0] is False and flags[1] is True  # a run's first step is not counted
    assert flags[-1] is False and True in flags[1:]  # the last rows ran below the batch's size


@pytest.mark.parametrize("compile", CACHES)
@pytest.mark.parametrize("schedule", [[(0, 70), (3, 1)], [(3, 4), (0, 40), (3, 1)]], ids=["plain-first", "draft-plain-draft"])
def test_a_draft_catches_up_after_a_long_plain_run(pipes, compile, schedule):
    """The draft reads nothing until a step drafts; then each row reads what it missed (its prompt,
    and after plain steps what they committed), more than a compiled step's width in one forward:
    at the start of its cache, or after the tokens it read before the plain run."""
    pipe = pipes["model"]
    prompts = [ids for ids in prompt_ids(pipe) if alone(pipe, ids, 90)[1] == "length"][:2]  # rows that run every step
    assert len(prompts) == 2
    finished = run_all(batched(pipe, "model", k=ScheduledK(schedule), batch_size=2, compile=compile),
                       [Request(i, ids, 90) for i, ids in enumerate(prompts)])
    for i, ids in enumerate(prompts):
        assert finished[i].token_ids == alone(pipe, ids, 90)[0], i
    # the first row ran from the first step: its drafts after the catch-up were kept
    assert sum(step.accepted for step in finished[0].stats.steps[sum(n for _, n in schedule[:-1]):]) > 0


@pytest.mark.parametrize("drafter", ["none", "model", "ngram"])
@pytest.mark.parametrize("compile", CACHES)
def test_sampled_rows_equal_their_own_seeded_batch_one_text(pipes, drafter, compile):
    """Temperature 0.8, a seed per prompt: each row is its prompt's batch-1 text of that seed,
    whichever prompts share its batch (the same prompt twice, with two seeds, included)."""
    pipe = pipes[drafter]
    prompts = prompt_ids(pipe)
    jobs = [(ids, limit, 100 + i) for i, (ids, limit) in enumerate(zip(prompts, LIMITS))]
    jobs.append((prompts[0], 24, 7))
    for batch_size in (3, 8):
        requests = [Request(i, ids, limit, SAMPLED, seed) for i, (ids, limit, seed) in enumerate(jobs)]
        finished = run_all(batched(pipe, drafter, batch_size=batch_size, compile=compile), requests)
        for i, (ids, limit, seed) in enumerate(jobs):
            assert finished[i].token_ids == alone(pipe, ids, limit, SAMPLED, seed)[0], (i, batch_size)
    assert finished[0].token_ids != finished[len(jobs) - 1].token_ids  # seeds really differ


def test_greedy_and_sampled_rows_share_a_batch(pipes):
    pipe = pipes["model"]
    prompts = prompt_ids(pipe)
    requests = [Request(i, ids, 20, SAMPLED if i % 2 else SamplingSpec(), i) for i, ids in enumerate(prompts)]
    finished = run_all(batched(pipe, "model", batch_size=4), requests)
    for i, ids in enumerate(prompts):
        assert finished[i].token_ids == alone(pipe, ids, 20, requests[i].sampling, i)[0], i


@pytest.mark.parametrize("slack", [0, 1000])
def test_compacting_every_step_or_never_changes_nothing(pipes, slack):
    pipe = pipes["model"]
    prompts = prompt_ids(pipe)
    decoder = batched(pipe, "model", batch_size=3, slack=slack)
    assert decoder.lm.slack == decoder.drafter.lm.slack == slack
    finished = run_all(decoder, [Request(i, ids, 20) for i, ids in enumerate(prompts)])
    for i, ids in enumerate(prompts):
        assert finished[i].token_ids == alone(pipe, ids, 20)[0], i


@pytest.mark.parametrize("compile", CACHES)
def test_both_caches_hold_each_rows_committed_tokens_after_every_step(pipes, compile):
    pipe = pipes["model"]
    prompts = prompt_ids(pipe)
    # drafting steps and plain steps (the draft reads nothing) in turn
    schedule = ScheduledK([(3, 2), (0, 2), (3, 1), (0, 3), (2, 2)] * 3)
    decoder = batched(pipe, "model", k=schedule, batch_size=3, compile=compile)
    assert isinstance(decoder.drafter, BatchedModelDrafter)
    step, checked = decoder._step, []

    def checked_step(rows, **options):
        events = step(rows, **options)
        for b, row in enumerate(rows):
            committed = list(prompts[row.key]) + row.generated
            assert_row_holds(decoder.lm, b, committed[:-1])  # the newest token waits to be fed
            assert committed[-1] == row.pending
            waiting = len(decoder.drafter.pending[b])
            assert_row_holds(decoder.drafter.lm, b, committed[: len(committed) - waiting])
            assert decoder.drafter.pending[b] == committed[len(committed) - waiting :]
        checked.append(len(rows))
        return events

    decoder._step = checked_step
    run_all(decoder, [Request(i, ids, 16) for i, ids in enumerate(prompts)])
    assert len(checked) > 10


@pytest.fixture(scope="module")
def qwen2_pair(models_root, tokenizer) -> dict:
    target = build_model(qwen2_config(tokenizer), seed=5)
    return save_pair(target, tokenizer, models_root, "qwen2", noise=0.01, seed=6)


@pytest.mark.parametrize("drafter", ["none", "model"])
@pytest.mark.parametrize("family", ["gpt2", "qwen2"])
@pytest.mark.parametrize("compile", CACHES)
def test_other_model_families(request, tmp_path, family, drafter, compile):
    """GPT-2 adds learned position embeddings (from the position ids), Qwen2 has biased q/k/v."""
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, request.getfixturevalue(f"{family}_pair"))))
    prompts = prompt_ids(pipe)
    finished = run_all(batched(pipe, drafter, batch_size=3, compile=compile),
                       [Request(i, ids, 16) for i, ids in enumerate(prompts)])
    for i, ids in enumerate(prompts):
        assert finished[i].token_ids == alone(pipe, ids, 16)[0], i


def test_a_model_without_masked_attention_is_refused_in_a_batch(pipes):
    flash = SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2"))
    with pytest.raises(UsageError, match="batched decoding needs sdpa or eager attention.*use --batch-size 1"):
        BatchedLM(flash, pipes["model"].vocab)


def test_sampled_rows_follow_the_target_exactly(tmp_path, small_vocab_pair):
    """Temperature 1, one prompt with 1200 seeds in batches of 8: the two tokens of each row
    follow the target's exact joint distribution (chi-square, as at batch size 1)."""
    spec = {"kind": "model", "model": str(small_vocab_pair["draft"])}
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, small_vocab_pair, drafter=spec, chat=False)))
    pipe.eos_ids = frozenset()  # every row has two tokens
    ids = pipe.encode(PROMPT_WORDS)
    sampling = SamplingSpec(temperature=1.0)
    counts = np.zeros((pipe.vocab, pipe.vocab))
    for _, event in batched(pipe, "model", k=3, batch_size=8).run(Request(s, ids, 2, sampling, s) for s in range(1200)):
        counts[event.token_ids] += 1
    assert chi_square_pvalue(counts, exact_two_token_distribution(pipe, ids, sampling)) > 1e-3


def test_a_row_at_the_end_of_the_context_pads_within_it(models_root, tokenizer):
    """GPT-2's learned positions end at its context: a row on its last token beside rows that draft
    k more must not give its pads positions past the end."""
    target = build_model(gpt2_config(tokenizer, max_positions=48), seed=3)
    pair = save_pair(target, tokenizer, models_root, "gpt2-short", noise=0.01, seed=4)
    pipe = Pipeline.from_profile(str(model_profile(models_root, pair, name="short")))
    assert pipe.context_length == 48
    long_prompt = (prompt_ids(pipe)[7] * 3)[:44]  # room for 4 new tokens
    prompts = [long_prompt, prompt_ids(pipe)[0]]
    finished = run_all(batched(pipe, "model", k=6, batch_size=2), [Request(i, ids, 20) for i, ids in enumerate(prompts)])
    for i, ids in enumerate(prompts):
        assert finished[i].token_ids == alone(pipe, ids, pipe.limit_for(len(ids), 20))[0], i
    assert len(finished[0].token_ids) == 4


@pytest.fixture(scope="module")
def one_layer_pipe(tmp_path_factory, tokenizer) -> Pipeline:
    """A one-layer target and its noisy copy as the draft: compiling costs seconds a layer, and the
    compiled batch path is the same at any depth."""
    root = tmp_path_factory.mktemp("one-layer")
    pair = save_pair(build_model(llama_config(tokenizer, layers=1), seed=11), tokenizer, root, "llama", noise=0.01, seed=12)
    return Pipeline.from_profile(str(model_profile(root, pair)))


def test_compiled_batch_steps_give_each_rows_own_text(one_layer_pipe):
    """compile: on, the model drafter: the target's and the draft's steps really compiled (both
    graphs each, before the first row joined), and every row is still its prompt's own text."""
    pipe = one_layer_pipe
    prompts = prompt_ids(pipe)[:5]
    decoder = batched(pipe, "model", batch_size=3, compile="on")
    finished = run_all(decoder, [Request(i, ids, limit) for i, (ids, limit) in enumerate(zip(prompts, LIMITS))])
    for lm in (decoder.lm, decoder.drafter.lm):
        assert lm.settings.enabled and lm.step.widths == {1, 2} and lm.compile_seconds > 0
    for i, (ids, limit) in enumerate(zip(prompts, LIMITS)):
        assert finished[i].token_ids == alone(pipe, ids, limit)[0], i
    assert sum(f.stats.accepted for f in finished.values()) > 0  # the compiled draft was used
