"""`specdec train-draft`: data -> the target's states -> training with a progress bar -> the
held-out acceptance per draft depth. Ctrl-C keeps the last checkpoint (exit 130); --resume continues."""

from __future__ import annotations

import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from ..drafters.head_files import feature_layers, target_facts
from ..errors import EXIT_INTERRUPTED, EXIT_OK, UsageError
from ..training.corpus import read_prompts
from ..training.distill import as_texts, self_distilled
from ..training.trainer import Progress as TrainProgress
from ..training.trainer import STATE, Trainer, TrainSettings, check_out_folder, load_state, read_features
from .output import Output


def split_held_out(items: list, fraction: float, seed: int) -> tuple[list, list]:
    """A fixed share (at least one) held out to measure, chosen by a seeded shuffle."""
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    held = max(1, round(len(items) * fraction))
    return [items[i] for i in sorted(order[held:])], [items[i] for i in sorted(order[:held])]


def bar(out: Output, *fields: str) -> Progress:
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    columns += [TextColumn(f"{{task.fields[{name}]}}") for name in fields]
    return Progress(*columns, TimeElapsedColumn(), TimeRemainingColumn(), console=out.info, transient=True)


def acceptance_table(untrained: dict[str, Any], trained: dict[str, Any]) -> Table:
    table = Table(title="held-out acceptance per draft depth (greedy chain)", title_justify="left")
    table.add_column("depth", justify="right")
    table.add_column("untrained", justify="right")
    table.add_column("trained", justify="right")
    for depth, (before, after) in enumerate(zip(untrained["per_depth"], trained["per_depth"]), 1):
        table.add_row(str(depth), f"{before:.1%}", f"{after:.1%}")
    table.add_row("tokens/pass", f"{untrained['tokens_per_pass']}", f"{trained['tokens_per_pass']}")
    return table


def run_train_command(
    pipeline, out: Output, *, settings: TrainSettings, data: str, texts: bool, max_tokens: int,
    limit: int | None, held_out: float, folder: Path, resume: bool, overwrite: bool,
) -> int:
    check_out_folder(folder, resume, overwrite)
    prompts = read_prompts(data)[:limit] if limit else read_prompts(data)
    if len(prompts) < 2:
        raise UsageError("--limit: keep at least 2 prompts (one is held out to measure)")
    train_prompts, held_prompts = split_held_out(prompts, held_out, settings.seed)

    # 1. the training sequences: the target's own answers (cached), or the texts themselves
    if texts:
        train, held = as_texts(pipeline, train_prompts), as_texts(pipeline, held_prompts)
    else:
        with bar(out, "tokens") as progress:
            task = progress.add_task("answering prompts", total=len(prompts), tokens="")
            made = [0]

            def advance(tokens: int) -> None:
                made[0] += tokens
                progress.update(task, advance=1, tokens=f"{made[0]} new tokens")

            train = self_distilled(pipeline, train_prompts, max_tokens, advance)
            held = self_distilled(pipeline, held_prompts, max_tokens, advance)
    train = [s for s in train if len(s.ids) - s.first_label >= 2]
    held = [s for s in held if len(s.ids) - s.first_label >= 2]
    if not train:
        raise UsageError("--data: no training sequence has two or more tokens to learn; give longer prompts or answers")

    # 2. the target's hidden states, read once
    layers = feature_layers("medusa" if settings.kind == "medusa" else "eagle3", pipeline.target)  # --kind eagle writes EAGLE-3
    with bar(out) as progress:
        task = progress.add_task("reading the target's states", total=sum(len(s.ids) for s in train + held))
        states = read_features(pipeline.target, train + held, layers, lambda n: progress.update(task, advance=n))
    trainer = Trainer(pipeline.target, settings, train, held, states[: len(train)], states[len(train) :], pipeline.eos_ids)

    # 3. training, checkpointed
    if resume:
        state = load_state(folder)
        progress_state = trainer.restore(state, folder)
        untrained = state["meta"]["held_out"]["untrained"]
        untrained_seen = state["meta"]["training_prompts"]["untrained"]
    else:
        progress_state = TrainProgress()
        untrained, untrained_seen = trainer.acceptance(held=True), trainer.acceptance(held=False)
    meta: dict[str, Any] = {
        "target": {**target_facts(pipeline.target), "model": pipeline.profile.target.model},
        "training": {**asdict(settings), "data": data, "texts": texts, "max_tokens": max_tokens,
                     "prompts": len(train), "held_out_prompts": len(held)},
        "held_out": {"untrained": untrained},
        "training_prompts": {"untrained": untrained_seen},  # as many as are held out
    }
    dtype = pipeline.target.get_output_embeddings().weight.dtype
    total = trainer.batches_per_epoch() * settings.epochs
    with bar(out, "loss", "speed") as progress:
        task = progress.add_task("training", total=total, completed=progress_state.steps, loss="", speed="")
        started, seen = time.perf_counter(), [0]

        def tick(loss: float, tokens: int) -> None:
            seen[0] += tokens
            rate = seen[0] / max(1e-9, time.perf_counter() - started)
            progress.update(task, advance=1, loss=f"loss {loss:.3f}", speed=f"{rate:,.0f} tok/s")

        def save(at: TrainProgress) -> None:
            trainer.save(folder, at, meta, dtype)

        try:
            progress_state = trainer.run(progress_state, save, tick)
        except KeyboardInterrupt:
            progress.stop()
            saved = (folder / STATE).is_file()
            out.message(
                f"interrupted: {folder} keeps the last checkpoint; run the same command with --resume to continue"
                if saved else "interrupted before the first checkpoint: nothing was written"
            )
            return EXIT_INTERRUPTED

    # 4. what the user got, measured on prompts training never saw
    trained = trainer.acceptance(held=True)
    meta["held_out"]["trained"] = trained
    seen = meta["training_prompts"]["trained"] = trainer.acceptance(held=False)
    meta["training"]["epoch_losses"] = [round(x, 4) for x in progress_state.losses]
    trainer.save(folder, progress_state, meta, dtype)
    out.info.print(acceptance_table(untrained, trained))
    losses = ", ".join(f"{x:.3f}" for x in progress_state.losses)
    out.message(f"loss per epoch: {losses}")
    out.message(f"on training prompts: {seen['tokens_per_pass']} tokens per target pass (untrained {untrained_seen['tokens_per_pass']})")
    key = "heads" if settings.kind == "medusa" else "head"
    out.message(f"wrote {folder}; use it with  drafter: {{kind: {settings.kind}, {key}: {folder}}}")
    state = folder / STATE
    if state.is_file():  # not part of the head: only training reads it
        out.message(f"{state} ({state.stat().st_size / 2**20:.0f} MB) is the training checkpoint that --resume "
                    "continues from; drafting does not need it, delete it if you will not train further")
    return EXIT_OK
