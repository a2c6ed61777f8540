"""`specdec train-draft` on a tiny target: the loss falls, the head beats an untrained one, a
resumed run ends where an uninterrupted one does, and bad input is one line."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import specdec_cli.training.trainer as train_draft
from cli_helpers import assert_one_line_error, run_cli
from profile_helpers import model_profile, write_profile
from specdec_cli import Pipeline
from specdec_cli.training.distill import Sequence
from specdec_cli.decoding.engine import run
from specdec_cli.drafters.head_files import feature_layers

PROMPTS = [
    "def add(a, b):", "for i in range(10):", "The quick brown fox", "class Node:", "import os",
    "Write a Python function", "Summarise the following text", "print(sys.argv)", "return a + b",
    "def reverse(items):", "x = 0", "The lazy dog",
]


@pytest.fixture
def setup(tmp_path, llama_pair):
    profile = model_profile(tmp_path, llama_pair, drafter={"kind": "ngram"}, chat=False)
    data = tmp_path / "prompts.txt"
    data.write_text("\n".join(PROMPTS) + "\n")
    return profile, data


def train(capsys, profile, data, out, *extra: str) -> tuple[int, str]:
    code, _, err = run_cli(
        capsys, "train-draft", "-p", str(profile), "--data", str(data), "--out", str(out),
        "--max-tokens", "20", "--heads", "2", "--held-out", "0.25", *extra,
    )
    return code, err


def record(out) -> dict:
    return json.loads((out / "config.json").read_text())["specdec"]


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_training_lowers_the_loss_and_beats_an_untrained_head(capsys, setup, tmp_path, kind):
    profile, data = setup
    out = tmp_path / kind
    batch = "16" if kind == "medusa" else "2"
    code, err = train(capsys, profile, data, out, "--kind", kind, "--epochs", "6", "--lr", "3e-3", "--batch", batch, "--draft-vocab", "150")
    assert code == 0, err
    # both score a draft vocabulary of 150 of the target's 320 tokens, written where loaders look
    weights = load_file(str(out / ("medusa_lm_head.safetensors" if kind == "medusa" else "model.safetensors")))
    drafted = weights["draft_ids"] if kind == "medusa" else torch.arange(150) + weights["d2t"]
    assert drafted.numel() == 150 and drafted.unique().numel() == 150 and int(drafted.max()) < 320
    assert "held-out acceptance per draft depth" in err and f"kind: {kind}" in err
    meta = record(out)
    losses = meta["training"]["epoch_losses"]
    assert len(losses) == 6 and losses[-1] < 0.8 * losses[0], losses
    seen = meta["training_prompts"]
    assert seen["trained"]["tokens_per_pass"] > seen["untrained"]["tokens_per_pass"] + 0.05, seen
    assert meta["held_out"]["trained"]["positions"] > 0
    # and the head it wrote drafts through the real loader, keeping the target's text
    key = "heads" if kind == "medusa" else "head"
    with_head = write_profile(tmp_path, "with-head", target={"model": profile_target(profile), "dtype": "float32"},
                              drafter={"kind": kind, key: str(out)}, chat=False)
    pipe = Pipeline.from_profile(str(with_head))
    ids = pipe.encode(PROMPTS[0])
    drafted = run(pipe.decoder(), ids, max_new_tokens=20)
    plain = run(pipe.decoder(drafter=None), ids, max_new_tokens=20)
    assert drafted.token_ids == plain.token_ids
    assert drafted.stats.accepted > 0


def profile_target(profile) -> str:
    import yaml

    return yaml.safe_load(profile.read_text())["target"]["model"]


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_a_resumed_run_ends_where_an_uninterrupted_one_does(capsys, setup, tmp_path, monkeypatch, kind):
    profile, data = setup
    options = ("--kind", kind, "--epochs", "3", "--batch", "32" if kind == "medusa" else "2", "--save-every", "2")
    code, err = train(capsys, profile, data, tmp_path / "straight", *options)
    assert code == 0, err

    # Ctrl-C in the middle of the second epoch: the last checkpoint stays, exit 130
    calls = {"n": 0}
    scores = train_draft.Trainer.scores

    def interrupted(self, index, held=False):
        if not held and torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] == 7:
                raise KeyboardInterrupt
        return scores(self, index, held)

    monkeypatch.setattr(train_draft.Trainer, "scores", interrupted)
    code, err = train(capsys, profile, data, tmp_path / "resumed", *options)
    assert code == 130 and "--resume" in err, err
    state = torch.load(tmp_path / "resumed" / train_draft.STATE, weights_only=True)
    assert 0 < state["progress"]["steps"] < 7
    monkeypatch.setattr(train_draft.Trainer, "scores", scores)

    code, err = train(capsys, profile, data, tmp_path / "resumed", *options, "--resume")
    assert code == 0, err
    weights = "medusa_lm_head.safetensors" if kind == "medusa" else "model.safetensors"
    straight, resumed = load_file(tmp_path / "straight" / weights), load_file(tmp_path / "resumed" / weights)
    assert straight.keys() == resumed.keys()
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key
    assert record(tmp_path / "straight")["training"]["epoch_losses"] == record(tmp_path / "resumed")["training"]["epoch_losses"]


def test_bad_input_is_one_line(capsys, setup, tmp_path):
    profile, data = setup
    out = tmp_path / "head"
    code, err = train(capsys, profile, tmp_path / "missing.txt", out, "--kind", "medusa")
    assert code == 2
    assert_one_line_error(err, "--data", "missing.txt")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\nnot json\n')
    code, err = train(capsys, profile, bad, out, "--kind", "medusa")
    assert code == 2
    assert_one_line_error(err, "bad.jsonl:2", "not JSON")
    code, err = train(capsys, profile, data, out, "--kind", "medusa", "--epochs", "1")
    assert code == 0, err
    code, err = train(capsys, profile, data, out, "--kind", "eagle", "--epochs", "1")  # would overwrite it
    assert code == 2
    assert_one_line_error(err, "already holds a head", "--resume", "--overwrite")
    code, err = train(capsys, profile, data, out, "--kind", "medusa", "--epochs", "1", "--lr", "0.5", "--resume")
    assert code == 2
    assert_one_line_error(err, "other options", "lr")
    code, err = train(capsys, profile, data, tmp_path / "none", "--kind", "medusa", "--resume")
    assert code == 2
    assert_one_line_error(err, "--resume", "training_state.pt")


def test_answers_are_cached_and_are_the_targets_greedy_text(capsys, setup, tmp_path, monkeypatch):
    from specdec_cli.training import distill
    from specdec_cli.training.distill import cache_file, read_cache

    profile, data = setup
    code, err = train(capsys, profile, data, tmp_path / "a", "--kind", "medusa", "--epochs", "1")
    assert code == 0, err
    pipe = Pipeline.from_profile(str(profile))
    cached = read_cache(cache_file(pipe, 20))
    assert len(cached) == len(PROMPTS)
    for record_ in cached.values():  # answered in batches, each as plain greedy decoding answers it alone (float32)
        plain = run(pipe.decoder(drafter=None), record_["ids"], max_new_tokens=20)
        assert list(plain.token_ids) == record_["answer"]
    # a second kind reuses them: nothing is generated again
    generated = {"n": 0}
    original = distill.transformers_generate_batch

    def counting(*args, **kwargs):
        generated["n"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(distill, "transformers_generate_batch", counting)
    code, err = train(capsys, profile, data, tmp_path / "b", "--kind", "eagle", "--epochs", "1")
    assert code == 0, err
    assert generated["n"] == 0


def test_chain_acceptance_counts_leading_right_guesses():
    right = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 1]], dtype=torch.bool)
    labelled = torch.ones_like(right)
    result = train_draft.chain_acceptance(right, labelled)
    assert result["per_depth"] == [0.75, round(2 / 3, 4), 0.5]
    assert result["tokens_per_pass"] == 1 + (2 + 1 + 0 + 3) / 4


def test_an_eagle_batch_scores_every_sequence_against_its_own_tokens(setup):
    """Training-time test over a batch of sequences of different lengths scores each row against
    its own next tokens, as the same sequences one at a time do (a batch once took the first
    sequence's tokens as every row's labels, and EAGLE training learnt mostly noise)."""
    profile, _ = setup
    target = Pipeline.from_profile(str(profile)).target.float()
    vocab = target.get_output_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(5)
    sequences = [Sequence(tuple(torch.randint(3, vocab, (n,), generator=generator).tolist()), 2) for n in (14, 9)]
    features = train_draft.read_features(target, sequences, feature_layers("eagle3", target), lambda n: None)
    head, _ = train_draft.new_eagle3(target, torch.arange(vocab), seed=0)
    embed = target.get_input_embeddings()

    def scored(rows: list[int]):
        batch = train_draft.eagle_batch([sequences[i] for i in rows], [features[i] for i in rows], 1)
        with torch.no_grad():
            return train_draft.eagle_scores(head, embed, batch, 1, torch.arange(vocab))

    loss, _, labelled = scored([0, 1])
    alone = [scored([row]) for row in (0, 1)]
    counts = [int(a[2].sum()) for a in alone]
    for row, (_, _, alone_labelled) in enumerate(alone):
        n = alone_labelled.shape[1]
        assert torch.equal(labelled[row, :n], alone_labelled[0]) and not labelled[row, n:].any()
    # the batch's loss is the labelled positions' mean: the rows' own losses weighted by their counts
    expected = sum(float(a[0]) * c for a, c in zip(alone, counts)) / sum(counts)
    assert float(loss) == pytest.approx(expected, rel=1e-4)


def test_the_python_api_trains_without_the_command(setup, tmp_path):
    """training.api.train_draft: what the command shows comes back as a result, each phase's
    progress adds up to its total, and the head is written."""
    import contextlib

    from specdec_cli.training.api import TrainRequest
    from specdec_cli.training.api import train_draft as train_head

    profile, data = setup
    shown: dict[str, list] = {}

    @contextlib.contextmanager
    def record_progress(phase):
        units = shown.setdefault(phase.description, [phase.total, phase.completed])
        yield lambda n=1, **fields: units.__setitem__(1, units[1] + n)

    settings = train_draft.TrainSettings(kind="medusa", depth=2, epochs=2, batch=32)
    request = TrainRequest(settings, data=str(data), folder=tmp_path / "api", max_tokens=20, held_out=0.25)
    result = train_head(Pipeline.from_profile(str(profile)), request, record_progress)
    assert not result.interrupted and result.saved and result.state_file.is_file()
    assert list(shown) == ["answering prompts", "reading the target's states", "training"]
    assert all(total == done for total, done in shown.values()), shown
    meta = record(tmp_path / "api")
    assert list(result.losses) == pytest.approx(meta["training"]["epoch_losses"], abs=1e-4) and len(result.losses) == 2
    assert result.trained == meta["held_out"]["trained"] and result.untrained_seen == meta["training_prompts"]["untrained"]
