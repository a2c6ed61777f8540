"""Driving the CLI in-process, and the one-line-error contract every bad input must meet."""

from __future__ import annotations

import io
import signal
import sys

import pytest

from specdec_cli.cli.app import main


def run_cli(capsys, *args: str, stdin: bytes | None = None, monkeypatch=None) -> tuple[int, str, str]:
    """`specdec ARGS` in this process: (exit code, stdout, stderr)."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    try:
        code = main(list(args))
    except KeyboardInterrupt:  # would otherwise stop the whole pytest run
        pytest.fail("KeyboardInterrupt escaped specdec_cli.cli.app.main")
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(err: str, *fragments: str) -> None:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("specdec: error:"), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def default_sigint() -> None:
    """preexec_fn for spawned CLIs: Ctrl-C's default handler, even when this suite was started with
    SIGINT ignored (`nohup ... &`), which children would otherwise inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
