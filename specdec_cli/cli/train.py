"""`specdec train-draft`: training.api.train_draft with progress bars, then the held-out
acceptance per draft depth. Ctrl-C keeps the last checkpoint (exit 130); --resume continues."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from ..errors import EXIT_INTERRUPTED, EXIT_OK
from ..training.api import Phase, ShowProgress, TrainRequest, train_draft
from .output import Output


def bar(out: Output, *fields: str) -> Progress:
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    columns += [TextColumn(f"{{task.fields[{name}]}}") for name in fields]
    return Progress(*columns, TimeElapsedColumn(), TimeRemainingColumn(), console=out.info, transient=True)


def bars(out: Output) -> ShowProgress:
    """training.api's progress, shown as one transient bar per phase."""

    @contextlib.contextmanager
    def show(phase: Phase) -> Iterator[Callable[..., None]]:
        with bar(out, *phase.fields) as progress:
            task = progress.add_task(phase.description, total=phase.total, completed=phase.completed,
                                     **{name: "" for name in phase.fields})
            yield lambda units=1, **fields: progress.update(task, advance=units, **fields)

    return show


def acceptance_table(untrained: dict[str, Any], trained: dict[str, Any]) -> Table:
    table = Table(title="held-out acceptance per draft depth (greedy chain)", title_justify="left")
    table.add_column("depth", justify="right")
    table.add_column("untrained", justify="right")
    table.add_column("trained", justify="right")
    for depth, (before, after) in enumerate(zip(untrained["per_depth"], trained["per_depth"]), 1):
        table.add_row(str(depth), f"{before:.1%}", f"{after:.1%}")
    table.add_row("tokens/pass", f"{untrained['tokens_per_pass']}", f"{trained['tokens_per_pass']}")
    return table


def run_train_command(pipeline, out: Output, request: TrainRequest) -> int:
    result = train_draft(pipeline, request, bars(out))
    folder = result.folder
    if result.interrupted:
        out.message(
            f"interrupted: {folder} keeps the last checkpoint; run the same command with --resume to continue"
            if result.saved else "interrupted before the first checkpoint: nothing was written"
        )
        return EXIT_INTERRUPTED
    out.info.print(acceptance_table(result.untrained, result.trained))
    losses = ", ".join(f"{x:.3f}" for x in result.losses)
    out.message(f"loss per epoch: {losses}")
    out.message(f"on training prompts: {result.trained_seen['tokens_per_pass']} tokens per target pass "
                f"(untrained {result.untrained_seen['tokens_per_pass']})")
    key = "heads" if result.kind == "medusa" else "head"
    out.message(f"wrote {folder}; use it with  drafter: {{kind: {result.kind}, {key}: {folder}}}")
    state = result.state_file
    if state.is_file():  # not part of the head: only training reads it
        out.message(f"{state} ({state.stat().st_size / 2**20:.0f} MB) is the training checkpoint that --resume "
                    "continues from; drafting does not need it, delete it if you will not train further")
    return EXIT_OK
