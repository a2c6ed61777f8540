"""Draft heads keep the target's greedy text (chains, trees, EOS and the token limit inside an accepted
path, compiled targets, merged lookup trees) and are handed the target's hidden states of exactly
the committed tokens. Everything goes through the real loader (a profile -> Pipeline.from_profile)."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
import torch

# compiled kernels survive between test runs, as in test_compiled.py
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), "specdec-tests-inductor"))

from cli_helpers import run_cli  # noqa: E402
from head_checkpoints import KINDS, NEW_TOKENS, PROMPTS, SHAPES, check_features, drafter_for, head_pipeline, merged_chain, one_thread, stream_all  # noqa: E402, F401 (one_thread: autouse)
from profile_helpers import model_profile  # noqa: E402
from specdec_cli import Pipeline, Prefilled, Verified  # noqa: E402
from specdec_cli.decoding.transformers_generate import transformers_generate  # noqa: E402
from specdec_cli.specs import AUTO_TREE, TreeSpec  # noqa: E402


# --------------------------------------------------------------------------- greedy identity


@pytest.mark.parametrize("kind", KINDS)
def test_heads_keep_greedy_identity_for_chains_and_trees(tmp_path, llama_pair, heads, kind):
    """The emitted ids equal the target's own greedy decoding, for a chain of 3 and three tree
    shapes, and the heads are really accepted (deep paths, partial paths and branches all occur)."""
    pipe = head_pipeline(tmp_path, llama_pair, kind, heads["folders"][kind], tree={"nodes": 8, "width": 2, "depth": 4})
    assert pipe.profile.tree == TreeSpec(8, 2, 4)
    for name, shape in SHAPES.items():
        accepted, deep, partial, branched = 0, 0, 0, 0
        for prompt in PROMPTS:
            ids = pipe.encode(prompt)
            expected = transformers_generate(pipe, ids, NEW_TOKENS)
            decoder = pipe.decoder(tree="profile" if shape == TreeSpec(8, 2, 4) else shape)
            steps, finished = stream_all(pipe, ids, decoder, max_new_tokens=NEW_TOKENS)
            assert finished.token_ids == expected, (kind, name, prompt)
            assert all(s.drafter in ("medusa", "eagle", "eagle-3") for s in steps if s.drafter)
            accepted += sum(s.n_accepted for s in steps)
            deep += sum(s.n_accepted >= 2 for s in steps)
            partial += sum(0 < s.n_accepted < 3 for s in steps)
            branched += sum(s.tree for s in steps)
        assert accepted >= NEW_TOKENS, (kind, name, accepted)  # more than half the output came from the heads
        assert deep > 3 and partial > 0, (kind, name, deep, partial)
        if shape is not None and not shape.auto:
            assert branched > 0, (kind, name)


@pytest.mark.parametrize("kind", KINDS)
def test_heads_stop_at_eos_and_max_new_tokens_inside_an_accepted_path(tmp_path, llama_pair, heads, kind):
    pipe = head_pipeline(tmp_path, llama_pair, kind, heads["folders"][kind])
    ids = pipe.encode(PROMPTS[0])
    shapes = (None, TreeSpec(8, 2, 4), TreeSpec(16, 4, 3))
    for limit in (1, 2, 5, 11):
        expected = transformers_generate(pipe, ids, limit)
        for shape in shapes:
            steps, finished = stream_all(pipe, ids, pipe.decoder(tree=shape), max_new_tokens=limit)
            assert finished.token_ids == expected and len(expected) == limit, (limit, shape)
            assert finished.finish_reason == "length"
    free_run = transformers_generate(pipe, ids, NEW_TOKENS)
    cut_inside = 0
    for position in (9, 17, 25, 33):
        pipe.eos_ids = frozenset({free_run[position]})
        expected = transformers_generate(pipe, ids, NEW_TOKENS)
        assert expected[-1] == free_run[position]
        for shape in shapes:
            steps, finished = stream_all(pipe, ids, pipe.decoder(tree=shape), max_new_tokens=NEW_TOKENS)
            assert finished.token_ids == expected and finished.finish_reason == "eos", (position, shape)
            last = steps[-1]
            cut_inside += last.n_accepted >= len(last.emitted)  # EOS was a drafted token the target kept
    assert cut_inside > 0, "no EOS fell inside an accepted path: the case is not exercised"


@pytest.mark.parametrize("kind", KINDS)
def test_a_one_token_prompt_keeps_greedy_identity(tmp_path, llama_pair, heads, kind):
    """No state precedes the first token: the first step has nothing to draft from (no drafts, or
    a draft without a feature), and the steps after it draft as usual."""
    pipe = head_pipeline(tmp_path, llama_pair, kind, heads["folders"][kind])
    for ids in ([pipe.tokenizer.bos_token_id], pipe.encode("def")[:1]):
        for shape in (None, TreeSpec(8, 2, 4)):
            result = pipe.generate(ids, decoder=pipe.decoder(tree=shape), max_new_tokens=20)
            assert result.token_ids == transformers_generate(pipe, ids, 20), (ids, shape)


def test_compiled_target_feeds_the_heads_and_keeps_greedy_identity(tmp_path, llama_pair, heads):
    """compile: on (a static cache and a compiled step that also returns the chosen layers'
    states, padded to its width): EAGLE-3 over a tree, its output and the states it was handed."""
    pipe = head_pipeline(tmp_path, llama_pair, "eagle3", heads["folders"]["eagle3"], compile="on")
    ids = pipe.encode(PROMPTS[0])
    decoder = pipe.decoder(tree=TreeSpec(8, 2, 4))
    handed = record_features(decoder.drafter)
    steps, finished = stream_all(pipe, ids, decoder, max_new_tokens=NEW_TOKENS)
    assert finished.token_ids == transformers_generate(pipe, ids, NEW_TOKENS)
    assert sum(s.n_accepted for s in steps) >= 10 and any(s.tree for s in steps)
    check_features(heads["target"], "eagle3", list(ids) + list(finished.token_ids), handed)


@pytest.mark.parametrize("kind", ["medusa-own", "eagle3"])
def test_specdec_generate_and_verify_with_a_head_profile(capsys, tmp_path, llama_pair, heads, kind):
    """What a user runs: `specdec generate` prints the target's own continuation and says which
    drafter guessed; `specdec verify` passes on the head profile."""
    profile = model_profile(tmp_path, llama_pair, name="heads", drafter=drafter_for(kind, heads["folders"][kind]), k=3,
                            tree={"nodes": 8, "width": 2, "depth": 4}, chat=False)
    code, out, err = run_cli(capsys, "generate", "-p", str(profile), "-f", "json", "-n", "30", PROMPTS[0])
    assert code == 0, err
    report = json.loads(out)
    pipe = Pipeline.from_profile(str(profile))
    assert tuple(report["token_ids"]) == transformers_generate(pipe, pipe.encode(PROMPTS[0]), 30)
    assert report["stats"]["accepted"] > 5, report["stats"]
    assert set(report["stats"]["per_drafter"]) == {"medusa" if kind.startswith("medusa") else "eagle-3"}
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPTS[0] + "\n")
    code, out, err = run_cli(capsys, "verify", "-p", str(profile), "--prompts", str(prompts), "--samples", "0", "-n", "24")
    assert code == 0 and "PASS" in out and "identical" in out, out + err


# --------------------------------------------------------------------------- the hidden states handed over


def record_features(drafter) -> list[torch.Tensor]:
    handed: list[torch.Tensor] = []
    take = drafter.take_features

    def recording(features):
        handed.append(features.detach().float().cpu().clone())
        return take(features)

    drafter.take_features = recording
    return handed


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3"])
def test_the_drafter_gets_the_targets_hidden_states_of_the_committed_tokens(tmp_path, llama_pair, heads, kind):
    pipe = head_pipeline(tmp_path, llama_pair, kind, heads["folders"][kind])
    for prompt in PROMPTS[:2]:
        ids = pipe.encode(prompt)
        for shape in (None, TreeSpec(16, 4, 3)):
            decoder = pipe.decoder(tree=shape)
            handed = record_features(decoder.drafter)
            committed = list(ids)
            accepted = 0
            for event in pipe.stream(ids, decoder=decoder, max_new_tokens=NEW_TOKENS):
                if isinstance(event, Prefilled):
                    assert [h.shape[0] for h in handed] == [len(ids) - 1]
                elif isinstance(event, Verified):
                    committed += event.emitted
                    accepted += event.n_accepted
                    rows = sum(h.shape[0] for h in handed)
                    # the root's and the accepted nodes' (at the very end an EOS can cut the path:
                    # then the newest token is an accepted node, and its state comes too)
                    assert handed[-1].shape[0] == 1 + min(event.n_accepted, len(event.emitted)), (handed[-1].shape, event)
                    assert rows == len(committed) - 1 or rows == len(committed), (rows, len(committed))
            assert accepted > 5, (kind, shape, accepted)
            check_features(heads["target"], kind, committed, handed)


@pytest.mark.parametrize("kind", ["medusa", "eagle3"])
def test_a_chain_of_prompt_lookup_then_a_head_feeds_the_head_every_step(tmp_path, llama_pair, heads, kind):
    """Prompt lookup drafts where it finds a match, the head elsewhere; the head still gets the
    states of every committed token (steps it sat out included) and the text stays the target's."""
    drafter = {"kind": "chain", "drafters": [{"kind": "ngram", "pool_tokens": 0}, drafter_for(kind, heads["folders"][kind])]}
    profile = model_profile(tmp_path, llama_pair, name=f"chain-{kind}", drafter=drafter, k=3, chat=False)
    pipe = Pipeline.from_profile(str(profile))
    winners: dict[str, int] = {}
    for prompt in PROMPTS:
        ids = pipe.encode(prompt)
        decoder = pipe.decoder()
        handed = record_features(decoder.drafter.drafters[1])
        steps, finished = stream_all(pipe, ids, decoder, max_new_tokens=NEW_TOKENS)
        assert finished.token_ids == transformers_generate(pipe, ids, NEW_TOKENS), (kind, prompt)
        for step in steps:
            if step.n_accepted:
                winners[step.drafter] = winners.get(step.drafter, 0) + step.n_accepted
        check_features(heads["target"], kind, list(ids) + list(finished.token_ids), handed)
    assert set(winners) == {"ngram", "medusa" if kind == "medusa" else "eagle-3"}, winners


@pytest.mark.parametrize("shape", [None, TreeSpec(8, 2, 4), AUTO_TREE])
def test_a_weak_lookup_match_and_the_head_share_one_tree_and_keep_greedy_identity(tmp_path, llama_pair, heads, shape):
    """Every lookup match is weak: lookup's continuation and the EAGLE-3 head's candidates are
    verified in one forward. The text stays the target's; paths through either drafter's nodes
    are accepted (lookup's few right guesses counted where the shape is fixed: the auto rules
    size drafts by measured timings, so which nodes they draft varies from run to run); each
    drafter's k: auto / tree: auto record learns from its own nodes."""
    profile = model_profile(tmp_path, llama_pair, name="merged", drafter=merged_chain(heads["folders"]["eagle3"]),
                            k="auto", chat=False)
    pipe = Pipeline.from_profile(str(profile))
    kept_by = {"ngram/short": 0, "eagle-3": 0}  # every match is short here
    learnt: dict[str, int] = {}
    merged = 0
    for prompt in PROMPTS:
        ids = pipe.encode(prompt)
        decoder = pipe.decoder(tree=shape)
        steps, finished = stream_all(pipe, ids, decoder, max_new_tokens=NEW_TOKENS)
        assert finished.token_ids == transformers_generate(pipe, ids, NEW_TOKENS), (shape, prompt)
        for step in steps:
            if step.parts:
                merged += 1
                assert step.drafter == "ngram/short+eagle-3"
                assert step.nodes <= decoder.node_limit  # the compiled widths hold a merged tree too
                for part in step.parts:
                    kept_by[part.drafter] += sum(kept for _, _, kept, _ in part.judged)
        for name, record in getattr(decoder.lookahead, "records", {}).items():
            learnt[name] = learnt.get(name, 0) + record.judged
    assert merged > 3, merged
    assert kept_by["eagle-3"] > 0, kept_by
    if shape is None or shape.auto:  # k: auto / tree: auto: both drafters' records have judged nodes
        assert learnt.get("ngram/short", 0) > 0 and learnt.get("eagle-3", 0) > 0, learnt
        assert "ngram" not in learnt and "ngram/short+eagle-3" not in learnt, learnt
    else:  # a fixed shape drafts the same nodes every run (the auto rules size drafts by timings)
        assert kept_by["ngram/short"] > 0, kept_by


def test_a_strong_lookup_match_is_proposed_alone(tmp_path, llama_pair, heads):
    """solo_ngram 2: a match of two or three tokens is lookup's alone; a one-token match is merged,
    and its guesses are learnt apart (ngram/short)."""
    profile = model_profile(tmp_path, llama_pair, name="solo", drafter=merged_chain(heads["folders"]["eagle3"], solo_ngram=2),
                            k=3, chat=False)
    pipe = Pipeline.from_profile(str(profile))
    seen = set()
    # the last prompt ends inside a repeated span: its first step has a three-token match
    for prompt in PROMPTS + ["for i in range(10):\n    print(i * i)\nfor i in range("]:
        ids = pipe.encode(prompt)
        steps, finished = stream_all(pipe, ids, pipe.decoder(), max_new_tokens=NEW_TOKENS)
        assert finished.token_ids == transformers_generate(pipe, ids, NEW_TOKENS)
        seen |= {s.drafter for s in steps if s.drafter}
    assert {"ngram", "ngram/short+eagle-3"} <= seen, seen


def check_member_paths(chain) -> list[int]:
    """Wrap each chain member so that every accept checks that the path it is handed, in its own
    numbering, spells the first committed tokens of the step; counts the nodes kept per member."""
    kept = [0] * len(chain.drafters)

    def wrap(i, member):
        propose, accept = member.propose, member.accept
        last: dict = {}

        def recording_propose(shape, budget=None):
            draft = propose(shape, budget)
            last["ids"] = draft.token_ids.tolist() if draft is not None else []
            return draft

        def checking_accept(new_tokens, path):
            assert [last["ids"][node] for node in path] == list(new_tokens)[: len(path)], (member.name, path)
            kept[i] += len(path)
            last["ids"] = []
            accept(new_tokens, path)

        member.propose, member.accept = recording_propose, checking_accept

    for i, member in enumerate(chain.drafters):
        wrap(i, member)
    return kept


def test_each_member_of_a_merged_tree_is_handed_its_own_accepted_path(tmp_path, llama_pair, heads):
    """Lookup then the head, and lookup then a draft model, in one tree: each member gets the
    accepted path in its own node numbering (the draft model keeps those nodes in its cache, the
    head drops its own), and the text stays the target's."""
    draft = {"kind": "model", "model": str(llama_pair["draft"])}
    for drafter in (merged_chain(heads["folders"]["eagle3"]), {**merged_chain(heads["folders"]["eagle3"]), "drafters": [
        merged_chain(heads["folders"]["eagle3"])["drafters"][0], draft]}):
        check_merged_members(tmp_path, llama_pair, drafter)


def check_merged_members(tmp_path, pair, drafter: dict) -> None:
    profile = model_profile(tmp_path, pair, name="merged-members", drafter=drafter, k=5, chat=False)
    pipe = Pipeline.from_profile(str(profile))
    kept = [0, 0]
    for prompt in PROMPTS:
        ids = pipe.encode(prompt)
        for shape in (None, TreeSpec(12, 2, 4)):
            decoder = pipe.decoder(tree=shape)
            counts = check_member_paths(decoder.drafter)
            steps, finished = stream_all(pipe, ids, decoder, max_new_tokens=NEW_TOKENS)
            assert finished.token_ids == transformers_generate(pipe, ids, NEW_TOKENS), (prompt, shape)
            kept = [a + b for a, b in zip(kept, counts)]
    # the second member's nodes are numbered after lookup's in the merged tree: its paths are the mapped ones
    assert kept[1] > 5, (drafter, kept)
