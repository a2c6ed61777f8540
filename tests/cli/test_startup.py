"""What costs no start-up: `specdec --help`, `profiles`, `cache`, `--version` and every usage error answer
without importing torch or transformers (seen in `python -X importtime`'s list of the modules a
process imported, never by the clock)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from profile_helpers import model_profile

HEAVY = ("torch", "transformers")


def imported_modules(*args: str, stdin: str = "") -> tuple[subprocess.CompletedProcess, set[str]]:
    """`specdec ARGS` in its own process, and the top-level modules it imported."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "specdec_cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "SPECDEC_DEBUG": "0"})
    modules = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return done, modules


@pytest.mark.parametrize("args", [
    ("--help",),
    ("--version",),
    ("generate", "--help"),
    ("bench", "--help"),
    ("serve", "--help"),
    ("profiles",),
    ("profiles", "show", "smollm2-demo"),
    ("cache",),
])
def test_help_and_profiles_import_no_torch(args):
    done, modules = imported_modules(*args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()
    assert modules & set(HEAVY) == set()
    assert "typer" in modules  # the list is the real one: the command line's own imports are in it


@pytest.mark.parametrize("args,fragment", [
    (("generate", "-n", "0", "hi"), "--max-new-tokens"),
    (("generate", "hi", "--batch-size", "2"), "--batch-size goes with --prompts"),
    (("generate", "hi", "-p", "no-such-profile"), "no profile named 'no-such-profile'"),
    (("generate", "hi", "--stop", ""), "--stop"),
    (("bench", "--methods", "fast"), "--methods: 'fast'"),
    (("bench", "--batch-sizes", "1,2", "--methods", "hf-plain"), "hf-plain cannot go with --batch-sizes"),
    (("tune-k", "--ks", "x"), "--ks: 'x'"),
    (("tune-k", "--force"), "--force goes with --write"),
    (("verify", "--samples", "-1"), "--samples"),
    (("verify", "--prompts", "/no/such/file.jsonl"), "/no/such/file.jsonl"),
    (("serve", "--batch-size", "0"), "--batch-size"),
    (("serve", "--port", "70000"), "--port"),
    (("serve", "--api-key", " "), "--api-key"),
    (("serve", "-p", "no-such-profile"), "no-such-profile"),
])
def test_usage_errors_import_no_torch(args, fragment):
    done, modules = imported_modules(*args)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert len(errors) == 1 and errors[0].startswith("specdec: error:") and fragment in errors[0], errors
    assert modules & set(HEAVY) == set()


def test_a_run_does_import_torch(tmp_path, llama_pair):
    """The check can fail: a command that loads a model imports both."""
    done, modules = imported_modules("generate", "def f():", "-p", str(model_profile(tmp_path, llama_pair)),
                                     "-n", "2", "-f", "text", "--no-chat")
    assert done.returncode == 0, done.stderr[-2000:]
    assert set(HEAVY) <= modules


def test_verbose_says_where_the_seconds_went(tmp_path, llama_pair):
    """-v ends with one line that splits the run's wall into its parts, from the imports to the
    decode; the parts (with what none covers) add up to the wall said."""
    done = subprocess.run(
        [sys.executable, "-m", "specdec_cli", "generate", "def f():", "-p", str(model_profile(tmp_path, llama_pair)),
         "-n", "4", "-f", "text", "--no-chat", "-v"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if " s went: " in line]
    assert len(lines) == 1, done.stderr
    head, _, rest = lines[0].partition(" s went: ")
    wall = float(head.rsplit(" ", 1)[1])
    parts = dict(item.rsplit(" ", 2)[:2] for item in rest.split(" · "))
    assert {"imports", "tokenizer", "target weights", "draft weights", "compile", "prefill", "decode"} <= set(parts), parts
    assert abs(sum(float(seconds) for seconds in parts.values()) - wall) < 0.05 + 0.005 * len(parts)
