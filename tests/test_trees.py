"""Token trees: the mask, the caches, greedy identity and the exact sampling rule (issue 13)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch

import specdec_cli.acceptance as acceptance
from conftest import model_profile
from specdec_cli import Pipeline, SamplingSpec, Verified
from specdec_cli.acceptance import accept_greedy, accept_probabilities, accept_sampled, residual_distribution
from specdec_cli.drafters.ngram import merge_runs
from specdec_cli.lm import make_lm
from specdec_cli.specs import TreeSpec
from specdec_cli.tree import TreeAttention, path_to
from test_kv_cache import assert_cache_holds
from test_sampling_exact import PROMPT_WORDS, chi_square_pvalue, exact_two_token_distribution
from tiny_models import build_model, gpt2_config, llama_config


def random_tree(m: int, rng: random.Random) -> tuple[int, ...]:
    return tuple(rng.randrange(-1, i) for i in range(m))


def qwen2_config(tokenizer):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )


CONFIGS = {"llama": llama_config, "qwen2": qwen2_config, "gpt2": gpt2_config}


def last_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


# --------------------------------------------------------------------------- the mask and the path gather


@pytest.mark.parametrize("compile", ["off", "static"])
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_every_node_scores_as_a_plain_forward_over_its_own_path(tokenizer, arch, compile):
    """The target's logits at each node of a random tree equal a forward over the prefix and that
    node's path alone; after keeping one path, the cache continues as if only it had been read."""
    model = build_model(CONFIGS[arch](tokenizer), seed=5)
    vocab = model.config.vocab_size
    rng = random.Random(arch)
    for trial in range(3):
        prefix = [rng.randrange(5, vocab) for _ in range(7 + trial)]
        parents = random_tree(12 + 8 * trial, rng)
        tokens = [rng.randrange(5, vocab) for _ in parents]
        lm = make_lm(model, vocab, compile)
        lm.reset()
        lm.prefill(torch.tensor(prefix[:-1]))
        base = lm.length
        tree = TreeAttention.for_nodes(base, parents, root_position=base, with_root=True)
        logits = lm.forward(torch.tensor(prefix[-1:] + tokens), keep=len(tokens) + 1, tree=tree).float()
        assert torch.allclose(logits[0], last_logits(model, prefix), atol=1e-4)
        for node in range(len(parents)):
            path = [tokens[i] for i in path_to(parents, node)]
            assert torch.allclose(logits[node + 1], last_logits(model, prefix + path), atol=1e-4), (node, parents)
        # keep the deepest node's path, then one more token: as if the other branches never existed
        deepest = max(range(len(parents)), key=lambda i: len(path_to(parents, i)))
        kept = path_to(parents, deepest)
        lm.keep_path(base + 1, [base + 1 + i for i in kept])
        assert lm.length == base + 1 + len(kept)
        path = [tokens[i] for i in kept]
        after = lm.forward(torch.tensor([7]), keep=1).float()[0]
        assert torch.allclose(after, last_logits(model, prefix + path + [7]), atol=1e-4)


# --------------------------------------------------------------------------- greedy identity

DRAFTERS = {
    "model": lambda pair: {"kind": "model", "model": str(pair["draft"])},
    "ngram": lambda pair: {"kind": "ngram", "max_ngram": 3},
    "early-exit": lambda pair: {"kind": "early-exit", "layers": 2},
    "chain": lambda pair: {"kind": "chain", "drafters": [{"kind": "ngram"}, {"kind": "model", "model": str(pair["draft"])}]},
}
PROMPTS = ["def add(a, b):", "for i in range(10):\n    print(i * i)\nfor i in range(10):\n", "The quick brown fox"]
SHAPES = [TreeSpec(4, 2, 2), TreeSpec(12, 3, 4), TreeSpec(24, 4, 6), TreeSpec(64, 4, 6), TreeSpec(6, 1, 6), TreeSpec(9, 3, 1)]


def pipeline_for(tmp_path, pair, drafter: str, **fields) -> Pipeline:
    return Pipeline.from_profile(str(model_profile(tmp_path, pair, drafter=DRAFTERS[drafter](pair), **fields)))


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_tree_drafts_keep_greedy_identity(tmp_path, llama_pair, drafter):
    pipe = pipeline_for(tmp_path, llama_pair, drafter)
    branched = accepted = 0
    for prompt in PROMPTS:
        ids = pipe.encode(prompt, chat=False)
        expected = pipe.transformers_generate(ids, 40)
        for shape in SHAPES:
            result = pipe.generate(ids, decoder=pipe.decoder(tree=shape), max_new_tokens=40)
            assert result.token_ids == expected, (prompt, shape)
            accepted += result.stats.accepted
            branched += sum(s.depth is not None for s in result.stats.steps)
    assert accepted > 0
    if drafter != "ngram":  # prompt lookup branches only where a prompt repeats itself with variations
        assert branched > 0


def test_gpt2_tree_keeps_greedy_identity(tmp_path, gpt2_pair):
    pipe = pipeline_for(tmp_path, gpt2_pair, "model")
    for prompt in PROMPTS:
        ids = pipe.encode(prompt, chat=False)
        expected = pipe.transformers_generate(ids, 32)
        for shape in (TreeSpec(16, 4, 4), TreeSpec(8, 2, 6)):
            assert pipe.generate(ids, decoder=pipe.decoder(tree=shape), max_new_tokens=32).token_ids == expected


def test_tree_stops_at_eos_and_max_new_tokens_inside_an_accepted_path(tmp_path, llama_pair):
    pipe = pipeline_for(tmp_path, llama_pair, "model")
    ids = pipe.encode(PROMPTS[0], chat=False)
    for limit in (1, 2, 5, 11):
        expected = pipe.transformers_generate(ids, limit)
        for shape in (TreeSpec(12, 3, 4), TreeSpec(24, 4, 6)):
            result = pipe.generate(ids, decoder=pipe.decoder(tree=shape), max_new_tokens=limit)
            assert result.token_ids == expected and result.finish_reason == "length"
    free_run = pipe.transformers_generate(ids, 40)
    pipe.eos_ids = frozenset({free_run[17]})
    expected = pipe.transformers_generate(ids, 40)
    for shape in SHAPES:
        result = pipe.generate(ids, decoder=pipe.decoder(tree=shape), max_new_tokens=40)
        assert result.token_ids == expected and result.finish_reason == "eos"


def test_tree_auto_keeps_greedy_identity_and_learns(tmp_path, llama_pair):
    pipe = pipeline_for(tmp_path, llama_pair, "model")
    decoder = pipe.decoder(tree=TreeSpec(32, 4, 12, auto=True))
    for prompt in PROMPTS:
        ids = pipe.encode(prompt, chat=False)
        result = pipe.generate(ids, decoder=decoder, max_new_tokens=40)
        assert result.token_ids == pipe.transformers_generate(ids, 40)
    assert decoder.lookahead.records["model"].judged > 0


# --------------------------------------------------------------------------- the caches


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("drafter", ["model", "early-exit"])
def test_tree_caches_hold_exactly_the_committed_tokens(tmp_path, llama_pair, drafter, temperature):
    pipe = pipeline_for(tmp_path, llama_pair, drafter)
    prompt = pipe.encode("def reverse(items):", chat=False)
    trees = 0
    for seed, shape in enumerate((TreeSpec(12, 3, 4), TreeSpec(24, 4, 6))):
        decoder = pipe.decoder(tree=shape)
        committed = list(prompt)
        sampling = SamplingSpec(temperature=temperature)
        for event in pipe.stream(prompt, decoder=decoder, sampling=sampling, seed=seed, max_new_tokens=30):
            if not isinstance(event, Verified):
                continue
            committed += event.emitted
            trees += event.tree
            assert_cache_holds(decoder.lm, committed[:-1])
            held = decoder.drafter.lm.length
            assert_cache_holds(decoder.drafter.lm, committed[:held])
            assert decoder.drafter.pending.tolist() == committed[held:]
    assert trees > 5


# --------------------------------------------------------------------------- the sampling rule, exactly


def exact_row_distribution(p, children, q_rows, accept=accept_probabilities, residual_of=residual_distribution):
    """The distribution of the token the rule emits at one row, for FIXED children, by the code's
    acceptance probability and residual: child j is taken with what is left after siblings
    1..j-1 were rejected; if all are, the token comes from the last residual."""
    out = torch.zeros_like(p, dtype=torch.float64)
    r, still = p, 1.0
    for child, q in zip(children, q_rows):
        a = float(accept(torch.tensor([child]), None if q is None else q[None], r[None])[0])
        out[child] += still * a
        still *= 1 - a
        r = residual_of(r, torch.nn.functional.one_hot(torch.tensor(child), p.shape[0]).float() if q is None else q)
    return out + still * r.double()


def sampled_children_distribution(p, q, width, **rule):
    """Children drawn i.i.d. from q (all V^width draws, weighted by their probability)."""
    out = torch.zeros_like(p, dtype=torch.float64)
    for children in itertools.product(range(p.shape[0]), repeat=width):
        weight = float(np.prod([float(q[c]) for c in children]))
        if weight:
            out += weight * exact_row_distribution(p, children, [q] * width, **rule)
    return out


CASES = {
    "close": (torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0]), torch.tensor([0.3, 0.3, 0.2, 0.1, 0.1])),
    "q zero where p is positive": (torch.tensor([0.2, 0.3, 0.1, 0.3, 0.1]), torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0])),
    "p zero where q is positive": (torch.tensor([0.0, 0.0, 0.6, 0.4, 0.0]), torch.tensor([0.25, 0.25, 0.25, 0.25, 0.0])),
    "peaked": (torch.tensor([0.9, 0.05, 0.05, 0.0, 0.0]), torch.tensor([0.1, 0.1, 0.1, 0.1, 0.6])),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("width", [1, 2, 3])
def test_sampled_siblings_follow_p_exactly(case, width):
    p, q = CASES[case]
    assert torch.allclose(sampled_children_distribution(p, q, width), p.double(), atol=1e-6)


@pytest.mark.parametrize("case", list(CASES))
def test_deterministic_siblings_follow_p_exactly(case):
    """A drafter with no q (prompt lookup, top-w): sibling elimination, duplicates included."""
    p, _ = CASES[case]
    for children in [(0,), (0, 1), (2, 0, 4), (1, 1, 3), (4, 3, 2, 1, 0)]:
        assert torch.allclose(exact_row_distribution(p, children, [None] * len(children)), p.double(), atol=1e-6)


def test_a_rule_without_the_residual_update_is_caught():
    """Judging every sibling against p itself (as if the siblings were independent) is not exact."""
    p, q = CASES["close"]
    wrong = sampled_children_distribution(p, q, 2, residual_of=lambda r, q: r)
    assert not torch.allclose(wrong, p.double(), atol=1e-3)


def test_accept_sampled_on_a_two_level_tree_follows_p():
    """The vectorised rule itself, many times, on a hand-made tree with children drawn from q:
    the first two tokens follow p exactly (chi-square against the exact joint)."""
    gen = torch.Generator().manual_seed(0)
    vocab = 5
    p_root, q_root = CASES["close"]
    p_next = torch.softmax(torch.randn(vocab, vocab, generator=gen), dim=-1)  # p(. | first token)
    q_next = torch.softmax(torch.randn(vocab, vocab, generator=gen), dim=-1)
    joint = (p_root[:, None] * p_next).double().numpy()
    counts = np.zeros((vocab, vocab))
    for _ in range(4000):
        first = torch.multinomial(q_root, 2, replacement=True, generator=gen).tolist()
        second = [torch.multinomial(q_next[c], 2, replacement=True, generator=gen).tolist() for c in first]
        tokens = first + second[0] + second[1]
        parents = (-1, -1, 0, 0, 1, 1)
        draft_probs = torch.stack([q_root, q_root, q_next[first[0]], q_next[first[0]], q_next[first[1]], q_next[first[1]]])
        rows = [p_root] + [p_next[t] for t in tokens]
        n, end, token = accept_sampled(torch.tensor(tokens), parents, draft_probs, torch.stack(rows), gen)
        emitted = [tokens[i] for i in path_to(parents, int(end))] + [int(token)]
        if len(emitted) == 1:  # only one token came out: draw the second from p, as the next step would
            emitted.append(int(torch.multinomial(p_next[emitted[0]], 1, generator=gen)))
        counts[emitted[0], emitted[1]] += 1
    assert chi_square_pvalue(counts, joint) > 1e-3


def test_accept_greedy_follows_the_argmax_through_the_tree():
    parents = (-1, -1, 0, 1, 1, 3)
    tokens = torch.tensor([4, 2, 1, 3, 0, 2])
    logits = torch.full((7, 5), -9.0)
    for row, best in enumerate([2, 0, 3, 1, 2, 0, 4]):  # root -> 2 (node 1) -> 3 (node 3) -> 2 (node 5) -> 4
        logits[row, best] = 0.0
    n, end, token = accept_greedy(tokens, parents, logits)
    assert (int(n), int(end), int(token)) == (3, 5, 4)


def test_merge_runs_shares_prefixes_within_the_budget():
    runs = [np.array([5, 6, 7]), np.array([5, 6, 8]), np.array([9])]
    assert merge_runs(runs, 10) == ([5, 6, 7, 8, 9], [-1, 0, 1, 1, -1])
    assert merge_runs(runs, 3) == ([5, 6, 7], [-1, 0, 1])


# --------------------------------------------------------------------------- the whole loop, sampling

LOOP_SAMPLES = 1500  # (prompt lookup's branches are deterministic: the enumeration above covers them)


def word_pipeline(tmp_path, pair) -> Pipeline:
    drafter = {"kind": "model", "model": str(pair["draft"])}
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, pair, drafter=drafter, chat=False)))
    pipe.eos_ids = frozenset()  # every sample has two tokens
    return pipe


def two_token_counts(pipe, ids, sampling, shape, samples):
    counts = np.zeros((pipe.vocab, pipe.vocab))
    decoder = pipe.decoder(tree=shape)
    for seed in range(samples):
        t1, t2 = pipe.generate(ids, decoder=decoder, sampling=sampling, max_new_tokens=2, seed=seed).token_ids
        counts[t1, t2] += 1
    return counts


def test_tree_loop_first_two_tokens_follow_the_target(tmp_path, small_vocab_pair):
    pipe = word_pipeline(tmp_path, small_vocab_pair)
    ids = pipe.encode(PROMPT_WORDS)
    sampling = SamplingSpec(temperature=1.0)
    joint = exact_two_token_distribution(pipe, ids, sampling)
    counts = two_token_counts(pipe, ids, sampling, TreeSpec(6, 3, 2), LOOP_SAMPLES)
    assert chi_square_pvalue(counts, joint) > 1e-3


def test_the_same_loop_test_catches_a_rule_without_the_residual_update(tmp_path, small_vocab_pair, monkeypatch):
    monkeypatch.setattr(acceptance, "residual_distribution", lambda r, q: r)
    pipe = word_pipeline(tmp_path, small_vocab_pair)
    ids = pipe.encode(PROMPT_WORDS)
    sampling = SamplingSpec(temperature=1.0)
    joint = exact_two_token_distribution(pipe, ids, sampling)
    counts = two_token_counts(pipe, ids, sampling, TreeSpec(6, 3, 2), LOOP_SAMPLES)
    assert chi_square_pvalue(counts, joint) < 1e-3


def test_a_step_counts_as_judged_only_the_children_the_rule_looked_at():
    """Root children a, b, c and b kept, then b's child d rejected: at temperature 0 all three
    root children were compared with the target's choice; sampling stops at the kept one, so c
    was never judged (and must not count as a rejection for k: auto / tree: auto)."""
    from specdec_cli.drafters.base import Draft
    from specdec_cli.engine import SpeculativeDecoder

    draft = Draft(torch.tensor([5, 6, 7, 8]), None, "m", parents=(-1, -1, -1, 1), confidences=(0.5, 0.3, 0.1, 0.4))
    judged = {}
    for sampled in (False, True):
        event = SpeculativeDecoder.step_event(draft, [5, 6, 7, 8], [1], 9, [6, 9], sampled=sampled, seconds=0.01)
        judged[sampled] = [(confidence, kept) for confidence, _, kept, _ in event.judged]
    assert judged[False] == [(0.5, False), (0.3, True), (0.1, False), (0.4, False)]
    assert judged[True] == [(0.5, False), (0.3, True), (0.4, False)]
