"""One output object: data to stdout, everything else (logs, progress, summaries) to stderr; and
the log's format on a terminal."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any, Callable

from rich.console import Console


class Output:
    def __init__(self) -> None:
        if (sys.stdout.encoding or "").lower().replace("-", "") != "utf8" and hasattr(sys.stdout, "reconfigure"):
            # a non-UTF-8 terminal or PYTHONIOENCODING: show what it can, rather than fail on a character
            sys.stdout.reconfigure(errors="replace")
        # a terminal gets word-wrapped text (the live view redraws it); a pipe gets lines as they are
        self.data = Console(soft_wrap=not sys.stdout.isatty(), highlight=False)
        self.info = Console(stderr=True, highlight=False, soft_wrap=not sys.stderr.isatty())
        LOG_HANDLER.console = self.info  # log lines print above a live spinner or view, not into it
        LOG_HANDLER.before_line = self.close_shared_line
        self.line_open = False  # stdout's last line has no newline yet (a streamed answer)
        self.closed_early = False  # close_shared_line ended it

    @property
    def stdout_is_tty(self) -> bool:
        return sys.stdout.isatty()

    def write(self, text: str) -> None:
        """Raw data to stdout (no markup, no wrapping), flushed so pipes see it at once."""
        sys.stdout.write(text)
        sys.stdout.flush()
        if text:
            self.line_open, self.closed_early = not text.endswith("\n"), False

    def end_line(self) -> None:
        """End the streamed answer's line (once, whoever ends it)."""
        if not self.closed_early:
            self.write("\n")
        self.closed_early = False

    def close_shared_line(self) -> None:
        """Before a message on stderr: when stdout and stderr are one file (`2>&1`), end an answer's
        open line, so the message gets a line of its own."""
        if self.line_open and same_file(sys.stdout, sys.stderr):
            self.write("\n")
            self.closed_early = True

    def json_line(self, obj: Any) -> None:
        self.write(json.dumps(obj, ensure_ascii=False) + "\n")

    def json_document(self, obj: Any) -> None:
        self.write(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")

    def listing(self, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
        """Rows for a person (a table whose long paths and hub ids wrap, never cut) or, piped, for
        a script: one tab-separated line a row, no header."""
        if not self.stdout_is_tty:
            for row in rows:
                self.write("\t".join(row) + "\n")
            return
        from rich.table import Table

        table = Table(show_edge=False)
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*row)
        self.data.print(table)

    def message(self, text: str, style: str | None = None) -> None:
        self.info.print(text, style=style, markup=False, highlight=False)


def same_file(a, b) -> bool:
    try:
        return os.path.samestat(os.fstat(a.fileno()), os.fstat(b.fileno()))
    except (OSError, ValueError, AttributeError):  # a stream with no file behind it (a test's capture)
        return False


class ConsoleLogHandler(logging.Handler):
    """Writes log records through the command's stderr Console once there is one, so that Rich
    keeps them apart from its spinner, progress bar or live view; plain stderr before that."""

    def __init__(self) -> None:
        super().__init__()
        self.console: Console | None = None
        self.before_line: Callable[[], None] | None = None  # the command's Output.close_shared_line

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            if self.before_line is not None:
                self.before_line()
            if self.console is None:
                sys.stderr.write(text + "\n")
            else:
                self.console.print(text, markup=False, highlight=False, emoji=False)
        except Exception:
            self.handleError(record)


LOG_HANDLER = ConsoleLogHandler()
class LevelFormatter(logging.Formatter):
    """'specdec: message' for information, 'specdec: warning: message' for what needs attention."""

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno <= logging.INFO else f"{record.levelname.lower()}: "
        return f"specdec: {level}{record.getMessage()}"


LOG_HANDLER.setFormatter(LevelFormatter())


# import-time warnings of torchao (its CUDA and other-Python-version extensions failing to load on
# a CPU host, harmless) and of torch's pytree (an Enum torchao registers): shown with -vv only
QUIET_LOGGERS = ("torchao", "torch.utils._pytree")


def configure_logging(verbose: int) -> None:
    """specdec's own messages at warning (info with -v) on stderr; the libraries' chatter quieter."""
    LOG_HANDLER.console = LOG_HANDLER.before_line = None  # until this command's Output exists
    logger = logging.getLogger("specdec")
    logger.handlers[:] = [LOG_HANDLER]
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logging.getLogger("specdec.notice").setLevel(logging.INFO)  # one-time notices (a conversion) always show
    logger.propagate = False
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING if verbose > 1 else logging.ERROR)
    level = "warning" if verbose > 1 else "error"
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is None:  # transformers reads these when it loads: importing it now would cost torch's import
        os.environ["TRANSFORMERS_VERBOSITY"] = level
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    else:
        hf_logging.set_verbosity(hf_logging.log_levels[level])
        hf_logging.disable_progress_bar()
