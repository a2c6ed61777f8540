"""`specdec generate` in a real pseudo-terminal, read back through a terminal emulator (pyte).

What a person sees: the live view shows the whole answer, word-wrapped; an answer taller than
the terminal scrolls into the terminal's history as it streams; the screen a live run leaves equals
the --no-live output; and the process exits 0 every time (no abort at interpreter exit).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pexpect
import pyte
import pytest

from cli_helpers import default_sigint
from profile_helpers import write_profile
from specdec_cli.cli.view import printable

REPO = Path(__file__).resolve().parents[2]
COLUMNS, ROWS = 40, 6


def run_in_terminal(*args: str, columns: int = COLUMNS, rows: int = ROWS) -> tuple[int, list[str]]:
    """(exit code, every line the terminal shows or scrolled into its history, trailing blanks cut)."""
    screen = pyte.HistoryScreen(columns, rows, history=10_000)
    stream = pyte.ByteStream(screen)
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(columns), "LINES": str(rows)}
    env.pop("NO_COLOR", None)
    child = pexpect.spawn(sys.executable, ["-m", "specdec_cli", *args], cwd=str(REPO), env=env,
                          dimensions=(rows, columns), timeout=180, preexec_fn=default_sigint)
    while True:
        try:
            stream.feed(child.read_nonblocking(65536, timeout=180))
        except pexpect.EOF:
            break
    child.close()
    history = [render_history_line(line, columns) for line in screen.history.top]
    lines = [line.rstrip() for line in history + screen.display]
    while lines and not lines[-1]:
        lines.pop()
    return child.exitstatus if child.exitstatus is not None else 128 + child.signalstatus, lines


def render_history_line(line, columns: int) -> str:
    return "".join(line[x].data for x in range(columns))


def answer_lines(lines: list[str]) -> list[str]:
    """The answer: everything above the status line (which starts with 'k=')."""
    end = next(i for i, line in enumerate(lines) if line.startswith("k="))
    return lines[:end]


@pytest.fixture(scope="module")
def long_profile(tmp_path_factory, tokenizer) -> Path:
    """A model that never stops by itself (see tiny_models): 240 greedy tokens, taller than the screen;
    greedy, so the live and --no-live runs write the same tokens."""
    from tiny_models import build_endless_model

    root = tmp_path_factory.mktemp("long")
    folder = build_endless_model(tokenizer, root / "model")
    return write_profile(root, target={"model": str(folder), "dtype": "float32"}, drafter={"kind": "ngram"},
                         max_new_tokens=240, k=3)


def test_live_view_shows_the_whole_answer_and_ends_as_no_live(long_profile):
    prompt = "The quick brown fox"
    code, live = run_in_terminal("generate", prompt, "-p", str(long_profile), "--no-chat")
    assert code == 0, live
    code, still = run_in_terminal("generate", prompt, "-p", str(long_profile), "--no-chat", "--no-live")
    assert code == 0, still
    shown = answer_lines(live)
    assert len(shown) > ROWS, "the answer must be taller than the terminal for this test to mean anything"
    assert shown == answer_lines(still)
    # nothing cut: the wrapped lines hold every character of the profile's greedy text
    from specdec_cli import Pipeline

    text = Pipeline.from_profile(str(long_profile)).generate(prompt, chat=False).text
    assert "".join("".join(shown).split()) == "".join(printable(text).split())


def test_short_answer_in_a_wide_terminal_is_not_cut_at_the_edge(llama_profile):
    code, lines = run_in_terminal("generate", "The quick brown fox", "-p", str(llama_profile), "--no-chat",
                                  "-n", "40", columns=30, rows=40)
    assert code == 0, lines
    shown = answer_lines(lines)
    assert len(shown) > 1  # wrapped, where the old view cut the line at the terminal's edge


def test_terminal_runs_exit_0_every_time(llama_profile):
    """The abort at exit (`terminate called without an active exception`, 134) came from a thread
    still running at interpreter exit; run the terminal path repeatedly and demand a clean exit."""
    for _ in range(2):
        code, lines = run_in_terminal("generate", "def add(a, b):", "-p", str(llama_profile), "--no-chat",
                                      "--show-rejected", "-n", "12")
        text = "\n".join(lines)
        assert code == 0 and "terminate called" not in text and "Traceback" not in text, text
