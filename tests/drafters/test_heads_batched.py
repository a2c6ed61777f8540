"""Draft heads in a batch: each row's Medusa or EAGLE drafter is handed its row's hidden states of
the target, and every row's text is its prompt's own batch-1 text (greedy, float32)."""

from __future__ import annotations

import pytest
import torch

from head_checkpoints import NEW_TOKENS, PROMPTS, check_features, head_pipeline, one_thread  # noqa: F401; one_thread: autouse
from specdec_cli.decoding.batched import BatchedDecoder, Request
from specdec_cli.drafters.batched import RowDrafters
from specdec_cli.specs import TreeSpec

LIMITS = [NEW_TOKENS, 7, 23, 1, 30]


def batched(pipe, compile: str, batch_size: int, tree: TreeSpec | None = None) -> BatchedDecoder:
    return BatchedDecoder(pipe.target, lambda: pipe.make_drafter(pipe.profile.drafter), vocab=pipe.vocab,
                          eos_ids=pipe.eos_ids, k=3, batch_size=batch_size, context_length=pipe.context_length,
                          tree=tree, compile=compile)


@pytest.mark.parametrize("compile", ["off", "static"])
@pytest.mark.parametrize("kind", ["medusa", "medusa-vocab", "eagle", "eagle3"])
@pytest.mark.parametrize("tree", [None, TreeSpec(6, 2, 3)], ids=["chains", "trees"])
def test_rows_drafted_by_heads_equal_their_own_batch_one_text(tmp_path, llama_pair, heads, kind, compile, tree):
    pipe = head_pipeline(tmp_path, llama_pair, kind, heads["folders"][kind])
    prompts = [pipe.encode(p) for p in [*PROMPTS, "x", PROMPTS[0] + " return"]]
    requests = [Request(i, ids, limit) for i, (ids, limit) in enumerate(zip(prompts, LIMITS))]
    decoder = batched(pipe, compile, batch_size=3, tree=tree)  # 5 prompts: slots refilled
    assert isinstance(decoder.drafter, RowDrafters)
    finished = dict(decoder.run(requests))
    accepted_alone = 0
    for i, (ids, limit) in enumerate(zip(prompts, LIMITS)):
        alone = pipe.generate(ids, decoder=pipe.decoder(drafter=None), max_new_tokens=limit)
        assert finished[i].token_ids == alone.token_ids, (kind, compile, i)
        accepted_alone += pipe.generate(ids, decoder=pipe.decoder(k=3, tree=tree), max_new_tokens=limit).stats.accepted
    # the heads draft as well as at batch size 1 (fed wrong states, they would almost never be kept)
    accepted = sum(f.stats.accepted for f in finished.values())
    assert accepted >= 0.8 * accepted_alone and accepted_alone > 20, (accepted, accepted_alone)


@pytest.mark.parametrize("compile", ["off", "static"])
def test_each_row_is_handed_the_targets_states_of_its_own_committed_tokens(tmp_path, llama_pair, heads, compile):
    """What each row's EAGLE-3 drafter receives, summed over the run, are the target's hidden states
    of that row's sequence (the prompt's, then every committed token's but the newest)."""
    pipe = head_pipeline(tmp_path, llama_pair, "eagle3", heads["folders"]["eagle3"])
    prompts = [pipe.encode(p) for p in PROMPTS]
    decoder = batched(pipe, compile, batch_size=3)
    handed: dict[int, list[torch.Tensor]] = {}
    original_add = decoder.drafter.add

    def add(prompt_ids, sampling, noise, features=None):
        original_add(prompt_ids, sampling, noise, features)
        row = len(handed)
        drafter = decoder.drafter.drafters[-1]
        taken = handed.setdefault(row, [])
        keep = drafter.take_features
        drafter.take_features = lambda f: (taken.append(f.clone()), keep(f))[1]
        if features is not None:
            taken.append(features.clone())

    decoder.drafter.add = add
    finished = dict(decoder.run([Request(i, ids, NEW_TOKENS) for i, ids in enumerate(prompts)]))
    for i, ids in enumerate(prompts):
        committed = list(ids) + list(finished[i].token_ids)
        check_features(heads["target"], "eagle3", committed, handed[i])


def test_generate_prompts_runs_a_medusa_profile_in_a_batch(capsys, tmp_path, llama_pair, heads):
    """As a user runs it: `specdec generate --prompts FILE --batch-size 3` with a Medusa profile, each
    row the prompt's own `specdec generate` tokens."""
    import json

    from cli_helpers import run_cli

    head_pipeline(tmp_path, llama_pair, "medusa", heads["folders"]["medusa"])  # writes the profile
    profile = str(tmp_path / "head-medusa.yaml")
    texts = [*PROMPTS[:2], "x", "def sub(a, b):"]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in texts))
    code, out, err = run_cli(capsys, "generate", "--prompts", str(prompts), "--batch-size", "3", "-p", profile, "-n", "16")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [row["index"] for row in rows] == [0, 1, 2, 3]
    for row, prompt in zip(rows, texts):
        code, alone, err = run_cli(capsys, "generate", prompt, "-p", profile, "-n", "16", "-f", "json")
        assert code == 0, err
        assert row["token_ids"] == json.loads(alone)["token_ids"], prompt
