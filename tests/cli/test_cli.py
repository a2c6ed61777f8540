"""The CLI contract scripts depend on: output formats, stdin, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_one_line_error, default_sigint, run_cli
from profile_helpers import model_profile, write_profile

from specdec_cli import Pipeline

STATS_KEYS = {
    "k", "drafted", "accepted", "acceptance_rate", "mean_accepted_length", "target_forwards",
    "tokens_per_second", "accept_length_histogram", "per_position_acceptance",
}
REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- formats


def test_text_format_prints_only_the_generated_text(capsys, llama_profile):
    code, out, err = run_cli(capsys, "generate", "def add(a, b):", "-p", str(llama_profile), "--no-chat", "--format", "text")
    assert code == 0
    pipe = Pipeline.from_profile(str(llama_profile))
    expected = pipe.generate("def add(a, b):", chat=False).text
    assert out == expected + "\n"
    assert "tokens in" in err  # the summary goes to stderr


def test_piped_stdout_defaults_to_text(capsys, llama_profile):
    code, out, _ = run_cli(capsys, "generate", "def add(a, b):", "-p", str(llama_profile), "--no-chat")
    assert code == 0
    code, text_out, _ = run_cli(capsys, "generate", "def add(a, b):", "-p", str(llama_profile), "--no-chat", "-f", "text")
    assert out == text_out


def test_json_format_contract(capsys, llama_profile):
    code, out, _ = run_cli(capsys, "generate", "def add(a, b):", "-p", str(llama_profile), "--no-chat",
                           "--format", "json", "--seed", "7", "-n", "20")
    assert code == 0
    obj = json.loads(out)
    assert {"text", "token_ids", "prompt_tokens", "new_tokens", "finish_reason", "profile", "seed", "stats"} <= obj.keys()
    assert STATS_KEYS <= obj["stats"].keys()
    assert obj["seed"] is None  # temperature 0: nothing is drawn, whatever --seed says
    assert obj["new_tokens"] == len(obj["token_ids"]) == 20
    assert obj["finish_reason"] == "length" and obj["profile"] == "test"
    assert len(obj["stats"]["accept_length_histogram"]) == obj["stats"]["k"] + 1
    pipe = Pipeline.from_profile(str(llama_profile))
    assert tuple(obj["token_ids"]) == pipe.generate("def add(a, b):", chat=False, max_new_tokens=20).token_ids


def test_samples_jsonl_loads_models_once(capsys, llama_profile, monkeypatch):
    import specdec_cli.api as api

    loads = []
    real = api.load_model
    monkeypatch.setattr(api, "load_model", lambda *a, **kw: loads.append(a) or real(*a, **kw))
    code, out, _ = run_cli(capsys, "generate", "def add(a, b):", "-p", str(llama_profile), "--samples", "3",
                           "--format", "jsonl", "--temperature", "1.0", "--seed", "5")
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["seed"] for r in rows] == [5, 6, 7]
    assert len(loads) == 2  # target and draft, once each
    assert len({tuple(r["token_ids"]) for r in rows}) > 1  # independent samples


def test_human_format_when_not_a_terminal(capsys, llama_profile):
    code, out, err = run_cli(capsys, "generate", "def add(a, b):", "-p", str(llama_profile), "--format", "human", "--no-live", "-v")
    assert code == 0
    assert out.strip() and "tokens/forward" not in out and "undrafted" not in out  # no status line, no legend
    assert "tau" in err and "accepted drafts per target forward" in err  # the summary; -v: the histogram
    assert "drafting s" in err and "(no draft)" in err  # and what each drafter did


def test_json_stats_say_each_drafters_drafting_time_and_the_steps_that_drafted_nothing(capsys, tmp_path, llama_pair):
    chain = {"kind": "chain", "drafters": [{"kind": "ngram"}, {"kind": "model", "model": str(llama_pair["draft"])}]}
    profile = model_profile(tmp_path, llama_pair, drafter=chain, max_new_tokens=32)
    code, out, err = run_cli(capsys, "generate", "def add(a, b):\n    return a + b\n\ndef add(", "-p", str(profile),
                             "--no-chat", "-f", "json")
    assert code == 0, err
    stats = json.loads(out)["stats"]
    drafters = stats["per_drafter"]
    assert drafters and all(row["draft_seconds"] >= 0 for row in drafters.values())
    assert sum(row["calls"] for row in drafters.values()) + stats["plain_steps"] == stats["target_forwards"]


def test_prompt_from_stdin_dash_and_piped(capsys, llama_profile, monkeypatch):
    code, out_dash, _ = run_cli(capsys, "generate", "-", "-p", str(llama_profile), "-f", "text", stdin=b"def add(a, b):", monkeypatch=monkeypatch)
    assert code == 0
    code, out_piped, _ = run_cli(capsys, "generate", "-p", str(llama_profile), "-f", "text", stdin=b"def add(a, b):", monkeypatch=monkeypatch)
    assert code == 0
    code, out_arg, _ = run_cli(capsys, "generate", "def add(a, b):", "-p", str(llama_profile), "-f", "text")
    assert out_dash == out_piped == out_arg


def test_prompt_file(capsys, llama_profile, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("def add(a, b):")
    code, out, _ = run_cli(capsys, "generate", "--prompt-file", str(prompt), "-p", str(llama_profile), "-f", "text")
    assert code == 0
    assert out == run_cli(capsys, "generate", "def add(a, b):", "-p", str(llama_profile), "-f", "text")[1]


def test_cli_options_override_the_profile(capsys, llama_profile):
    code, out, _ = run_cli(capsys, "generate", "x = 1", "-p", str(llama_profile), "-f", "json", "--k", "2", "-n", "9")
    obj = json.loads(out)
    assert obj["stats"]["k"] == 2 and obj["new_tokens"] == 9


def test_profiles_list_and_show(capsys):
    code, out, _ = run_cli(capsys, "profiles")
    assert code == 0 and "smollm2-demo" in out and "qwen2.5-coder-1.5b" in out
    code, out, _ = run_cli(capsys, "profiles", "show", "qwen2.5-coder-1.5b", "--format", "json")
    data = json.loads(out)
    assert data["target"]["model"] == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert data["drafter"] == {"kind": "model", "model": "Qwen/Qwen2.5-Coder-0.5B-Instruct", "revision": None, "gguf_file": None, "dtype": "auto", "quantize": "none", "group_size": None, "quantize_head": False, "vocab": "auto"}


def test_every_shipped_profile_validates():
    from specdec_cli.profile import load_profile
    from specdec_cli.profile_files import list_profiles, shipped_profiles_dir

    shipped = sorted(shipped_profiles_dir().glob("*.yaml"))
    assert len(shipped) >= 5
    for path in shipped:
        load_profile(path)
    assert {p.stem for p in list_profiles()} >= {p.stem for p in shipped}


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--k", "0"], ["--k", "minimum of 1"]),
        (["--k", "1000"], ["--k", "maximum of 64"]),
        (["--k", "lots"], ["--k", "'lots'"]),
        (["--temperature", "-0.5"], ["--temperature", "positive"]),
        (["--top-p", "0"], ["--top-p", "(0, 1]"]),
        (["--top-p", "1.5"], ["--top-p", "(0, 1]"]),
        (["--max-new-tokens", "0"], ["--max-new-tokens"]),
    ],
)
def test_bad_options_exit_2(capsys, llama_profile, args, fragments):
    code, out, err = run_cli(capsys, "generate", "hi", "-p", str(llama_profile), *args)
    assert code == 2 and out == ""
    assert_one_line_error(err, *fragments)


# click's usage errors, as the installed typer raises them (its own copy of click): exit 2, one line,
# never "unexpected"; on every command
COMMANDS = [["generate", "hi"], ["bench"], ["tune-k"], ["verify"], ["export", "--to", "vllm"], ["profiles", "show", "smollm2-demo"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0] if c[0] != "profiles" else "profiles-show")
@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--no-such-option"], ["No such option: --no-such-option"]),
        (["--format", "xml"], ["'xml' is not one of"]),
        (["--max-new-tokenz", "5"], ["No such option", "--max-new-tokens"]),  # with its "did you mean"
    ],
    ids=["unknown-option", "bad-choice", "typo"],
)
def test_usage_errors_exit_2_on_every_command(capsys, command, args, fragments):
    if command[0] == "profiles" and args[0] == "--max-new-tokenz":
        fragments = ["No such option"]  # profiles show has no option to suggest
    if command[0] == "export" and args[0] == "--max-new-tokenz":
        fragments = ["No such option"]
    code, out, err = run_cli(capsys, *command, *args)
    assert code == 2 and out == "", err
    assert_one_line_error(err, *fragments)
    assert "unexpected" not in err


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["genrate"], ["No such command 'genrate'", "generate"]),
        (["generate", "hi", "--samples", "0"], ["--samples"]),
        (["verify", "--limit", "abc"], ["--limit"]),
        (["generate", "hi", "-k", "-3"], ["--k", "minimum of 1"]),
    ],
    ids=["unknown-command", "out-of-range-int", "not-an-int", "negative-k"],
)
def test_more_usage_errors_exit_2(capsys, args, fragments):
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == "", err
    assert_one_line_error(err, *fragments)


def test_version_is_pyprojects():
    """`specdec --version` and __version__ say pyproject's version, the one place it is written."""
    import tomllib

    import specdec_cli

    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    done = subprocess.run([sys.executable, "-m", "specdec_cli", "--version"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)  # a hang guard only
    assert done.returncode == 0 and done.stdout == f"specdec {declared}\n", done.stderr
    assert specdec_cli.__version__ == declared


@pytest.mark.parametrize("prompt", ["", "   \n\t "])
def test_empty_prompt_exits_2(capsys, llama_profile, prompt):
    code, _, err = run_cli(capsys, "generate", prompt, "-p", str(llama_profile))
    assert code == 2
    assert_one_line_error(err, "prompt is empty")


def test_missing_profile(capsys):
    code, _, err = run_cli(capsys, "generate", "hi", "-p", "no-such-profile")
    assert code == 2
    assert_one_line_error(err, "no profile named 'no-such-profile'", "smollm2-demo")
    code, _, err = run_cli(capsys, "generate", "hi", "-p", "/nowhere/x.yaml")
    assert code == 2
    assert_one_line_error(err, "/nowhere/x.yaml", "no such file")


def test_malformed_profile(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("target: {model: [unclosed\n")
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(bad))
    assert code == 2
    assert_one_line_error(err, str(bad), "not valid YAML", "line")


def test_unknown_key_and_value_name_the_key(capsys, tmp_path, llama_pair):
    profile = model_profile(tmp_path, llama_pair, temprature=0.5)
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(profile))
    assert code == 2
    assert_one_line_error(err, f"{profile}: temprature: unknown key")
    profile = model_profile(tmp_path, llama_pair, drafter={"kind": "modle"})
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(profile))
    assert_one_line_error(err, f"{profile}: drafter.kind: 'modle' is not one of model, ngram, early-exit, medusa, eagle, chain")


def test_model_path_that_does_not_exist(capsys, tmp_path):
    profile = write_profile(tmp_path, target={"model": str(tmp_path / "missing")}, drafter={"kind": "ngram"})
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(profile))
    assert code == 2
    assert_one_line_error(err, "does not exist")


def test_hub_id_while_offline_says_so(capsys, tmp_path, monkeypatch):
    """Offline, a hub id fails with what to do and without trying the network: no minute of retries."""
    import socket

    attempts = []  # every host looked up or connected to

    def refused(host, *args, **kwargs):
        attempts.append(host)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refused)
    monkeypatch.setattr(socket.socket, "connect", lambda sock, address: refused(address))
    profile = write_profile(tmp_path, target={"model": "SomeOrg/some-model-that-is-not-cached"}, drafter={"kind": "ngram"})
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(profile))
    assert code == 1
    assert_one_line_error(err, "offline", "local folder")
    assert attempts == []


def test_tokenizer_mismatch_is_refused(capsys, tmp_path, llama_pair, models_root):
    from tiny_models import build_model, build_word_tokenizer, llama_config, save

    words = build_word_tokenizer(tmp_path / "words")
    other = save(build_model(llama_config(words, layers=1, hidden=32), seed=2), words, tmp_path / "other-draft")
    profile = model_profile(tmp_path, llama_pair, drafter={"kind": "model", "model": str(other)})
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(profile))
    assert code == 2
    assert_one_line_error(err, "different tokenizers")


def test_prompt_longer_than_context(capsys, llama_profile):
    long_prompt = "def add(a, b):\n    return a + b\n" * 200
    code, _, err = run_cli(capsys, "generate", long_prompt, "-p", str(llama_profile), "--no-chat")
    assert code == 2
    assert_one_line_error(err, "context is 512", "shorten")


def test_max_new_tokens_past_context_stops_at_context(capsys, llama_profile):
    prompt = "def add(a, b):\n    return a + b\n" * 26  # 468 tokens of the 512
    code, out, err = run_cli(capsys, "generate", prompt, "-p", str(llama_profile), "--no-chat", "-f", "json", "-n", "400")
    assert code == 0
    obj = json.loads(out)
    assert obj["prompt_tokens"] + obj["new_tokens"] == 512
    assert "would pass the context" in err


def test_cuda_asked_for_but_absent(capsys, llama_profile, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(llama_profile), "--device", "cuda")
    assert code == 2
    assert_one_line_error(err, "cuda", "--device cpu")


def test_out_of_memory_suggests_a_fix(capsys, llama_profile, monkeypatch):
    from specdec_cli.runtime.lm import CachedLM

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(CachedLM, "forward", oom)
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(llama_profile), "-f", "json")
    assert code == 1
    assert_one_line_error(err, "out of memory", "dtype", "device_map")


def test_debug_variable_shows_the_traceback(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_DEBUG", "1")
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(tmp_path / "none.yaml"))
    assert code == 2 and "Traceback" in err


# --------------------------------------------------------------------------- real processes


def spawn(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "specdec_cli", *args], cwd=REPO, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=default_sigint, **kwargs)


def test_module_entry_point_reads_stdin_and_exits_0(llama_profile):
    proc = spawn("generate", "-p", str(llama_profile), "-f", "json")
    out, err = proc.communicate(b"def add(a, b):", timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out)["new_tokens"] == 24


def test_invalid_utf8_on_stdin_is_a_clean_error(llama_profile):
    proc = spawn("generate", "-p", str(llama_profile))
    out, err = proc.communicate(b"caf\xe9 \xff\xfe", timeout=120)
    assert proc.returncode == 2 and out == b""
    assert_one_line_error(err.decode(), "stdin is not valid UTF-8")


def test_ctrl_c_prints_partial_text_and_stats_then_exits_130(tmp_path, tokenizer):
    from tiny_models import build_endless_model

    # a model that never emits EOS, with a 4096-token context: seconds of decoding, time to interrupt it
    endless = build_endless_model(tokenizer, tmp_path / "endless")
    profile = write_profile(tmp_path, target={"model": str(endless), "dtype": "float32"},
                            drafter={"kind": "ngram"}, max_new_tokens=4000, k=2)
    proc = spawn("generate", "def add(a, b):", "-p", str(profile), "-f", "text", "--no-chat")
    first = proc.stdout.read(1)  # text is streaming: the decode loop is running
    assert first
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    text = (first + out).decode()
    assert text.strip()
    assert "finish: interrupted" in err.decode() and "tokens in" in err.decode()


def test_one_seed_gives_one_text_under_k_auto_and_any_k(tmp_path, llama_pair):
    """`generate -t 0.8 -s 1` under the profile's k: auto, then with -k 3: one text (k: auto tries
    several ks and keeps one by its timings, so its steps are not the fixed run's)."""
    profile = model_profile(tmp_path, llama_pair, k="auto", max_new_tokens=30)
    runs = []
    for extra in ([], ["-k", "3"]):
        proc = spawn("generate", "def add(a, b):", "-p", str(profile), "-f", "json", "-t", "0.8", "-s", "1", *extra)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        runs.append(json.loads(out))
    assert all(run["seed"] == 1 for run in runs)
    assert len(runs[0]["token_ids"]) == 30 and runs[0]["stats"]["accepted"] > 0
    assert [run["text"] for run in runs] == [runs[0]["text"]] * len(runs)
