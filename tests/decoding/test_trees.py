"""Token trees: the mask, the caches, greedy identity and the acceptance rule over a tree."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from cache_checks import assert_cache_holds
from profile_helpers import model_profile
from tiny_models import build_model, gpt2_config, llama_config

from specdec_cli import Pipeline, SamplingSpec, Verified
from specdec_cli.decoding.acceptance import accept_rows
from specdec_cli.drafters.ngram import merge_runs
from specdec_cli.primitives.tree import TreeAttention, path_to
from specdec_cli.runtime.lm import make_lm
from specdec_cli.specs import TreeSpec
from specdec_cli.decoding.transformers_generate import transformers_generate


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
        expected = transformers_generate(pipe, ids, 40)
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
        expected = transformers_generate(pipe, ids, 32)
        for shape in (TreeSpec(16, 4, 4), TreeSpec(8, 2, 6)):
            assert pipe.generate(ids, decoder=pipe.decoder(tree=shape), max_new_tokens=32).token_ids == expected


def test_tree_stops_at_eos_and_max_new_tokens_inside_an_accepted_path(tmp_path, llama_pair):
    pipe = pipeline_for(tmp_path, llama_pair, "model")
    ids = pipe.encode(PROMPTS[0], chat=False)
    for limit in (1, 2, 5, 11):
        expected = transformers_generate(pipe, ids, limit)
        for shape in (TreeSpec(12, 3, 4), TreeSpec(24, 4, 6)):
            result = pipe.generate(ids, decoder=pipe.decoder(tree=shape), max_new_tokens=limit)
            assert result.token_ids == expected and result.finish_reason == "length"
    free_run = transformers_generate(pipe, ids, 40)
    pipe.eos_ids = frozenset({free_run[17]})
    expected = transformers_generate(pipe, ids, 40)
    for shape in SHAPES:
        result = pipe.generate(ids, decoder=pipe.decoder(tree=shape), max_new_tokens=40)
        assert result.token_ids == expected and result.finish_reason == "eos"


def test_tree_auto_keeps_greedy_identity_and_learns(tmp_path, llama_pair):
    pipe = pipeline_for(tmp_path, llama_pair, "model")
    decoder = pipe.decoder(tree=TreeSpec(32, 4, 12, auto=True))
    for prompt in PROMPTS:
        ids = pipe.encode(prompt, chat=False)
        result = pipe.generate(ids, decoder=decoder, max_new_tokens=40)
        assert result.token_ids == transformers_generate(pipe, ids, 40)
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


# --------------------------------------------------------------------------- the acceptance rule over a tree
# (its distribution above temperature 0, tree and broken verifier included: test_sampling_exact.py)


def test_accept_follows_the_choices_through_the_tree():
    parents = (-1, -1, 0, 1, 1, 3)
    tokens = torch.tensor([4, 2, 1, 3, 0, 2])
    choices = torch.tensor([2, 0, 3, 1, 2, 0, 4])  # root -> 2 (node 1) -> 3 (node 3) -> 2 (node 5) -> 4
    n, end, token = accept_rows(tokens[None], [parents], choices[None])
    assert (int(n[0]), int(end[0]), int(token[0])) == (3, 5, 4)


def test_merge_runs_shares_prefixes_within_the_budget():
    runs = [np.array([5, 6, 7]), np.array([5, 6, 8]), np.array([9])]
    assert merge_runs(runs, 10) == ([5, 6, 7, 8, 9], [-1, 0, 1, 1, -1])
    assert merge_runs(runs, 3) == ([5, 6, 7], [-1, 0, 1])


def test_a_step_counts_as_judged_every_child_of_the_root_and_of_kept_nodes():
    """Root children a, b, c and b kept, then b's child d rejected: each was compared with the
    target's choice at its parent, whatever the temperature, so all four count as judged."""
    from specdec_cli.decoding.commit import step_event
    from specdec_cli.drafters.base import Draft

    draft = Draft(torch.tensor([5, 6, 7, 8]), "m", parents=(-1, -1, -1, 1), confidences=(0.5, 0.3, 0.1, 0.4))
    event = step_event(draft, [5, 6, 7, 8], [1], 9, [6, 9], seconds=0.01)
    assert [(confidence, kept) for confidence, _, kept, _ in event.judged] == [(0.5, False), (0.3, True), (0.1, False), (0.4, False)]
