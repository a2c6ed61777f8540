"""`specdec generate --prompts FILE`: every prompt of a file through one load, one JSONL row each,
in input order, written and flushed as soon as it and every row before it are done.

A prompt that cannot run (empty, too long for the context) is an error row and the run goes on;
the exit code is then 1, as xargs and GNU parallel exit non-zero when a job failed: `set -e` and
`&&` notice, and every other row is written all the same. Ctrl-C: exit 130, each finished row
written whole (the prompts in progress are left out), and how far it got said on stderr. A progress
bar on stderr only when stderr is a terminal.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..api import Generation, Pipeline
from ..constraints.grammars import from_mapping
from ..decoding.stats import DecodeStats
from ..errors import EXIT_FAILURE, EXIT_OK, Interrupted, UsageError
from ..files import interrupts_deferred
from ..prompt_files import PromptRow, read_prompt_file
from ..prompt_runs import PromptError, parse_batch_size, resolve_batch_size
from ..specs import ConstraintSpec
from .output import Output, same_file

PROFILE = "profile"  # a row without a constraint of its own: the command's, else the profile's

log = logging.getLogger("specdec")


def read_rows(prompts: Path, *, prompt: str | None, prompt_file: Path | None, samples: int, fmt: str | None,
              batch_size: str | None) -> tuple[list[PromptRow], int, list[ConstraintSpec | str]]:
    """Every check --prompts makes before the models load: the file's rows, the batch size, and each
    row's constraint (its own, checked here, else "profile": the command's or the profile's)."""
    check_usage(prompt, prompt_file, samples, fmt)
    size = resolve_batch_size(parse_batch_size(batch_size or "1"))
    rows = read_prompt_file(prompts, "--prompts", keep_empty=True)
    where = "stdin" if str(prompts) == "-" else str(prompts)
    base = None if str(prompts) == "-" else prompts.parent
    constraints = [PROFILE if row.constraint is None else from_mapping(row.constraint, f"{where}:{row.line}", base)
                   for row in rows]
    return rows, size, constraints


def check_usage(prompt: str | None, prompt_file: Path | None, samples: int, fmt: str | None) -> None:
    """What --prompts cannot go with, said before anything is read or loaded."""
    if prompt is not None:
        raise UsageError("--prompts reads every prompt from its file: give no PROMPT argument")
    if prompt_file is not None:
        raise UsageError("--prompts and --prompt-file: give one of them")
    if samples > 1:
        raise UsageError("--samples goes with one prompt: --prompts runs each prompt once")
    if fmt not in (None, "jsonl"):
        raise UsageError(f"--prompts writes one JSON object a prompt: use --format jsonl, not {fmt}")


def row_object(pipeline: Pipeline, row: PromptRow, index: int, result: Generation | PromptError) -> dict[str, Any]:
    if isinstance(result, PromptError):
        return {"id": row.row_id, **result.to_dict()}
    return {"id": row.row_id, "index": index, **result.to_dict(pipeline.profile.name)}


@dataclass
class Tally:
    """The run so far, for the progress bar and the closing count."""

    total: int
    done: int = 0
    failed: int = 0
    incomplete: int = 0  # rows cut short inside their constraint
    stats: DecodeStats = field(default_factory=lambda: DecodeStats(k=0, k_limit=0))  # every row's steps
    started: float = field(default_factory=time.monotonic)

    def add(self, result: Generation | PromptError) -> None:
        self.done += 1
        if isinstance(result, PromptError):
            self.failed += 1
        else:
            self.stats.steps.extend(result.stats.steps)
            self.incomplete += result.stats.constraint_complete is False

    def describe(self) -> str:
        elapsed = time.monotonic() - self.started
        rate = self.stats.new_tokens / elapsed if elapsed > 0 else 0.0
        acceptance = self.stats.acceptance_rate
        shown = "-" if acceptance is None else f"{acceptance:.0%}"
        return f"{rate:.1f} tok/s  acceptance {shown}"


@contextmanager
def progress_bar(out: Output, tally: Tally) -> Iterator[Callable[[], None]]:
    """A bar of prompts done on stderr when it is a terminal (it stays, as the run's summary);
    elsewhere nothing. Rows reach stdout directly: Rich's stdout redirection would send them to
    stderr's console (into the terminal, not into `> answers.jsonl`)."""
    if not out.info.is_terminal:
        yield lambda: None
        return
    columns = (TextColumn("prompts"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[speed]}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=out.info, redirect_stdout=False, redirect_stderr=False) as progress:
        task = progress.add_task("prompts", total=tally.total, speed=tally.describe())
        yield lambda: progress.update(task, completed=tally.done, speed=tally.describe())


def row_writer(out: Output) -> Callable[[dict[str, Any]], None]:
    """Rows to stdout; where stdout is the bar's own terminal, through the bar's console, so that
    each row scrolls above the bar instead of into it."""
    if out.info.is_terminal and same_file(sys.stdout, sys.stderr):
        return lambda obj: out.info.print(json.dumps(obj, ensure_ascii=False), markup=False, highlight=False,
                                          emoji=False, soft_wrap=True)
    return out.json_line


def run_prompts(pipeline: Pipeline, rows: list[PromptRow], out: Output, *, seed: int | None,
                stops: tuple[str, ...], batch_size: int | str, constraints: list[ConstraintSpec | str]) -> int:
    results = pipeline.generate_many([row.text for row in rows], batch_size=batch_size, seed=seed, stop=stops,
                                     constraint=constraints)
    tally = Tally(len(rows))
    write = row_writer(out)
    try:
        with progress_bar(out, tally) as advance:
            for index, (row, result) in enumerate(zip(rows, results)):
                with interrupts_deferred():  # a row is written whole and counted, or neither
                    write(row_object(pipeline, row, index, result))
                    tally.add(result)
                advance()
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted after {tally.done} of {tally.total} prompts") from None
    if tally.incomplete:
        log.warning("%d of %d texts stopped before their constraint was complete (stats.constraint.complete: "
                    "false; finish_reason says why: length, raise --max-new-tokens)", tally.incomplete, tally.total)
    if tally.failed:
        log.warning("%d of %d prompts could not run: their rows carry \"error\"", tally.failed, tally.total)
        return EXIT_FAILURE
    return EXIT_OK
