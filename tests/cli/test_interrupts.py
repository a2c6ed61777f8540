"""Interrupts and crashes: Ctrl-C during generate / bench / tune-k, and a --write that dies mid-way.

Contract (cli/bench.py, cli/output.py): Ctrl-C exits 130 and reports what finished; no --output file is
written, so none is ever half-written; files are replaced atomically (temp file beside, fsync, rename),
and a failed write leaves the old file as it was and no temp file behind.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from profile_helpers import model_profile
from cli_helpers import default_sigint, assert_one_line_error, run_cli
from model_clock import ModelClock
from specdec_cli.profile import load_profile
from specdec_cli.profile_files import shipped_profiles_dir, user_profiles_dir
from specdec_cli.bench.tune import with_k, write_best_k

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
PROMPT_LINES = [
    "def add(a, b):", "The quick brown fox", "for i in range(10):", "Write a function", "import os",
    "class Node:", "Summarise the text", "print(sys.argv)",
]


def prompts_file(folder: Path, count: int) -> Path:
    path = folder / "prompts.txt"
    path.write_text("\n".join(PROMPT_LINES[:count]) + "\n")
    return path


# --------------------------------------------------------------------------- real processes, real SIGINT


@pytest.fixture(scope="module")
def endless(tmp_path_factory, tokenizer):
    """A model with a 4096-token context that never emits EOS under greedy decoding (seconds per
    run: time to interrupt it), and a profile for it with prompt lookup as the drafter."""
    from tiny_models import build_endless_model

    root = tmp_path_factory.mktemp("endless")
    folder = build_endless_model(tokenizer, root / "model")
    profile = root / "endless.yaml"
    profile.write_text(
        "# the endless test model\n"
        f"target: {{model: {folder}, dtype: float32}}\n"
        "drafter: {kind: ngram}   # no second model\n"
        "device: cpu\nk: 2\nmax_new_tokens: 100000\nchat: false\ncompile: off\n"
    )
    return {"folder": folder, "profile": profile}


class Spawned:
    """`python -m specdec_cli ...` with stdout and stderr drained by threads (no pipe ever fills)."""

    def __init__(self, *args: str, progress: bool = False):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if progress:  # let rich draw its progress bar on the piped stderr: the sign that runs are going
            env.update(FORCE_COLOR="1", TTY_INTERACTIVE="1", TERM="xterm", COLUMNS="200")
        self.proc = subprocess.Popen([sys.executable, "-m", "specdec_cli", *args], cwd=REPO, env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     preexec_fn=default_sigint)
        self.out, self.err = bytearray(), bytearray()
        self.threads = [threading.Thread(target=self._drain, args=(s, b), daemon=True)
                        for s, b in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for thread in self.threads:
            thread.start()

    @staticmethod
    def _drain(stream, buffer: bytearray) -> None:
        while chunk := stream.read1(65536):
            buffer.extend(chunk)

    def wait_for(self, needle: bytes, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.err:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"never saw {needle!r} (exit {self.proc.poll()}): {bytes(self.err[-2000:])!r}")
            time.sleep(0.05)

    def interrupt(self, timeout: float = 60) -> tuple[int, bytes, str]:
        assert self.proc.poll() is None, "the run ended before it could be interrupted"
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail("SIGINT did not stop the process")
        for thread in self.threads:
            thread.join(10)
        return code, bytes(self.out), ANSI.sub(b"", bytes(self.err)).decode("utf-8", "replace")


def test_ctrl_c_during_json_generate_prints_a_valid_partial_object(endless):
    from transformers import AutoTokenizer

    run = Spawned("generate", "def add(a, b):", "-p", str(endless["profile"]), "-f", "json")
    run.wait_for(b"would pass the context")  # logged just before decoding starts
    time.sleep(0.5)
    code, out, err = run.interrupt()
    assert code == 130, err
    obj = json.loads(out)  # one complete JSON document, not a truncated one
    assert obj["finish_reason"] == "interrupted"
    assert 0 < obj["new_tokens"] == len(obj["token_ids"]) < 4096 - obj["prompt_tokens"]
    assert obj["stats"]["target_forwards"] > 0 and obj["stats"]["new_tokens"] == obj["new_tokens"]
    tokenizer = AutoTokenizer.from_pretrained(endless["folder"])
    assert obj["text"] == tokenizer.decode(obj["token_ids"], skip_special_tokens=True)
    assert "Traceback" not in err
    # the same types as a finished run's object (test_cli.py::test_json_format_contract): k is a number
    assert obj["stats"]["k"] == 2, obj["stats"]["k"]
    assert len(obj["stats"]["accept_length_histogram"]) == obj["stats"]["k"] + 1


def test_ctrl_c_during_bench_prints_finished_rows_and_writes_no_file(tmp_path, endless):
    prompts = prompts_file(tmp_path, 8)
    out_dir = tmp_path / "reports"
    out_dir.mkdir()
    report = out_dir / "bench.json"
    run = Spawned("bench", "-p", str(endless["profile"]), "--prompts", str(prompts), "--methods", "specdec",
                  "-n", "600", "--repeats", "1", "--warmup", "1", "-f", "json", "--output", str(report), progress=True)
    # the label of the run that completes the first prompt: on a loaded 2-core machine the plain run
    # before it has taken 90 s, so wait longer than the default
    run.wait_for("line-1 · specdec".encode(), timeout=300)
    code, out, err = run.interrupt()
    assert code == 130, err
    summary = json.loads(out)
    assert 1 <= summary["settings"]["prompts"] < 8 and summary["settings"]["prompts_planned"] == 8
    rows = {row["method"]: row for row in summary["results"]}
    assert rows["plain"]["tokens_per_second"] and rows["specdec"]["tokens_per_second"]
    assert f"interrupted: the {summary['settings']['prompts']} prompts that finished (no --output written)" in err
    assert "Traceback" not in err
    assert list(out_dir.iterdir()) == []  # neither the report nor a temp file beside it


def test_ctrl_c_during_tune_k_before_a_prompt_finished(tmp_path, endless):
    prompts = prompts_file(tmp_path, 8)
    profile = tmp_path / "endless.yaml"
    profile.write_text(endless["profile"].read_text())
    before = profile.read_text()
    out_dir = tmp_path / "reports"
    out_dir.mkdir()
    run = Spawned("tune-k", "-p", str(profile), "--prompts", str(prompts), "--ks", "2", "--no-auto", "-n", "600",
                  "--repeats", "1", "-f", "json", "--output", str(out_dir / "tune.json"), "--write", progress=True)
    run.wait_for(b"warming up")  # the progress bar is up: the first prompt is seconds away from done
    code, out, err = run.interrupt()
    assert code == 130, err
    assert out == b""
    assert "interrupted before any prompt finished: nothing to report" in err
    assert "Traceback" not in err
    assert list(out_dir.iterdir()) == []
    assert profile.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["endless.yaml", "prompts.txt", "reports"]


# --------------------------------------------------------------------------- in-process, Ctrl-C at chosen points


def interrupt_on_call(monkeypatch, number: int) -> list:
    """Make the `number`-th engine run (warm-up included) raise KeyboardInterrupt, as Ctrl-C would."""
    from specdec_cli.bench.engine_methods import EngineMethod

    calls, real = [], EngineMethod.run

    def run(self, *args, **kwargs):
        calls.append(self.name)
        if len(calls) == number:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(EngineMethod, "run", run)
    return calls


COMMANDS = {
    "bench": ["bench", "--methods", "specdec"],
    "tune-k": ["tune-k", "--ks", "2", "--no-auto", "--write"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("at_call, finished", [(1, 0), (5, 1), (7, 2)])
def test_ctrl_c_at_each_point_of_bench_and_tune_k(capsys, tmp_path, llama_pair, monkeypatch, command, at_call, finished):
    """Two methods, three prompts, no warm-up: calls 1 and 2 are the untimed first runs, call 3 the first
    prompt's first run, call 5 the second prompt's first (the first prompt is complete), call 7 the third's."""
    profile = model_profile(tmp_path, llama_pair)
    before = profile.read_text()
    interrupt_on_call(monkeypatch, at_call)
    out_dir = tmp_path / "reports"
    code, out, err = run_cli(capsys, *COMMANDS[command], "-p", str(profile), "--prompts", str(prompts_file(tmp_path, 3)),
                             "-n", "6", "--repeats", "1", "--warmup", "0", "-f", "json", "--output", str(out_dir / "r.json"))
    assert code == 130, err
    assert "Traceback" not in err
    if finished == 0:
        assert out == "" and "interrupted before any prompt finished: nothing to report" in err
    else:
        summary = json.loads(out)
        assert summary["settings"]["prompts"] == finished
        assert f"interrupted: the {finished} prompts that finished" in err
    assert not out_dir.exists() or list(out_dir.iterdir()) == []
    assert profile.read_text() == before  # tune-k --write writes nothing when interrupted


@pytest.mark.parametrize("command", list(COMMANDS))
def test_ctrl_c_while_the_methods_are_being_set_up(capsys, tmp_path, llama_pair, monkeypatch, command):
    """Ctrl-C after loading but before the first run (decoders being built): still exit 130, a message."""
    import specdec_cli.bench.local as bench_module
    import specdec_cli.bench.tune as tune_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_module, "EngineMethod", interrupted)
    monkeypatch.setattr(tune_module, "EngineMethod", interrupted)
    profile = model_profile(tmp_path, llama_pair)
    code, out, err = run_cli(capsys, *COMMANDS[command], "-p", str(profile), "--prompts", str(prompts_file(tmp_path, 2)),
                             "-n", "4", "--repeats", "1", "--warmup", "0", "-f", "json")
    assert code == 130, err
    assert "interrupt" in err and "Traceback" not in err


def test_ctrl_c_while_the_report_is_being_written(capsys, tmp_path, llama_pair, monkeypatch):
    """The run finished and the --output file is being written when Ctrl-C comes: no file, no temp."""
    profile = model_profile(tmp_path, llama_pair)
    out_dir = tmp_path / "reports"

    def interrupted_fsync(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted_fsync)
    code, out, err = run_cli(capsys, "bench", "-p", str(profile), "--prompts", str(prompts_file(tmp_path, 1)),
                             "--methods", "specdec", "-n", "4", "--repeats", "1", "--warmup", "0", "-f", "json",
                             "--output", str(out_dir / "bench.json"))
    assert code == 130, err
    assert list(out_dir.iterdir()) == []


# --------------------------------------------------------------------------- --write: atomic, comment-keeping


PROFILE_TEXT = """\
# my own profile: comments and key order must survive --write
name: mine   # shown in reports
target:
  model: {target}
  dtype: float32   # fp32 on the CPU
drafter: {{kind: model, model: {draft}}}
device: cpu
k: 4   # tuned by specdec tune-k
adaptive: {{k_max: 6, threshold: 0.4}}   # k: 9 in a comment is not the key
max_new_tokens: 24
compile: off
# the end
"""


def own_profile(folder: Path, pair) -> Path:
    path = folder / "mine.yaml"
    path.write_text(PROFILE_TEXT.format(target=pair["target"], draft=pair["draft"]))
    return path


def stranger_pair(llama_pair) -> dict[str, Path]:
    """The target drafted by an unrelated model, which ModelClock tells apart by its depth."""
    return {"target": llama_pair["target"], "draft": llama_pair["stranger"]}


def test_tune_k_write_keeps_comments_and_key_order(capsys, tmp_path, llama_pair, monkeypatch):
    """The other comments and the key order stay; the comment on the old k goes, a true one comes."""
    ModelClock(timed=6).install(monkeypatch)  # k=1 beats k=3 in every repeat: a winner outside the noise
    profile = own_profile(tmp_path, stranger_pair(llama_pair))
    before = profile.read_text()
    code, out, err = run_cli(capsys, "tune-k", "-p", str(profile), "--prompts", str(prompts_file(tmp_path, 1)),
                             "--ks", "1,3", "--no-auto", "-n", "6", "--repeats", "3", "--warmup", "0", "-f", "json", "--write")
    assert code == 0, err
    best = json.loads(out)["recommended_k"]
    assert best == 1
    after = profile.read_text()
    k_lines = [i for i, line in enumerate(after.splitlines()) if line.startswith("k:")]
    assert k_lines == [i for i, line in enumerate(before.splitlines()) if line.startswith("k:")]
    assert [line for line in after.splitlines() if not line.startswith("k:")] == \
        [line for line in before.splitlines() if not line.startswith("k:")]
    assert re.fullmatch(r"k: 1   # specdec tune-k --write, \S+: \d+\.\d\dx plain over 1 prompt x 3 repeats",
                        after.splitlines()[k_lines[0]])
    assert load_profile(profile).k == best
    assert f"set k: {best} in {profile}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml", "prompts.txt"]


@pytest.mark.parametrize("text, k, expected", [
    ("k: 4   # c\nname: x\n", 7, "k: 7\nname: x\n"),  # the comment on the old value goes
    ("name: x\n# k: 4 was fastest\nk: 4\n", 2, "name: x\nk: 2\n"),
    ("name: x\nk:4\n", 2, "name: x\nk: 2\n"),
    ("name: x\nk: auto\n", 3, "name: x\nk: 3\n"),
    ("name: x\nk: 3\n", "auto", "name: x\nk: auto\n"),
    ("name: x  # no k yet\n", 5, "name: x  # no k yet\nk: 5\n"),
    ("name: x", 5, "name: x\nk: 5\n"),
    ("adaptive:\n  k_max: 8\ndescription: |\n  k: 9 is not a key here\nk: 1\n", 6,
     "adaptive:\n  k_max: 8\ndescription: |\n  k: 9 is not a key here\nk: 6\n"),
])
def test_with_k_edits_only_the_top_level_k(text, k, expected):
    assert with_k(text, k) == expected


def test_write_best_k_with_a_quoted_k_key_leaves_one_k(tmp_path, llama_pair):
    """`"k": 4` is the same key as `k: 4`: after --write the file must not hold two of them."""
    profile = own_profile(tmp_path, llama_pair)
    profile.write_text(profile.read_text().replace("k: 4", '"k": 4'))
    write_best_k(profile, 2)
    top_level_k = [line for line in profile.read_text().splitlines() if re.match(r"""^["']?k["']?\s*:""", line)]
    assert len(top_level_k) == 1, profile.read_text()
    assert load_profile(profile).k == 2


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != "mine.yaml")


def test_failed_rename_leaves_the_profile_and_no_temp_file(tmp_path, llama_pair, monkeypatch):
    profile = own_profile(tmp_path, llama_pair)
    before = profile.read_bytes()

    def no_rename(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(OSError):
        write_best_k(profile, 2)
    assert profile.read_bytes() == before
    assert leftovers(tmp_path) == []


class HalfWriter(io.TextIOWrapper):
    """A stream that writes half of what it is given, then dies as a killed process would."""

    def write(self, text):
        super().write(text[: len(text) // 2])
        super().flush()
        raise KeyboardInterrupt


def test_crash_in_the_middle_of_the_write_leaves_the_profile_and_no_temp_file(tmp_path, llama_pair, monkeypatch):
    import specdec_cli.files as files

    profile = own_profile(tmp_path, llama_pair)
    before = profile.read_bytes()
    def half_open(path, mode="r", encoding=None):
        return HalfWriter(io.FileIO(path, "w"), encoding=encoding)

    monkeypatch.setattr(files, "open", half_open, raising=False)  # found before the builtin
    with pytest.raises(KeyboardInterrupt):
        write_best_k(profile, 2)
    assert profile.read_bytes() == before
    assert leftovers(tmp_path) == []


def test_tune_k_write_that_fails_is_one_line_and_changes_nothing(capsys, tmp_path, llama_pair, monkeypatch):
    ModelClock(timed=4).install(monkeypatch)
    profile = own_profile(tmp_path, stranger_pair(llama_pair))
    before = profile.read_bytes()
    prompts = prompts_file(tmp_path, 1)

    def no_rename(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_rename)
    code, out, err = run_cli(capsys, "tune-k", "-p", str(profile), "--prompts", str(prompts), "--ks", "1",
                             "--no-auto", "-n", "4", "--repeats", "1", "--warmup", "0", "-f", "json", "--write", "--force")
    assert code == 1
    assert json.loads(out)["best_k"] == 1  # the report was printed before the write was tried
    assert_one_line_error(err, "No space left on device")
    assert profile.read_bytes() == before
    assert leftovers(tmp_path) == ["prompts.txt"]


KILL_MID_WRITE = """
import os, sys, time
def stall(fd):  # the temp file is written, not yet renamed: the moment a SIGKILL hurts most
    print("writing", flush=True)
    time.sleep(120)
os.fsync = stall
from specdec_cli.bench.tune import write_best_k
write_best_k(sys.argv[1], 7)
"""


def test_sigkill_mid_write_leaves_the_profile_intact(tmp_path, llama_pair):
    profile = own_profile(tmp_path, llama_pair)
    before = profile.read_bytes()
    proc = subprocess.Popen([sys.executable, "-c", KILL_MID_WRITE, str(profile)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint)
    try:
        line = proc.stdout.readline()
        assert line == b"writing\n", proc.stderr.read()
    finally:
        proc.kill()
        proc.wait(30)
    assert profile.read_bytes() == before
    assert load_profile(profile).k == 4
    # SIGKILL leaves no chance to clean up: at most the hidden temp file, which no profile lookup sees
    for name in leftovers(tmp_path):
        assert re.fullmatch(r"\.mine\.yaml\..+\.tmp", name), name


@pytest.mark.parametrize("via", ["package link", "real folder"])
def test_write_to_a_shipped_profile_copies_it_to_the_config_dir(via):
    name = "qwen2.5-coder-1.5b.yaml"
    shipped = shipped_profiles_dir() / name if via == "package link" else REPO / "profiles" / name
    before = shipped.read_bytes()
    shipped_listing = sorted(p.name for p in shipped.parent.iterdir())
    try:
        written = write_best_k(shipped, 3)
        assert written == user_profiles_dir() / name
        assert shipped.read_bytes() == before
        provenance, rest = written.read_text().split("\n", 1)
        assert provenance.startswith(f"# A copy of the shipped profile {name}, edited by specdec tune-k --write")
        assert rest == with_k(before.decode(), 3)  # the other comments and the order as shipped
        resolved = load_profile("qwen2.5-coder-1.5b")  # by name: the user's copy wins
        assert resolved.k == 3 and resolved.source == written
        again = write_best_k(shipped, 6)  # a second write edits the copy, not the shipped file
        assert again == written and load_profile("qwen2.5-coder-1.5b").k == 6
        assert shipped.read_bytes() == before
        assert sorted(p.name for p in shipped.parent.iterdir()) == shipped_listing
    finally:
        if shipped.read_bytes() != before:  # never leave a shipped profile edited
            shipped.write_bytes(before)


def test_ctrl_c_during_train_draft_keeps_the_checkpoint_and_resume_finishes(tmp_path, llama_pair):
    """A real SIGINT mid-training: exit 130, a loadable checkpoint and the way on; --resume ends it."""
    import json

    import torch

    profile = tmp_path / "p.yaml"
    profile.write_text(
        f"target: {{model: {llama_pair['target']}, dtype: float32}}\n"
        "drafter: {kind: ngram}\ndevice: cpu\nchat: false\ncompile: off\n"
    )
    data = tmp_path / "texts.txt"
    data.write_text("\n".join(f"def add{i}(a, b):\n    return a + b * {i}" for i in range(12)) + "\n")
    out = tmp_path / "head"
    args = ("train-draft", "-p", str(profile), "--kind", "medusa", "--data", str(data), "--texts",
            "--out", str(out), "--epochs", "20", "--batch", "8", "--save-every", "2", "--heads", "2")
    run = Spawned(*args)
    deadline = time.monotonic() + 600  # a failsafe only: a loaded machine may take minutes to get here
    while not (out / "training_state.pt").exists():
        assert run.proc.poll() is None and time.monotonic() < deadline, bytes(run.err[-2000:])
        time.sleep(0.05)
    code, _, err = run.interrupt()
    assert code == 130, err
    assert "keeps the last checkpoint" in err and "--resume" in err and "Traceback" not in err
    state = torch.load(out / "training_state.pt", weights_only=True)
    # the first checkpoint can come mid-epoch (every --save-every steps): progress is counted in steps
    assert 0 < state["progress"]["steps"] and state["progress"]["epoch"] < 20
    assert json.loads((out / "config.json").read_text())["medusa_num_heads"] == 2

    resumed = subprocess.run([sys.executable, "-m", "specdec_cli", *args, "--resume"], cwd=REPO,
                             capture_output=True, text=True, timeout=1800)  # a failsafe, as above
    assert resumed.returncode == 0, resumed.stderr
    done = torch.load(out / "training_state.pt", weights_only=True)
    assert done["progress"]["epoch"] == 20
    assert len(json.loads((out / "config.json").read_text())["specdec"]["training"]["epoch_losses"]) == 20
