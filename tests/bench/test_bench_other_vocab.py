"""bench with a draft of another tokenizer: transformers' Universal Assisted Generation beside specdec."""

from __future__ import annotations

import json

import pytest

from cli_helpers import run_cli
from profile_helpers import model_profile
from specdec_cli import Pipeline, SamplingSpec
from specdec_cli.bench import transformers_methods
from specdec_cli.bench.local import build_methods, make_bench
from specdec_cli.bench.options import BenchSettings
from specdec_cli.bench.workload import BenchPrompt

# prompts on which transformers' own different-tokenizer generate runs through at k 3 and its default
# (on others it can fail: that is recorded, see test_a_run_that_fails_inside_transformers_...)
PROMPTS = ["def reverse(items):", "Speculative decoding", "The quick"]


def other_vocab_profile(tmp_path, vocab_pair, **fields):
    drafter = {"kind": "model", "model": str(vocab_pair["draft"]), "vocab": "intersect"}
    return model_profile(tmp_path, vocab_pair, drafter=drafter, chat=False, **fields)


def test_bench_runs_transformers_universal_assisted_generation_with_the_targets_greedy_ids(capsys, tmp_path, vocab_pair):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    code, out, err = run_cli(capsys, "bench", "-p", str(other_vocab_profile(tmp_path, vocab_pair)), "--prompts", str(prompts),
                             "-n", "16", "--repeats", "1", "--warmup", "0", "--hf-ks", "3", "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    rows = {row["method"]: row for row in report["results"]}
    assert list(rows) == ["plain", "specdec", "hf-plain", "hf-assisted-default", "hf-assisted-k3"]
    # every run of every method (transformers' included) gave plain decoding's ids, and none failed
    assert report["outputs_identical"] is True and report["differences"] == []
    assert not any("failed" in note for note in report["notes"])
    note = next(n for n in report["notes"] if n.startswith("hf-assisted:"))
    assert "Universal Assisted Generation" in note and "tokens shared" in note
    for name in ("hf-assisted-default", "hf-assisted-k3"):
        assert rows[name]["acceptance_rate"] > 0 and rows[name]["mean_accepted_length"] > 1
        assert rows[name]["new_tokens"] == rows["plain"]["new_tokens"]


def test_drafted_and_accepted_are_counted_in_the_targets_tokens(tmp_path, vocab_pair):
    """Each target forward emits its accepted candidates and one token of its own; the candidates it
    verified are read from its inputs, so both counts are in target tokens whatever the draft's tokenizer."""
    pipe = Pipeline.from_profile(str(other_vocab_profile(tmp_path, vocab_pair)))
    methods, _ = build_methods(pipe, ["hf-assisted"], 3)
    assisted = methods[1]
    assert assisted.generate_kwargs == {"tokenizer": pipe.tokenizer, "assistant_tokenizer": pipe.drafter.draft_tokenizer}
    assert assisted.assistant is pipe.drafter.draft_model
    run = assisted.run(pipe.encode(PROMPTS[1]), 16, SamplingSpec(), 0)
    assert run["accepted"] == len(run["token_ids"]) - run["target_forwards"] > 0
    assert run["drafted"] >= run["accepted"]


def test_above_temperature_0_transformers_method_is_left_out_with_a_note(tmp_path, vocab_pair):
    pipe = Pipeline.from_profile(str(other_vocab_profile(tmp_path, vocab_pair)))
    methods, notes = build_methods(pipe, ["specdec", "hf-assisted"], 3, sampling=SamplingSpec(temperature=0.8))
    assert [m.name for m in methods] == ["plain", "specdec"]
    assert any("left out" in n and "temperature 0" in n for n in notes)


def test_equal_vocab_sizes_leave_it_out_as_transformers_would_refuse(tmp_path, vocab_pair, monkeypatch):
    pipe = Pipeline.from_profile(str(other_vocab_profile(tmp_path, vocab_pair)))
    monkeypatch.setattr(pipe.drafter.draft_model.config, "vocab_size", pipe.target.config.vocab_size)
    methods, notes = build_methods(pipe, ["hf-assisted"], 3)
    assert [m.name for m in methods] == ["plain"]
    assert any("vocab_size" in n for n in notes)


def test_a_run_that_fails_inside_transformers_is_noted_and_left_out_of_the_figures(tmp_path, vocab_pair, monkeypatch):
    pipe = Pipeline.from_profile(str(other_vocab_profile(tmp_path, vocab_pair)))
    original = transformers_methods.transformers_generate

    def failing_on_the_second_prompt(loaded, ids, max_new_tokens, model=None, **kwargs):
        if "assistant_tokenizer" in kwargs and ids == loaded.encode(PROMPTS[1]):
            raise RuntimeError("cannot reshape tensor of 0 elements\nmore detail")
        return original(loaded, ids, max_new_tokens, model, **kwargs)

    monkeypatch.setattr(transformers_methods, "transformers_generate", failing_on_the_second_prompt)
    prompts = [BenchPrompt(f"p{i}", text) for i, text in enumerate(PROMPTS)]
    bench = make_bench(pipe, prompts, BenchSettings(max_new_tokens=12, repeats=1, warmup=0, k=3), ["hf-assisted"])
    bench.run()
    report = bench.summary()
    assert report["settings"]["prompts"] == 3  # the failed run ends neither the bench nor its prompt
    failed = [n for n in report["notes"] if "failed inside transformers" in n]
    assert len(failed) == 2  # hf-assisted-default and hf-assisted-k3
    assert "1 of 3 runs" in failed[0] and "prompt p1: RuntimeError: cannot reshape tensor of 0 elements)" in failed[0]
    assert report["outputs_identical"] is True
    row = next(r for r in report["results"] if r["method"] == "hf-assisted-default")
    plain = {p.id: len(next(iter(bench.runs("plain", [p]))).token_ids) for p in prompts}
    assert row["new_tokens"] == pytest.approx((plain["p0"] + plain["p2"]) / 2)
