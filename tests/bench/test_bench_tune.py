"""bench and tune-k end to end on tiny models: report contracts, the identity check, the analytic model."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from cli_helpers import assert_one_line_error, run_cli
from profile_helpers import model_profile
from model_clock import ModelClock
from specdec_cli.profile import load_profile
from specdec_cli import Pipeline
from specdec_cli.bench.local import make_bench
from specdec_cli.bench.options import BenchSettings
from specdec_cli.cli.app import main
from specdec_cli.bench.tune import TuneResult, expected_tokens, predicted_speedup, with_k
from specdec_cli.bench.workload import BenchPrompt, load_prompts

RESULT_FIELDS = {"method", "tokens_per_second", "speedup", "acceptance_rate", "mean_accepted_length", "target_forwards"}


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = [
        {"question_id": 1, "category": "coding", "turns": ["def add(a, b):", "again"]},
        {"question_id": 2, "category": "coding", "turns": ["for i in range(10):"]},
        {"question_id": 3, "category": "writing", "turns": ["The quick brown fox"]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_bench_json_contract(capsys, tmp_path, llama_pair, prompts_file):
    profile = model_profile(tmp_path, llama_pair, chat=False)
    output = tmp_path / "out" / "bench.json"
    code = main(["bench", "-p", str(profile), "--prompts", str(prompts_file), "-n", "12", "--repeats", "1",
                 "--warmup", "1", "--format", "json", "--output", str(output)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert json.loads(output.read_text()) == report
    assert {"profile", "machine", "settings", "dtype", "outputs_identical", "differences", "results"} <= report.keys()
    methods = [r["method"] for r in report["results"]]
    assert methods == ["plain", "specdec", "hf-plain", "hf-assisted-default", "hf-assisted-k4"]
    for row in report["results"]:
        assert RESULT_FIELDS <= row.keys()
        assert set(row["per_category"]) == {"coding", "writing"}
        assert RESULT_FIELDS - {"method"} <= row["per_category"]["coding"].keys()
    plain = report["results"][0]
    assert plain["speedup"] == pytest.approx(1.0)
    assert report["outputs_identical"] is True and report["differences"] == []
    assert report["results"][1]["acceptance_rate"] > 0
    assert report["dtype"] == "float32" and report["settings"]["prompts"] == 3
    assert report["settings"]["compile"] == "off" and report["compile_seconds"] == 0
    best = report["comparisons"]["specdec_vs_hf_assisted_best"]
    assert best["method"] in ("hf-assisted-default", "hf-assisted-k4") and best["speedup"] > 0


def test_bench_csv_rows_per_method_and_category(capsys, tmp_path, llama_pair, prompts_file):
    profile = model_profile(tmp_path, llama_pair, chat=False)
    code = main(["bench", "-p", str(profile), "--prompts", str(prompts_file), "-n", "8", "--repeats", "1",
                 "--methods", "specdec", "--format", "csv"])
    out = capsys.readouterr().out
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert {(r["category"], r["method"]) for r in rows} == {
        (c, m) for c in ("all", "coding", "writing") for m in ("plain", "specdec")
    }
    assert set(rows[0]) == {"category", "speedup_min", "speedup_max", "speedup_flags"} | RESULT_FIELDS


def test_bench_human_report_and_filters(capsys, tmp_path, llama_pair, prompts_file):
    profile = model_profile(tmp_path, llama_pair, chat=False)
    code = main(["bench", "-p", str(profile), "--prompts", str(prompts_file), "--category", "coding", "--limit", "1",
                 "-n", "8", "--repeats", "1", "--methods", "specdec"])
    out = capsys.readouterr().out
    assert code == 0
    assert "specdec" in out and "token for token" in out and "1 prompt ·" in out
    assert "compiled" not in out  # compile: off


def test_identity_check_fires_on_a_broken_method(tmp_path, llama_pair):
    """A method that changes one token must be reported, with the position, as not a near-tie."""
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, chat=False)))
    prompts = [BenchPrompt("p1", "def add(a, b):"), BenchPrompt("p2", "The quick brown fox")]
    bench = make_bench(pipe, prompts, BenchSettings(max_new_tokens=10, repeats=1, warmup=0, k=3), ["specdec"])
    honest = bench.methods[1]

    class Faulty:
        name = "faulty"

        def run(self, ids, max_new_tokens, sampling, seed):
            measured = honest.run(ids, max_new_tokens, sampling, seed)
            tokens = list(measured["token_ids"])
            tokens[5] = (tokens[5] + 1) % pipe.vocab
            return {**measured, "token_ids": tuple(tokens)}

    bench.methods.append(Faulty())
    bench.run()
    report = bench.summary()
    assert report["outputs_identical"] is False
    assert {(d["prompt"], d["method"], d["position"]) for d in report["differences"]} == {("p1", "faulty", 5), ("p2", "faulty", 5)}
    assert not any(d["near_tie"] for d in report["differences"])


def test_prompt_sources(tmp_path, prompts_file):
    text = tmp_path / "prompts.txt"
    text.write_text("first prompt\n\nsecond prompt\n")
    assert [p.text for p in load_prompts(text)] == ["first prompt", "second prompt"]
    assert [p.text for p in load_prompts(prompts_file, ["writing"])] == ["The quick brown fox"]
    assert len(load_prompts(prompts_file, limit=1)) == 2  # one per category
    assert {p.category for p in load_prompts(None)} >= {"coding", "writing"}


def test_spec_bench_file_reads_by_path():
    """Spec-Bench's question.jsonl is not shipped: $SPEC_BENCH names it where it exists (as for the
    benchmark scripts)."""
    import os
    from pathlib import Path

    spec_bench = Path(os.environ.get("SPEC_BENCH", "")).expanduser()
    if not os.environ.get("SPEC_BENCH") or not spec_bench.is_file():
        pytest.skip("$SPEC_BENCH does not name Spec-Bench's question.jsonl here")
    prompts = load_prompts(spec_bench)
    assert len(prompts) == 480 and len({p.category for p in prompts}) == 13
    assert len(load_prompts(spec_bench, limit=2)) == 26


# --------------------------------------------------------------------------- analytic model


def test_expected_tokens_by_hand():
    assert expected_tokens(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)  # 3.3616
    assert expected_tokens(0.8, 4) == pytest.approx(1 + 0.8 + 0.64 + 0.512 + 0.4096)
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0


def test_predicted_speedup_by_hand():
    # a = 0.8, k = 4: 3.3616 tokens per step; cost 4 * 0.25 + 1.1 = 2.1 target steps
    assert predicted_speedup(0.8, 4, 0.25, 1.1) == pytest.approx(3.3616 / 2.1)
    # a useless draft (a = 0) with free drafting and free verification is exactly plain decoding
    assert predicted_speedup(0.0, 3, 0.0, 1.0) == 1.0


def test_best_k_prefers_the_smaller_on_a_tie():
    result = TuneResult(bench=None, ks=[1, 2, 3], include_auto=True)
    rows = [{"k": 1, "speedup": 1.20}, {"k": 2, "speedup": 1.50}, {"k": 3, "speedup": 1.505}, {"k": "auto", "speedup": 1.49}]
    assert result.best(rows, fixed_only=False) == 2
    rows[-1]["speedup"] = 1.70
    assert result.best(rows, fixed_only=False) == "auto"
    assert result.best(rows, fixed_only=True) == 2  # 1.505 ties with 1.50: the smaller k


def test_with_k_keeps_order_and_drops_the_comments_on_the_old_value():
    text = "# my pair\nname: x\n# k: 5 was best\nk: 5   # tuned by hand\nsampling: {temperature: 0}\n"
    assert with_k(text, 3) == "# my pair\nname: x\nk: 3\nsampling: {temperature: 0}\n"
    assert with_k(text, 3, "from tune-k") == "# my pair\nname: x\nk: 3   # from tune-k\nsampling: {temperature: 0}\n"
    assert with_k("name: x\n", 4) == "name: x\nk: 4\n"
    nested = "adaptive:\n  k: 9\nk: 2\n"
    assert with_k(nested, 6) == "adaptive:\n  k: 9\nk: 6\n"


def test_tune_k_end_to_end_and_write(capsys, tmp_path, llama_pair):
    profile = model_profile(tmp_path, llama_pair, chat=False)
    original = profile.read_text()
    one_prompt = tmp_path / "one.txt"
    one_prompt.write_text("def reverse(items):\n")
    code = main(["tune-k", "-p", str(profile), "--ks", "1,3", "-n", "16", "--repeats", "1", "--prompts", str(one_prompt),
                 "--format", "json", "--write", "--force", "--plot", str(tmp_path / "k.png")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert [r["k"] for r in report["rows"]] == [1, 3, "auto"]
    for row in report["rows"]:
        assert {"k", "tokens_per_second", "speedup", "acceptance_rate", "mean_accepted_length", "predicted_speedup"} <= row.keys()
        assert 0 <= row["acceptance_rate"] <= row["alpha"] <= 1  # alpha counts only judged drafts
    assert report["best_k"] in (1, 3, "auto", None)  # None: this busy machine's noise marked every row
    if report["best_k"] is None:
        return
    assert report["c"] > 0 and set(report["v"]) == {"1", "3"}
    for row in report["rows"][:2]:  # one prompt: the median of per-prompt predictions is that prompt's
        assert row["predicted_speedup"] == pytest.approx(
            predicted_speedup(row["alpha"], row["k"], report["c"], report["v"][str(row["k"])]))
    assert (tmp_path / "k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert original.count("k: 4") == 1 and load_profile(str(profile)).k == report["best_k"]
    assert f"set k: {report['best_k']}" in captured.err


# --------------------------------------------------------------------------- compile: on


def compiled_profile(tmp_path, llama_pair):
    """compile: on with the fewest seconds of compiling: one model to compile (prompt lookup
    drafts; a draft model's compiled steps are tested in test_compiled.py), and that one the
    2-layer Llama."""
    pair = {"target": llama_pair["stranger"], "draft": llama_pair["draft"]}
    return model_profile(tmp_path, pair, chat=False, compile="on", drafter={"kind": "ngram"})


def test_bench_compiled_reports_compile_time_apart(capsys, tmp_path, llama_pair):
    """compile: on: every engine method compiles before any run (even with --warmup 0, nothing of
    it is in a time to first token); the time is one JSON field and one line after the tables."""
    one_prompt = tmp_path / "one.txt"
    one_prompt.write_text("def add(a, b):\n")
    output = tmp_path / "bench.json"
    code = main(["bench", "-p", str(compiled_profile(tmp_path, llama_pair)), "--prompts", str(one_prompt), "-n", "12",
                 "--repeats", "1", "--warmup", "0", "--methods", "specdec,hf-plain", "--output", str(output)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(output.read_text())
    assert report["settings"]["compile"] == "on"
    seconds = report["compile_seconds"]
    assert seconds > 0
    assert all(row["ttft_seconds"] < seconds for row in report["results"] if row["method"] in ("plain", "specdec"))
    assert report["outputs_identical"] is True  # compiled plain, compiled specdec and transformers' generate
    assert f"compiled the decode steps in {seconds:.1f} s (not in the figures above)" in captured.out


def test_tune_k_compiled_reports_compile_time_apart(capsys, tmp_path, llama_pair):
    one_prompt = tmp_path / "one.txt"
    one_prompt.write_text("def reverse(items):\n")
    output = tmp_path / "tune.json"
    code = main(["tune-k", "-p", str(compiled_profile(tmp_path, llama_pair)), "--ks", "1,3", "--no-auto", "-n", "12",
                 "--repeats", "1", "--warmup", "0", "--prompts", str(one_prompt), "--output", str(output)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(output.read_text())
    assert report["settings"]["compile"] == "on" and report["compile_seconds"] > 0
    assert [r["k"] for r in report["rows"]] == [1, 3] and report["outputs_identical"] is True
    assert f"compiled the decode steps in {report['compile_seconds']:.1f} s (not in the figures above)" in captured.out


# --------------------------------------------------------------------------- token trees


def test_bench_runs_a_tree_beside_the_chain(capsys, tmp_path, llama_pair, prompts_file):
    profile = model_profile(tmp_path, llama_pair, chat=False)
    code = main(["bench", "-p", str(profile), "--prompts", str(prompts_file), "-n", "12", "--repeats", "1",
                 "--methods", "specdec,specdec-tree", "--tree", "12/3/4", "--format", "json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert [r["method"] for r in report["results"]] == ["plain", "specdec", "specdec-tree"]
    assert report["outputs_identical"] is True
    tree = report["results"][2]
    assert tree["mean_accepted_length"] > 1 and tree["target_forwards"] > 0
    assert report["comparisons"]["specdec-tree_vs_specdec"]["speedup"] > 0


def test_bench_rejects_a_bad_tree_before_loading(capsys, tmp_path, llama_pair):
    profile = model_profile(tmp_path, llama_pair, chat=False)
    code = main(["bench", "-p", str(profile), "--methods", "specdec-tree", "--tree", "16,4"])
    err = capsys.readouterr().err
    assert code == 2 and "--tree: '16,4' is not auto, off, NODES or NODES/WIDTH/DEPTH" in err
    assert "Traceback" not in err


def test_tune_k_sweeps_trees_beside_chains(capsys, tmp_path, llama_pair):
    profile = model_profile(tmp_path, llama_pair, chat=False)
    one_prompt = tmp_path / "one.txt"
    one_prompt.write_text("def reverse(items):\n")
    code = main(["tune-k", "-p", str(profile), "--ks", "2", "--no-auto", "--trees", "8,12/3/4,auto", "-n", "16",
                 "--repeats", "1", "--prompts", str(one_prompt), "--format", "json", "--write", "--force"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert code == (1 if report["best_k"] is None else 0), captured.err  # 1: every row marked (a busy machine)
    assert [r["k"] for r in report["rows"]] == [2, "tree=8", "tree=12/3/4", "tree=auto"]
    assert all(r["tokens_per_second"] > 0 for r in report["rows"])
    assert report["outputs_identical"] is True

    saved = load_profile(str(profile))
    if report["best_k"] is None:
        assert saved.k == 4 and saved.tree is None
    elif report["best_k"] == 2:
        assert saved.k == 2 and saved.tree is None
    else:
        assert saved.tree is not None and "set tree:" in captured.err


def test_write_best_k_writes_a_tree_and_a_chain_clears_it(tmp_path):
    from specdec_cli.specs import AUTO_TREE, TreeSpec
    from specdec_cli.bench.tune import write_best_k

    path = tmp_path / "p.yaml"
    path.write_text("target: {model: x}\ndrafter: {kind: ngram}\nk: 4  # chain\n")
    write_best_k(path, 4, tree=TreeSpec(16, 4, 6))
    assert load_profile(str(path)).tree == TreeSpec(16, 4, 6) and "k: 4  # chain" in path.read_text()
    write_best_k(path, 4, tree=AUTO_TREE)
    assert load_profile(str(path)).tree == AUTO_TREE and "tree: auto" in path.read_text()
    write_best_k(path, 6)
    saved = load_profile(str(path))
    assert saved.k == 6 and saved.tree is None


# --------------------------------------------------------------------------- impossible figures, noise, --write


def stranger_profile(tmp_path, llama_pair, text_before_k: str = ""):
    """The target drafted by an unrelated model: next to no draft is kept (tau about 1)."""
    path = model_profile(tmp_path, {"target": llama_pair["target"], "draft": llama_pair["stranger"]}, chat=False, k=2)
    if text_before_k:
        path.write_text(path.read_text().replace("k: 2\n", text_before_k + "k: 2   # a guess\n"))
    return path


def one_prompt(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("def add(a, b):\n")
    return path


def test_a_slow_first_call_lands_in_no_timing_even_with_warmup_0(capsys, tmp_path, llama_pair, monkeypatch):
    """plain runs first; its first 1-token forward costs 100 steps. Timed, that made specdec look
    several times faster than tau ~1 allows; the untimed first run takes it."""
    clock = ModelClock(timed=24).install(monkeypatch)
    code = main(["bench", "-p", str(stranger_profile(tmp_path, llama_pair)), "--prompts", str(one_prompt(tmp_path)),
                 "-n", "24", "--repeats", "1", "--warmup", "0", "--methods", "specdec", "--format", "json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert clock.first_call_paid
    plain, specdec = json.loads(captured.out)["results"]
    assert plain["tokens_per_second"] == pytest.approx(1.0)  # one token per 1-unit forward: no first call in it
    tau = specdec["mean_accepted_length"]
    assert tau < 1.5 and specdec["speedup"] < tau
    assert specdec["speedup_flags"] == [] and specdec["speedup_bound"] == pytest.approx(1.25 * tau)


def test_an_impossible_speedup_is_marked_beside_the_figure(capsys, tmp_path, llama_pair, monkeypatch):
    ModelClock(timed=24, stall_in="plain").install(monkeypatch)
    code = main(["bench", "-p", str(stranger_profile(tmp_path, llama_pair)), "--prompts", str(one_prompt(tmp_path)),
                 "-n", "24", "--repeats", "1", "--warmup", "0", "--methods", "specdec"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    line = next(line for line in captured.out.splitlines() if line.lstrip().startswith("specdec"))
    assert re.search(r"\d+\.\d\dx \?", line), line
    note = next(line for line in captured.out.splitlines() if line.startswith("? specdec"))
    assert "above what tau 1.0" in note and "allows (at most 1.2" in note
    assert "noise or a one-time cost" in note and "rerun with --repeats 3" in note
    assert "one repeat per prompt: no measure of the noise" in captured.out


def tune(capsys, profile, prompts, *extra: str):
    return run_cli(capsys, "tune-k", "-p", str(profile), "--prompts", str(prompts), "--ks", "1,2", "--no-auto",
                   "-n", "24", "--warmup", "0", *extra)


def test_tune_k_never_recommends_or_writes_a_marked_figure(capsys, tmp_path, llama_pair, monkeypatch):
    ModelClock(timed=24, stall_in="plain").install(monkeypatch)
    profile = stranger_profile(tmp_path, llama_pair)
    before = profile.read_text()
    code, out, err = tune(capsys, profile, one_prompt(tmp_path), "--repeats", "1", "--write")
    assert code == 1
    assert "? k=1" in out and "? k=2" in out
    assert "no recommendation: no row has a figure that can be ranked" in out
    assert_one_line_error(err, "--write: nothing written: no k has a figure that can be ranked")
    assert profile.read_text() == before


def test_tune_k_write_refuses_a_winner_within_noise_and_force_writes_true_comments(capsys, tmp_path, llama_pair,
                                                                                     monkeypatch):
    ModelClock(timed=24).install(monkeypatch)
    profile = stranger_profile(tmp_path, llama_pair, "# k: 2 beat 3 and 4 on this laptop\n")
    before = profile.read_text()
    code, out, err = tune(capsys, profile, one_prompt(tmp_path), "--repeats", "1", "--write", "-f", "json")
    assert code == 1
    report = json.loads(out)
    assert report["best_k"] == 1 and report["recommended_k"] is None
    assert_one_line_error(err, "--write: nothing written: k=1 was fastest, but 1 paired run against k=2 gives no "
                               "measure of the noise", "add --force to write k=1 anyway")
    assert profile.read_text() == before

    code, out, err = tune(capsys, profile, one_prompt(tmp_path), "--repeats", "1", "--write", "--force")
    assert code == 0, err
    assert "no recommendation: k=1 was fastest" in out
    text = profile.read_text()
    assert "beat 3 and 4" not in text and "a guess" not in text  # they described the old value
    (k_line,) = [line for line in text.splitlines() if line.startswith("k:")]
    assert re.fullmatch(r"k: 1   # specdec tune-k --write, \d{4}-\d\d-\d\d: \d+\.\d\dx plain over 1 prompt x "
                        r"1 repeat \(--force: within noise of the next\)", k_line), k_line
    assert load_profile(str(profile)).k == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.txt", "test.yaml"]  # written in place, no temp left


def test_tune_k_recommends_and_writes_a_winner_outside_the_noise(capsys, tmp_path, llama_pair, monkeypatch):
    """k=1 costs less per token than k=2 when nothing is kept: in each of 3 paired repeats."""
    ModelClock(timed=24).install(monkeypatch)
    profile = stranger_profile(tmp_path, llama_pair)
    code, out, err = tune(capsys, profile, one_prompt(tmp_path), "--repeats", "3", "--write")
    assert code == 0, err
    assert re.search(r"recommended: k=1 \(over k=2: \d\.\d\dx median, \d\.\d\d-\d\.\d\dx over 3 paired runs, "
                     r"faster in 3\)", out), out
    assert "set k: 1" in err and load_profile(str(profile)).k == 1
    assert "(--force" not in profile.read_text()


def test_tune_k_csv_and_integer_ticks(capsys, tmp_path, llama_pair, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    ModelClock(timed=24).install(monkeypatch)
    output = tmp_path / "tune.csv"
    code, out, err = tune(capsys, stranger_profile(tmp_path, llama_pair), one_prompt(tmp_path), "--repeats", "1",
                          "-f", "csv", "-o", str(output), "--plot", str(tmp_path / "k.png"))
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["k"] for r in rows] == ["1", "2"] and rows[0]["recommended"] == "False"
    assert output.read_text().splitlines() == out.splitlines()
    (figure,) = figures
    assert list(figure.axes[0].get_xticks()) == [1, 2]


def test_force_without_write_is_bad_usage(capsys, tmp_path, llama_pair):
    code, out, err = run_cli(capsys, "tune-k", "-p", str(model_profile(tmp_path, llama_pair)), "--force")
    assert code == 2 and out == ""
    assert_one_line_error(err, "--force goes with --write")
