"""`specdec generate --prompts FILE`: one load, one JSONL row a prompt in input order, error rows
that do not stop the run, seeds per prompt, Ctrl-C that keeps every finished row, a progress bar
only on a terminal, and bad usage as one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pexpect
import pyte
import pytest
from cli_helpers import assert_one_line_error, default_sigint, run_cli
from profile_helpers import model_profile

REPO = Path(__file__).resolve().parents[2]
PROMPTS = ["def add(a, b):", "The quick brown fox jumps over the lazy dog and runs into the woods", "import os",
           "class Node:"]
TOO_LONG = " ".join(["the quick brown fox"] * 200)  # far past the tiny models' 512-token context
ROW_KEYS = {"id", "index", "text", "token_ids", "prompt_tokens", "new_tokens", "finish_reason", "seed", "stats"}


def rows_of(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def single_ids(capsys, profile: Path, prompt: str, *extra: str) -> list[int]:
    """The prompt's own `specdec generate -f json` token ids."""
    code, out, err = run_cli(capsys, "generate", prompt, "-p", str(profile), "-f", "json", *extra)
    assert code == 0, err
    return json.loads(out)["token_ids"]


@pytest.fixture
def auto_profile(tmp_path, llama_pair) -> Path:
    """k: auto (what it learns carries across prompts) with the noisy draft model, float32."""
    return model_profile(tmp_path, llama_pair, k="auto", max_new_tokens=16)


# --------------------------------------------------------------------------- rows


def test_rows_in_input_order_equal_each_prompt_generated_alone(capsys, tmp_path, auto_profile):
    records = [{"prompt": PROMPTS[0], "id": "first"}, {"prompt": PROMPTS[1]}, {"prompt": PROMPTS[2], "id": 7},
               {"prompt": PROMPTS[3]}]
    path = write_jsonl(tmp_path / "questions.jsonl", records)
    code, out, err = run_cli(capsys, "generate", "--prompts", str(path), "-p", str(auto_profile))
    assert code == 0, err
    assert err == ""  # stderr is no terminal here: no bar, and no warning to give
    rows = rows_of(out)
    assert [r["id"] for r in rows] == ["first", 2, 7, 4]  # the row's id, else its line number
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    for row, prompt in zip(rows, PROMPTS):
        assert ROW_KEYS <= row.keys()
        assert row["new_tokens"] == len(row["token_ids"]) > 0 and row["seed"] is None
        assert row["token_ids"] == single_ids(capsys, auto_profile, prompt), prompt  # temperature 0, float32
    assert len({r["prompt_tokens"] for r in rows}) > 1  # prompts of different lengths


def test_spec_bench_rows_take_the_first_turn_and_question_id(capsys, tmp_path, llama_profile):
    records = [{"question_id": 81, "category": "writing", "turns": [PROMPTS[1], "Now rewrite it."]},
               {"question_id": 82, "category": "coding", "turns": [PROMPTS[0], "Add type hints."]}]
    path = write_jsonl(tmp_path / "question.jsonl", records)
    code, out, err = run_cli(capsys, "generate", "--prompts", str(path), "-p", str(llama_profile), "-n", "8")
    assert code == 0, err
    rows = rows_of(out)
    assert [r["id"] for r in rows] == [81, 82]
    assert rows[0]["token_ids"] == single_ids(capsys, llama_profile, PROMPTS[1], "-n", "8")
    assert rows[1]["token_ids"] == single_ids(capsys, llama_profile, PROMPTS[0], "-n", "8")


def test_plain_text_from_a_file_and_from_stdin(capsys, tmp_path, llama_profile, monkeypatch):
    text = f"{PROMPTS[0]}\n\n{PROMPTS[2]}\n{{\"prompt\": \"not every line is JSON: a text file\"}}\n"
    path = tmp_path / "prompts.txt"
    path.write_text(text)
    code, from_file, err = run_cli(capsys, "generate", "--prompts", str(path), "-p", str(llama_profile), "-n", "6")
    assert code == 0, err
    rows = rows_of(from_file)
    assert [r["id"] for r in rows] == [1, 3, 4]  # line numbers: the blank line is skipped, not renumbered
    assert rows[0]["token_ids"] == single_ids(capsys, llama_profile, PROMPTS[0], "-n", "6")
    assert rows[2]["prompt_tokens"] > rows[1]["prompt_tokens"]  # the JSON-looking line ran as its text
    code, from_stdin, err = run_cli(capsys, "generate", "--prompts", "-", "-p", str(llama_profile), "-n", "6",
                                    stdin=text.encode(), monkeypatch=monkeypatch)
    assert code == 0, err
    assert [(r["id"], r["token_ids"]) for r in rows_of(from_stdin)] == [(r["id"], r["token_ids"]) for r in rows]


def test_jsonl_on_stdin_is_detected(capsys, llama_profile, monkeypatch):
    lines = f'{{"id": "a", "prompt": "{PROMPTS[0]}"}}\n{{"prompt": "{PROMPTS[2]}"}}\n'
    code, out, err = run_cli(capsys, "generate", "--prompts", "-", "-p", str(llama_profile), "-n", "4",
                             stdin=lines.encode(), monkeypatch=monkeypatch)
    assert code == 0, err
    assert [r["id"] for r in rows_of(out)] == ["a", 2]


def test_error_rows_in_the_middle_do_not_stop_the_run(capsys, tmp_path, llama_profile):
    records = [{"prompt": PROMPTS[0]}, {"prompt": TOO_LONG, "id": "long"}, {"prompt": "  "}, {"prompt": PROMPTS[2]}]
    path = write_jsonl(tmp_path / "mixed.jsonl", records)
    code, out, err = run_cli(capsys, "generate", "--prompts", str(path), "-p", str(llama_profile), "-n", "6")
    assert code == 1, err  # some rows failed: a script notices, and every other row is written
    rows = rows_of(out)
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    assert rows[1].keys() == {"id", "index", "error"} and rows[1]["id"] == "long"
    assert "context" in rows[1]["error"] and "\n" not in rows[1]["error"]
    assert rows[2] == {"id": 3, "index": 2, "error": "the prompt is empty"}
    assert rows[3]["token_ids"] == single_ids(capsys, llama_profile, PROMPTS[2], "-n", "6")
    assert err.strip() == 'specdec: warning: 2 of 4 prompts could not run: their rows carry "error"'


def test_seeded_reruns_reproduce_and_prompt_i_draws_with_seed_plus_i(capsys, tmp_path, llama_profile):
    path = tmp_path / "prompts.txt"
    path.write_text(f"{PROMPTS[0]}\n{PROMPTS[0]}\n{PROMPTS[2]}\n")
    args = ("generate", "--prompts", str(path), "-p", str(llama_profile), "-t", "0.9", "--seed", "5", "-n", "12")
    code, first, err = run_cli(capsys, *args)
    assert code == 0, err
    code, again, _ = run_cli(capsys, *args)
    rows = rows_of(first)
    assert [(r["text"], r["token_ids"], r["seed"]) for r in rows_of(again)] == \
        [(r["text"], r["token_ids"], r["seed"]) for r in rows]
    assert [r["seed"] for r in rows] == [5, 6, 7]
    assert rows[0]["token_ids"] != rows[1]["token_ids"]  # one prompt twice: its rows do not share draws
    for row, prompt in zip(rows, [PROMPTS[0], PROMPTS[0], PROMPTS[2]]):
        assert row["token_ids"] == single_ids(capsys, llama_profile, prompt, "-t", "0.9", "-n", "12",
                                              "--seed", str(row["seed"]))


def test_batch_size_auto_and_1_give_the_same_rows(capsys, tmp_path, llama_profile):
    path = tmp_path / "prompts.txt"
    path.write_text(f"{PROMPTS[0]}\n{PROMPTS[2]}\n")
    outputs = []
    for size in ("1", "auto"):
        code, out, err = run_cli(capsys, "generate", "--prompts", str(path), "--batch-size", size,
                                 "-p", str(llama_profile), "-n", "6")
        assert code == 0, err
        outputs.append([r["token_ids"] for r in rows_of(out)])
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("sampling", [(), ("-t", "0.8", "--seed", "11")], ids=["greedy", "seeded"])
def test_a_batch_of_3_gives_each_row_its_own_batch_one_output(capsys, tmp_path, auto_profile, sampling):
    """A real `specdec` process, k: auto (chosen by goodput in the batch): each row equals its
    prompt's own `specdec generate`, row i with seed S + i."""
    prompts = PROMPTS + ["x", "for i in range(10):"]
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(prompts) + "\n")
    done = subprocess.run([sys.executable, "-m", "specdec_cli", "generate", "--prompts", str(path), "--batch-size", "3",
                           "-p", str(auto_profile), *sampling], cwd=REPO, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    rows = rows_of(done.stdout.decode())
    assert [r["index"] for r in rows] == list(range(len(prompts)))
    for i, (row, prompt) in enumerate(zip(rows, prompts)):
        seed = ("--seed", str(11 + i)) if sampling else ()
        assert row["seed"] == (11 + i if sampling else None)
        assert row["token_ids"] == single_ids(capsys, auto_profile, prompt, *sampling[:2], *seed), prompt


def test_error_rows_in_the_middle_of_a_batch(capsys, tmp_path, llama_profile):
    records = [{"prompt": PROMPTS[0]}, {"prompt": TOO_LONG, "id": "long"}, {"prompt": PROMPTS[1]}, {"prompt": "  "},
               {"prompt": PROMPTS[2]}]
    path = write_jsonl(tmp_path / "mixed.jsonl", records)
    code, out, err = run_cli(capsys, "generate", "--prompts", str(path), "-p", str(llama_profile), "-n", "6",
                             "--batch-size", "3")
    assert code == 1, err
    rows = rows_of(out)
    assert [r["index"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[1].keys() == {"id", "index", "error"} and "context" in rows[1]["error"]
    assert rows[3] == {"id": 4, "index": 3, "error": "the prompt is empty"}
    for i in (0, 2, 4):
        assert rows[i]["token_ids"] == single_ids(capsys, llama_profile, records[i]["prompt"], "-n", "6")
    assert err.strip() == 'specdec: warning: 2 of 5 prompts could not run: their rows carry "error"'


@pytest.mark.parametrize("shape", ["tree", "chain of drafters"])
def test_trees_and_chains_of_drafters_run_in_a_batch(capsys, tmp_path, llama_pair, shape):
    """A real `specdec` process, --batch-size 3 over 5 prompts: a profile with a token tree, and one
    with a chain of drafters (prompt lookup, then the draft model) as a tree, exit 0 with each row
    its prompt's own `specdec generate`."""
    fields = {"tree": {"nodes": 6, "width": 2, "depth": 3}}
    if shape == "chain of drafters":
        fields["drafter"] = {"kind": "chain", "drafters": [{"kind": "ngram"}, {"kind": "model", "model": str(llama_pair["draft"])}]}
    profile = model_profile(tmp_path, llama_pair, **fields)
    prompts = PROMPTS + ["x", "for i in range(10):"]
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(prompts) + "\n")
    done = subprocess.run([sys.executable, "-m", "specdec_cli", "generate", "--prompts", str(path), "--batch-size", "3",
                           "-p", str(profile), "-n", "12"], cwd=REPO, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    rows = rows_of(done.stdout.decode())
    assert [r["index"] for r in rows] == list(range(len(prompts)))
    for row, prompt in zip(rows, prompts):
        assert row["token_ids"] == single_ids(capsys, profile, prompt, "-n", "12"), prompt
    assert sum(row["stats"]["accepted"] for row in rows) > 0  # the drafts were really used


def test_compile_auto_weighs_every_prompt_of_the_file(capsys, tmp_path, llama_profile, monkeypatch):
    import specdec_cli.cli.app as app_module
    from specdec_cli.specs import Workload

    seen = []
    real = app_module.load_pipeline

    def recording(profile, out, workload=None):
        seen.append(workload)
        return real(profile, out, workload)

    monkeypatch.setattr(app_module, "load_pipeline", recording)
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n")
    code, _, err = run_cli(capsys, "generate", "--prompts", str(path), "-p", str(llama_profile), "-n", "5")
    assert code == 0, err
    assert seen == [Workload.of(len(PROMPTS), 5)]


def test_a_file_with_no_prompts_writes_nothing_and_loads_nothing(capsys, tmp_path, monkeypatch):
    import specdec_cli.cli.app as app_module

    monkeypatch.setattr(app_module, "load_pipeline", lambda *a, **k: pytest.fail("loaded models for no prompts"))
    path = tmp_path / "empty.txt"
    path.write_text("\n  \n")
    code, out, err = run_cli(capsys, "generate", "--prompts", str(path))
    assert code == 0 and out == ""
    assert err.strip() == f"specdec: warning: --prompts: no prompts in {path}"


# --------------------------------------------------------------------------- bad usage


@pytest.mark.parametrize("args, fragment", [
    (["def f():"], "give no PROMPT argument"),
    (["--prompt-file", "PROMPTS"], "--prompts and --prompt-file"),
    (["--samples", "2"], "--samples goes with one prompt"),
    (["-f", "text"], "use --format jsonl, not text"),
    (["-f", "human"], "use --format jsonl, not human"),
    (["-f", "json"], "use --format jsonl, not json"),
    (["--batch-size", "0"], "--batch-size: '0' is not a whole number of at least 1, or auto"),
    (["--batch-size", "many"], "--batch-size: 'many' is not a whole number"),
    (["--batch-size", "300"], "batch size 300: at most 256 prompts are decoded at once"),
])
def test_bad_usage_with_prompts_is_one_line_exit_2(capsys, tmp_path, llama_profile, args, fragment):
    path = tmp_path / "prompts.txt"
    path.write_text("def add(a, b):\n")
    args = [str(path) if a == "PROMPTS" else a for a in args]
    code, out, err = run_cli(capsys, "generate", "--prompts", str(path), "-p", str(llama_profile), *args)
    assert code == 2 and out == ""
    assert_one_line_error(err, fragment)


def test_batch_size_without_prompts_is_a_usage_error(capsys, llama_profile):
    code, out, err = run_cli(capsys, "generate", "def f():", "--batch-size", "2", "-p", str(llama_profile))
    assert code == 2 and out == ""
    assert_one_line_error(err, "--batch-size goes with --prompts")


@pytest.mark.parametrize("make, fragment", [
    (lambda d: d / "missing.jsonl", "is not a file"),
    (lambda d: d, "is not a file"),
    (lambda d: (d / "bad.txt").write_bytes(b"caf\xe9\n") and d / "bad.txt", "is not UTF-8 text"),
    (lambda d: (d / "broken.jsonl").write_text('{"prompt": "ok"}\n{"prompt": \n') and d / "broken.jsonl",
     "broken.jsonl:2: not JSON"),
])
def test_unreadable_prompts_file_is_one_line_exit_2(capsys, tmp_path, llama_profile, make, fragment):
    path = make(tmp_path)
    code, out, err = run_cli(capsys, "generate", "--prompts", str(path), "-p", str(llama_profile))
    assert code == 2 and out == ""
    assert_one_line_error(err, "--prompts" if "broken" not in fragment else "", fragment)


# --------------------------------------------------------------------------- real processes: Ctrl-C, a terminal


@pytest.mark.parametrize("batch_size", ["1", "2"])
def test_ctrl_c_keeps_every_finished_row_and_says_how_far_it_got(tmp_path, llama_pair, batch_size):
    profile = model_profile(tmp_path, llama_pair, drafter={"kind": "ngram"}, max_new_tokens=24)
    total = 300  # far more than can finish between the first row and the signal
    path = tmp_path / "prompts.txt"
    path.write_text("".join(f"{PROMPTS[i % len(PROMPTS)]}\n" for i in range(total)))
    proc = subprocess.Popen([sys.executable, "-m", "specdec_cli", "generate", "--prompts", str(path), "-p", str(profile),
                             "--batch-size", batch_size],
                            cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint,
                            bufsize=0)  # unbuffered: readline takes one row, and communicate() gets every later byte
    first = proc.stdout.readline()  # written and flushed the moment the first prompt is done
    assert first.startswith(b"{"), proc.stderr.read()
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    rows = rows_of((first + rest).decode())  # every line a whole row: none cut by the signal
    assert 1 <= len(rows) < total
    assert [r["index"] for r in rows] == list(range(len(rows)))
    ours = [line for line in err.decode().splitlines() if line.startswith("specdec")]  # torch's import noise aside
    assert ours == [f"specdec: interrupted after {len(rows)} of {total} prompts"]
    assert "Traceback" not in err.decode()


def run_in_terminal(command: str, columns: int = 120, rows: int = 24) -> tuple[int, list[str]]:
    """(exit code, the lines a terminal shows) for a shell command run in a pseudo-terminal."""
    screen = pyte.Screen(columns, rows)
    stream = pyte.ByteStream(screen)
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(columns), "LINES": str(rows)}
    env.pop("NO_COLOR", None)
    child = pexpect.spawn("bash", ["-c", command], cwd=str(REPO), env=env, dimensions=(rows, columns),
                          timeout=300, preexec_fn=default_sigint)
    while True:
        try:
            stream.feed(child.read_nonblocking(65536, timeout=300))
        except pexpect.EOF:
            break
    child.close()
    return child.exitstatus, [line.rstrip() for line in screen.display if line.strip()]


def test_progress_bar_on_a_terminal_while_rows_go_to_the_file(tmp_path, llama_profile):
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS[:3]) + "\n")
    answers = tmp_path / "answers.jsonl"
    command = f"{sys.executable} -m specdec_cli generate --prompts {path} -p {llama_profile} -n 8 > {answers}"
    code, screen = run_in_terminal(command)
    assert code == 0, screen
    bar = [line for line in screen if line.startswith("prompts")]
    assert len(bar) == 1, screen  # the bar stays, as the run's summary
    assert "3/3" in bar[0] and "tok/s" in bar[0] and "acceptance" in bar[0], bar
    assert not any(line.startswith("{") for line in screen)  # rows go to the file, not the terminal
    rows = rows_of(answers.read_text())
    assert [r["index"] for r in rows] == [0, 1, 2] and "\x1b" not in answers.read_text()


def test_rows_scroll_above_the_bar_when_stdout_is_the_terminal_too(tmp_path, llama_profile):
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS[:2]) + "\n")
    code, screen = run_in_terminal(f"{sys.executable} -m specdec_cli generate --prompts {path} -p {llama_profile} -n 4",
                                   columns=3000)
    assert code == 0, screen
    shown = [json.loads(line) for line in screen if line.startswith("{")]  # each row whole, on a line of its own
    assert [r["index"] for r in shown] == [0, 1]
    assert screen[-1].startswith("prompts") and "2/2" in screen[-1], screen
