"""`specdec bench` and `specdec tune-k` (each also --batch-sizes), their options already checked
(bench_options.py): the run, with progress on stderr, its report, and files written atomically.

Ctrl-C keeps what finished: the rows of every prompt all methods completed are printed, no
--output file is written (so none is ever half-written), and the exit code is 130.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..api import Pipeline
from ..bench.batched import BatchBench, plot_batches, run_batches
from ..bench.local import Bench, make_bench
from ..bench.options import BenchSettings
from ..bench.tune import (
    TuneResult,
    plot_tune,
    row_label,
    run_tune,
    sweep_size,
    tree_setting,
    write_best_k,
    write_k_table,
)
from ..bench.workload import BenchPrompt
from ..errors import EXIT_INTERRUPTED, EXIT_OK, SpecdecError
from ..files import write_atomically
from ..specs import TreeSpec
from .output import Output
from .tables import batch_table, bench_csv, bench_table, count, tune_csv, tune_table, verdict_text


@contextmanager
def progress_bar(out: Output, total: int) -> Iterator[Callable[[str], None]]:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=out.info, transient=True) as progress:
        task = progress.add_task("warming up", total=total)
        yield lambda label: progress.update(task, advance=1, description=label)


def emit_report(out: Output, summary: dict[str, Any], fmt: str, output: Path | None, render, as_csv=None) -> None:
    if fmt == "json":
        out.json_document(summary)
    elif fmt == "csv":
        out.write(as_csv(summary))
    else:
        out.data.print(render(summary))
    if output is not None:
        import json

        text = as_csv(summary) if fmt == "csv" else json.dumps(summary, indent=2, ensure_ascii=False) + "\n"
        write_atomically(output, text)
        out.message(f"wrote {output}")


def run_bench_command(pipeline: Pipeline, out: Output, *, prompts: list[BenchPrompt], methods: list[str],
                      hf_ks: list[int], settings: BenchSettings, fmt: str, output: Path | None,
                      drift: bool = True) -> int:
    bench: Bench = make_bench(pipeline, prompts, settings, methods, hf_ks)
    code = EXIT_OK
    try:
        with progress_bar(out, bench.total_runs) as advance:
            bench.run(advance)
        if drift and bench.drift_applies:
            out.message("comparing the quantized target's greedy text with the unquantized model's "
                        "(loads it once more; --no-drift skips this)")
            bench.measure_drift()
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    if code == EXIT_INTERRUPTED:
        if not bench.complete_prompts():
            out.message("interrupted before any prompt finished: nothing to report")
            return code
        out.message(f"interrupted: the {len(bench.complete_prompts())} prompts that finished (no --output written)")
    summary = bench.summary()
    emit_report(out, summary, fmt, None if code else output, bench_table, bench_csv)
    return code


class NotWritten(SpecdecError):
    """tune-k --write with no winner to write, or one within noise (exit 1: the run worked, its answer is 'unsure')."""


def written_note(summary: dict[str, Any], forced: bool) -> str:
    """The comment beside the written value: where it came from, so that it stays true."""
    import datetime

    row = next(r for r in summary["rows"] if r["k"] == summary["best_k"])
    s = summary["settings"]
    note = (f"specdec tune-k --write, {datetime.date.today().isoformat()}: {row['speedup']:.2f}x plain over "
            f"{count(s['prompts'], 'prompt')} x {count(s['repeats'], 'repeat')}")
    return note + (" (--force: within noise of the next)" if forced else "")


def write_winner(pipeline: Pipeline, out: Output, summary: dict[str, Any], trees: dict[str, TreeSpec], force: bool) -> None:
    """Put the recommended k (or tree) into the profile; refuse a winner within noise unless forced."""
    best = summary["best_k"]
    if best is None:
        raise NotWritten("--write: nothing written: no k has a figure that can be ranked (see the marks above)")
    forced = summary["recommended_k"] is None
    if forced and not force:
        reason = verdict_text(summary).removeprefix("no recommendation: ")
        raise NotWritten(f"--write: nothing written: {reason}; add --force to write {row_label(best)} anyway")
    note = written_note(summary, forced)
    if best in trees:
        path = write_best_k(pipeline.profile.source, pipeline.profile.k, tree=trees[best], note=note)
        out.message(f"set tree: {tree_setting(trees[best])} in {path}")
    else:
        path = write_best_k(pipeline.profile.source, best, note=note)
        out.message(f"set k: {best} in {path}")


def run_tune_command(pipeline: Pipeline, out: Output, *, prompts: list[BenchPrompt], ks: list[int], auto: bool,
                     settings: BenchSettings, fmt: str, output: Path | None, write: bool, plot: Path | None,
                     trees: dict[str, TreeSpec] | None = None, force: bool = False) -> int:
    holder: list[TuneResult] = []
    trees = trees or {}
    code = EXIT_OK
    try:
        with progress_bar(out, len(prompts) * settings.repeats * sweep_size(ks, auto, trees)) as advance:
            run_tune(pipeline, prompts, settings, ks, auto, advance, holder, trees)
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    result = holder[0] if holder else None  # empty: Ctrl-C came while the methods were being built
    if result is None or not result.bench.complete_prompts():
        out.message("interrupted before any prompt finished: nothing to report")
        return code
    summary = result.summary()
    if code:
        out.message(f"interrupted: the {len(result.bench.complete_prompts())} prompts that finished (nothing written)")
    emit_report(out, summary, fmt, None if code else output, tune_table, tune_csv)
    if not code and plot is not None:
        plot_tune(summary, plot)
        out.message(f"wrote {plot}")
    if not code and write:
        write_winner(pipeline, out, summary, trees, force)
    return code


def batch_ks(profile_k: int | str) -> list[int]:
    """bench --batch-sizes: the profile's k when it is a number; none under k: auto, which runs as
    itself (run_batches' `auto`)."""
    return [profile_k] if isinstance(profile_k, int) else []


def write_k_by_batch_size(pipeline: Pipeline, out: Output, summary: dict[str, Any], force: bool) -> None:
    """Put the best k per batch size into the profile; refuse one within noise at any batch size unless forced."""
    import datetime

    from ..bench.batched import k_table

    sizes = summary["batch_sizes"]
    unranked = [str(s["batch_size"]) for s in sizes if s["best_k"] is None]
    if unranked or not sizes:
        raise NotWritten(f"--write: nothing written: no k has a figure that can be ranked at batch size "
                         f"{', '.join(unranked) or '(none finished)'} (see the marks above)")
    unsure = [str(s["batch_size"]) for s in sizes if s["recommended_k"] is None]
    if unsure and not force:
        raise NotWritten(f"--write: nothing written: the best k is within noise of the next at batch size "
                         f"{', '.join(unsure)} (rerun with --repeats 3 or more); add --force to write the fastest anyway")
    table = k_table(sizes, recommended_only=not force)
    s = summary["settings"]
    note = (f"specdec tune-k --batch-sizes --write, {datetime.date.today().isoformat()}: over "
            f"{count(s['prompts'], 'prompt')} x {count(s['repeats'], 'repeat')}"
            + (f" (--force: within noise at batch size {', '.join(unsure)})" if unsure else ""))
    path = write_k_table(pipeline.profile.source, table, note=note)
    out.message("set k_by_batch_size: {" + ", ".join(f"{b}: {k}" for b, k in table.items()) + f"}} in {path}")


def run_batch_command(pipeline: Pipeline, out: Output, *, prompts: list[BenchPrompt], settings: BenchSettings,
                      batch_sizes: list[int], ks: list[int], fmt: str, output: Path | None, plot: Path | None,
                      write: bool = False, force: bool = False, auto: bool = False) -> int:
    """bench --batch-sizes and tune-k --batch-sizes: plain and each k at each batch size (`auto`:
    plain and the profile's k: auto)."""
    holder: list[BatchBench] = []
    code = EXIT_OK
    try:
        with progress_bar(out, len(batch_sizes) * settings.repeats * (1 + (1 if auto else len(ks)))) as advance:
            run_batches(pipeline, prompts, settings, batch_sizes, ks, advance, holder, auto)
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    bench = holder[0] if holder else None
    if bench is None or not bench.finished_sizes:
        out.message("interrupted before any batch size finished: nothing to report")
        return code
    if code:
        out.message(f"interrupted: the {count(len(bench.finished_sizes), 'batch size')} that finished (nothing written)")
    summary = bench.summary()
    emit_report(out, summary, fmt, None if code else output, batch_table)
    if not code and plot is not None:
        plot_batches(summary, plot)
        out.message(f"wrote {plot}")
    if not code and write:
        write_k_by_batch_size(pipeline, out, summary, force)
    return code
