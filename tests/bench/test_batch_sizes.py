"""bench --batch-sizes and tune-k --batch-sizes on tiny models: report contract, identity, the k table."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli_helpers import assert_one_line_error, default_sigint, run_cli
from profile_helpers import model_profile
import specdec_cli
from specdec_cli.bench.batched import batch_requests, crossover, k_table
from specdec_cli.profile import load_profile

FAST = ("-n", "6", "--repeats", "1", "--warmup", "0")


@pytest.fixture
def two_prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("def add(a, b):\nThe quick brown fox jumps over\n")
    return path


def run_process(*args: str) -> subprocess.CompletedProcess:
    """`specdec ARGS` through the console entry point, in a process of its own."""
    repo = str(Path(specdec_cli.__file__).parents[1])  # this checkout's package, whatever is installed
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "specdec_cli", *args], capture_output=True, text=True, env=env,
                          timeout=300, preexec_fn=default_sigint)  # the timeout: a hang guard only


def test_bench_batch_sizes_json_through_the_cli_process(tmp_path, llama_pair, two_prompts):
    """The real console entry point: exit 0, a JSON document on stdout, the plot written; --methods
    may name the two methods it measures."""
    profile = model_profile(tmp_path, llama_pair, chat=False, k=2)
    plot = tmp_path / "batches.png"
    args = ["bench", "-p", str(profile), "--prompts", str(two_prompts), "--batch-sizes", "1,2", *FAST, "-f", "json",
            "--methods", "plain,specdec"]
    if importlib.util.find_spec("matplotlib") is not None:
        args += ["--plot", str(plot)]
    done = run_process(*args)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    if "--plot" in args:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [s["batch_size"] for s in report["batch_sizes"]] == [1, 2]
    assert "crossover_batch_size" in report
    for size in report["batch_sizes"]:
        assert size["plain"]["tokens_per_second"] > 0 and size["specdec"]["tokens_per_second"] > 0
        assert size["specdec"]["k"] == 2 and [r["k"] for r in size["ks"]] == [2]
        assert 0 <= size["specdec"]["acceptance_rate"] <= 1 and size["specdec"]["mean_accepted_length"] >= 1
        assert size["plain"]["mean_accepted_length"] == pytest.approx(1.0)
    # temperature 0, float32: every request's ids are plain decoding's, at every batch size
    assert report["outputs_identical"] is True and report["differences"] == []
    assert report["settings"]["compile"] == "off"


def test_batch_runs_carry_each_prompts_ids(tmp_path, llama_pair, two_prompts):
    """The identity check compares real ids: the requests cycle the prompts, and the runs keep every row."""
    from specdec_cli import Pipeline
    from specdec_cli.bench.batched import run_batches
    from specdec_cli.bench.options import BenchSettings
    from specdec_cli.bench.workload import load_prompts

    pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, chat=False, k=2)))
    prompts = load_prompts(two_prompts, (), None)
    bench = run_batches(pipe, prompts, BenchSettings(max_new_tokens=5, repeats=1, warmup=0, k=2), [1, 2], [2])
    for size in (1, 2):
        plain, spec = bench.runs(size, "plain")[0], bench.runs(size, "k=2")[0]
        assert len(plain.token_ids) == 2 and all(len(ids) == 5 for ids in plain.token_ids)
        assert plain.token_ids == spec.token_ids
        assert plain.token_ids[0] != plain.token_ids[1]  # different prompts, different answers
    assert bench.runs(1, "plain")[0].token_ids == bench.runs(2, "plain")[0].token_ids
    bench.results[-1].token_ids[0] = (0,) * 5  # a broken row is found
    assert [d["method"] for d in bench.differences()] == ["batch=2 k=2"]


def test_k_auto_profile_runs_as_itself_against_plain(capsys, tmp_path, llama_pair, two_prompts):
    """A k: auto profile is measured as generate runs it (at 1 the adaptive k, above it goodput's
    choice), not as a sweep of fixed ks; every request's ids stay plain decoding's."""
    profile = model_profile(tmp_path, llama_pair, chat=False, k="auto")
    code, out, err = run_cli(capsys, "bench", "-p", str(profile), "--prompts", str(two_prompts), "--batch-sizes", "1,2",
                             *FAST, "-f", "json")
    assert code == 0, err
    report = json.loads(out)
    assert report["settings"]["k_auto"] is True and report["settings"]["ks"] == []
    assert report["k_by_batch_size"] is None
    for size in report["batch_sizes"]:
        assert size["specdec"]["k"] == "auto" and [r["k"] for r in size["ks"]] == ["auto"]
        assert size["specdec"]["tokens_per_second"] > 0 and size["specdec"]["mean_accepted_length"] >= 1
    assert report["outputs_identical"] is True
    code, out, err = run_cli(capsys, "bench", "-p", str(profile), "--prompts", str(two_prompts), "--batch-sizes", "2",
                             *FAST)
    assert code == 0, err
    assert "k: auto" in out and "tune-k --batch-sizes" in out


def test_requests_cycle_to_full_batches():
    assert batch_requests([[1], [2], [3]], 2) == [[1], [2], [3], [1]]
    assert batch_requests([[1], [2]], 4) == [[1], [2], [1], [2]]
    assert batch_requests([[1], [2]], 1) == [[1], [2]]


def size(batch_size, speedup, k=3, recommended=True, flags=()):
    best = k if speedup > 1 else 0
    return {"batch_size": batch_size, "k": k, "specdec": {"speedup": speedup, "speedup_flags": list(flags)},
            "best_k": best, "recommended_k": best if recommended else None}


def test_crossover_and_table():
    sizes = [size(1, 2.0, 5), size(2, 1.5, 5), size(4, 1.1, 3), size(8, 0.9), size(16, 0.8)]
    assert crossover(sizes) == 8
    assert k_table(sizes) == {1: 5, 4: 3, 8: 0}
    assert crossover(sizes[:3]) is None
    sizes[1]["recommended_k"] = None
    assert k_table(sizes) is None and k_table(sizes, recommended_only=False) == {1: 5, 4: 3, 8: 0}


@pytest.mark.parametrize("value,fragment", [
    ("0,2", "each batch size must be between 1 and 1024"),
    ("two", "'two' is not a comma-separated list of batch sizes"),
    (",", "each batch size must be between 1 and"),
    ("1,2048", "between 1 and 1024"),
])
def test_bad_batch_sizes_are_one_line(capsys, tmp_path, llama_pair, value, fragment):
    code, out, err = run_cli(capsys, "bench", "-p", str(model_profile(tmp_path, llama_pair)), "--batch-sizes", value)
    assert code == 2 and out == ""
    assert_one_line_error(err, "--batch-sizes", fragment)


@pytest.mark.parametrize("methods,fragment", [
    ("plain,specdec,hf-plain", "--methods: hf-plain cannot go with --batch-sizes (it measures plain, specdec;"),
    ("specdec-tree", "--methods: specdec-tree cannot go with --batch-sizes"),
    ("plain", "--batch-sizes measures specdec against plain: give plain,specdec"),
    ("specdec,fast", "--methods: 'fast' is not one of plain, specdec, specdec-tree, hf-plain, hf-assisted"),
])
def test_batch_sizes_refuse_the_methods_they_do_not_measure_by_name(tmp_path, llama_pair, methods, fragment):
    done = run_process("bench", "-p", str(model_profile(tmp_path, llama_pair)), "--batch-sizes", "1,2",
                       "--methods", methods)
    assert done.returncode == 2 and done.stdout == ""
    assert_one_line_error(done.stderr, fragment)


@pytest.mark.parametrize("extra,fragment", [
    (("--tree", "8"), "--tree cannot go with --batch-sizes"),
    (("-f", "csv"), "--format csv cannot go with --batch-sizes"),
    (("--endpoint", "http://localhost:1"), "--batch-sizes"),
])
def test_batch_sizes_refuse_what_they_cannot_combine_with(capsys, tmp_path, llama_pair, extra, fragment):
    code, out, err = run_cli(capsys, "bench", "-p", str(model_profile(tmp_path, llama_pair)), "--batch-sizes", "1,2",
                             *extra)
    assert code == 2 and out == ""
    assert_one_line_error(err, fragment)


@pytest.mark.parametrize("fields", [
    {"tree": {"nodes": 6, "width": 2, "depth": 3}, "k": "auto"},
    {"drafter": {"kind": "chain", "drafters": [{"kind": "ngram"}, {"kind": "early-exit", "layers": 2}]}, "k": 2},
], ids=["tree", "chain"])
def test_batch_sizes_measure_trees_and_chains_of_drafters(capsys, tmp_path, llama_pair, two_prompts, fields):
    """A profile with a token tree (run by its k: auto) or a chain of drafters: measured at every
    batch size, every request's ids plain decoding's."""
    profile = model_profile(tmp_path, llama_pair, chat=False, **fields)
    code, out, err = run_cli(capsys, "bench", "-p", str(profile), "--prompts", str(two_prompts), "--batch-sizes", "1,2",
                             *FAST, "-f", "json")
    assert code == 0, err
    report = json.loads(out)
    assert [s["batch_size"] for s in report["batch_sizes"]] == [1, 2]
    assert report["outputs_identical"] is True and report["differences"] == []


def test_plot_without_batch_sizes_is_bad_usage(capsys, tmp_path, llama_pair):
    code, out, err = run_cli(capsys, "bench", "-p", str(model_profile(tmp_path, llama_pair)), "--plot", "x.png")
    assert code == 2
    assert_one_line_error(err, "--plot goes with --batch-sizes")


def test_tune_k_batch_sizes_write_refuses_noise_then_force_writes_a_table(capsys, tmp_path, llama_pair, two_prompts):
    profile = model_profile(tmp_path, llama_pair, chat=False, k=2)
    before = profile.read_text()
    args = ("tune-k", "-p", str(profile), "--prompts", str(two_prompts), "--batch-sizes", "1,2", "--ks", "1,2", *FAST)
    code, out, err = run_cli(capsys, *args, "--write")
    assert code == 1  # one repeat: no measure of the noise at any batch size
    assert_one_line_error(err, "--write: nothing written: the best k is within noise", "batch size 1, 2", "--force")
    assert profile.read_text() == before

    code, out, err = run_cli(capsys, *args, "--write", "--force")
    assert code == 0, err
    assert "best k per batch size" in out and "crossover" in out
    table = load_profile(str(profile)).k_by_batch_size
    assert table and table[0][0] == 1 and all(0 <= k <= 2 for _, k in table)
    (line,) = [line for line in profile.read_text().splitlines() if line.startswith("k_by_batch_size:")]
    assert re.fullmatch(r"k_by_batch_size: \{1: \d(, 2: \d)?\}   # specdec tune-k --batch-sizes --write, "
                        r"\d{4}-\d\d-\d\d: over 2 prompts x 1 repeat \(--force: within noise at batch size 1, 2\)",
                        line), line
    assert "set k_by_batch_size" in err

    code, out, err = run_cli(capsys, "profiles", "show", str(profile))
    assert code == 0, err
    assert yaml.safe_load(out)["k_by_batch_size"] == dict(table)


def test_tune_k_batch_sizes_refuses_trees_and_auto(capsys, tmp_path, llama_pair):
    profile = str(model_profile(tmp_path, llama_pair))
    code, out, err = run_cli(capsys, "tune-k", "-p", profile, "--batch-sizes", "1,2", "--trees", "8")
    assert code == 2
    assert_one_line_error(err, "--trees cannot go with --batch-sizes")
    code, out, err = run_cli(capsys, "tune-k", "-p", profile, "--batch-sizes", "1,2", "--auto")
    assert code == 2
    assert_one_line_error(err, "--auto cannot go with --batch-sizes")


def test_ctrl_c_reports_the_batch_sizes_that_finished(capsys, tmp_path, llama_pair, two_prompts, monkeypatch):
    from specdec_cli.bench.batched import BatchMethod

    run = BatchMethod.run

    def interrupted_at_batch_2(method, *args):
        if method.batch_size == 2:
            raise KeyboardInterrupt
        return run(method, *args)

    monkeypatch.setattr(BatchMethod, "run", interrupted_at_batch_2)
    output = tmp_path / "report.json"
    code, out, err = run_cli(capsys, "bench", "-p", str(model_profile(tmp_path, llama_pair, chat=False, k=2)),
                             "--prompts", str(two_prompts), "--batch-sizes", "1,2", *FAST, "-f", "json", "-o", str(output))
    assert code == 130
    assert [s["batch_size"] for s in json.loads(out)["batch_sizes"]] == [1]
    assert "interrupted: the 1 batch size that finished (nothing written)" in err
    assert not output.exists()


def test_tune_k_batch_sizes_writes_k_0_where_drafting_never_pays(capsys, tmp_path, llama_pair, two_prompts, monkeypatch):
    """A draft that is almost never kept, timed by a clock only the models move: plain wins every paired
    run at every batch size, so the table is plain decoding from batch size 1 up, written without --force."""
    from model_clock import ModelClock

    ModelClock(timed=6).install(monkeypatch)
    profile = model_profile(tmp_path, {"target": llama_pair["target"], "draft": llama_pair["stranger"]}, chat=False, k=2)
    code, out, err = run_cli(capsys, "tune-k", "-p", str(profile), "--prompts", str(two_prompts), "--batch-sizes", "1,2",
                             "--ks", "1,2", "-n", "6", "--repeats", "3", "--warmup", "0", "--write", "-f", "json")
    assert code == 0, err
    report = json.loads(out)
    for size in report["batch_sizes"]:
        assert size["best_k"] == 0 and size["recommended_k"] == 0
        assert size["verdict"]["against"] == "k=1" and size["verdict"]["wins"] == 3
        assert size["specdec"]["speedup"] < 1.0 and size["specdec"]["k"] == 1  # the cheaper of two losers
    assert report["crossover_batch_size"] == 1
    assert load_profile(str(profile)).k_by_batch_size == ((1, 0),)
    assert "(--force" not in profile.read_text()
