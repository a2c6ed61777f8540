"""Training a draft head, as a Python API: data -> the target's states -> training, checkpointed
-> the held-out acceptance per draft depth. `specdec train-draft` is this plus progress bars.

    from specdec_cli import Pipeline
    from specdec_cli.training.api import TrainRequest, train_draft
    from specdec_cli.training.trainer import TrainSettings
    result = train_draft(Pipeline.from_profile("smollm2-demo"),
                         TrainRequest(TrainSettings(kind="medusa"), data="mixed", folder=Path("heads")))
"""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

from ..drafters.head_files import feature_layers, target_facts
from ..errors import UsageError
from .corpus import read_prompts
from .distill import as_texts, self_distilled
from .trainer import STATE, Progress, Trainer, TrainSettings, check_out_folder, load_state, read_features


@dataclass(frozen=True)
class TrainRequest:
    """What to train on and where it goes (the train-draft command's options)."""

    settings: TrainSettings
    data: str  # a built-in corpus's name or a prompts file (corpus.read_prompts)
    folder: Path  # the head, and the checkpoint that `resume` continues
    texts: bool = False  # train on the data's texts rather than the target's own answers to them
    max_tokens: int = 128  # the target's answer length, self-distilled
    limit: int | None = None  # the first N prompts only
    held_out: float = 0.1  # the share of prompts kept aside to measure
    resume: bool = False
    overwrite: bool = False


@dataclass(frozen=True)
class Phase:
    """A stretch of work to show progress for: `total` units, `completed` already done, and the
    named fields each advance may update (text)."""

    description: str
    total: int
    completed: int = 0
    fields: tuple[str, ...] = ()


# given a Phase, a context that yields advance(units=1, **fields); the command's are progress bars
ShowProgress = Callable[[Phase], ContextManager[Callable[..., None]]]


@contextlib.contextmanager
def no_progress(phase: Phase) -> Iterator[Callable[..., None]]:
    yield lambda units=1, **fields: None


@dataclass(frozen=True)
class TrainResult:
    """Acceptance dicts (trainer.chain_acceptance): held out before and after training, and on
    as many training prompts. `interrupted`: Ctrl-C stopped training (the rest is then None);
    `saved`: a checkpoint is in the folder."""

    folder: Path
    kind: str
    interrupted: bool = False
    saved: bool = False
    untrained: dict[str, Any] | None = None
    trained: dict[str, Any] | None = None
    untrained_seen: dict[str, Any] | None = None
    trained_seen: dict[str, Any] | None = None
    losses: tuple[float, ...] = ()  # per epoch

    @property
    def state_file(self) -> Path:
        """The training checkpoint (drafting does not need it)."""
        return self.folder / STATE


def split_held_out(items: list, fraction: float, seed: int) -> tuple[list, list]:
    """A fixed share (at least one) held out to measure, chosen by a seeded shuffle."""
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    held = max(1, round(len(items) * fraction))
    return [items[i] for i in sorted(order[held:])], [items[i] for i in sorted(order[:held])]


def train_draft(pipeline, request: TrainRequest, progress: ShowProgress = no_progress) -> TrainResult:
    """Train `request.settings.kind` heads on `pipeline`'s frozen target and write them to
    `request.folder`; Ctrl-C during training keeps the last checkpoint (interrupted=True)."""
    settings, folder = request.settings, request.folder
    check_out_folder(folder, request.resume, request.overwrite)
    prompts = read_prompts(request.data)[: request.limit] if request.limit else read_prompts(request.data)
    if len(prompts) < 2:
        raise UsageError("--limit: keep at least 2 prompts (one is held out to measure)")
    if pipeline.profile.target.quantize_head:
        raise UsageError("train-draft trains against the target's full-precision output head: "
                         "remove quantize_head from the profile")
    train_prompts, held_prompts = split_held_out(prompts, request.held_out, settings.seed)

    # 1. the training sequences: the target's own answers (cached), or the texts themselves
    if request.texts:
        train, held = as_texts(pipeline, train_prompts), as_texts(pipeline, held_prompts)
    else:
        with progress(Phase("answering prompts", len(prompts), fields=("tokens",))) as advance:
            made = [0]

            def answered(tokens: int) -> None:
                made[0] += tokens
                advance(tokens=f"{made[0]} new tokens")

            train = self_distilled(pipeline, train_prompts, request.max_tokens, answered)
            held = self_distilled(pipeline, held_prompts, request.max_tokens, answered)
    train = [s for s in train if len(s.ids) - s.first_label >= 2]
    held = [s for s in held if len(s.ids) - s.first_label >= 2]
    if not train:
        raise UsageError("--data: no training sequence has two or more tokens to learn; give longer prompts or answers")

    # 2. the target's hidden states, read once
    layers = feature_layers("medusa" if settings.kind == "medusa" else "eagle3", pipeline.target)  # --kind eagle writes EAGLE-3
    with progress(Phase("reading the target's states", sum(len(s.ids) for s in train + held))) as advance:
        states = read_features(pipeline.target, train + held, layers, advance)
    trainer = Trainer(pipeline.target, settings, train, held, states[: len(train)], states[len(train) :], pipeline.eos_ids)

    # 3. training, checkpointed
    if request.resume:
        state = load_state(folder)
        at = trainer.restore(state, folder)
        untrained = state["meta"]["held_out"]["untrained"]
        untrained_seen = state["meta"]["training_prompts"]["untrained"]
    else:
        at = Progress()
        untrained, untrained_seen = trainer.acceptance(held=True), trainer.acceptance(held=False)
    meta: dict[str, Any] = {
        "target": {**target_facts(pipeline.target), "model": pipeline.profile.target.model},
        "training": {**asdict(settings), "data": request.data, "texts": request.texts, "max_tokens": request.max_tokens,
                     "prompts": len(train), "held_out_prompts": len(held)},
        "held_out": {"untrained": untrained},
        "training_prompts": {"untrained": untrained_seen},  # as many as are held out
    }
    dtype = pipeline.target.dtype
    total = trainer.batches_per_epoch() * settings.epochs
    with progress(Phase("training", total, at.steps, fields=("loss", "speed"))) as advance:
        started, seen = time.perf_counter(), [0]

        def tick(loss: float, tokens: int) -> None:
            seen[0] += tokens
            rate = seen[0] / max(1e-9, time.perf_counter() - started)
            advance(loss=f"loss {loss:.3f}", speed=f"{rate:,.0f} tok/s")

        def save(checkpoint: Progress) -> None:
            trainer.save(folder, checkpoint, meta, dtype)

        try:
            at = trainer.run(at, save, tick)
        except KeyboardInterrupt:
            return TrainResult(folder, settings.kind, interrupted=True, saved=(folder / STATE).is_file())

    # 4. what the user got, measured on prompts training never saw
    trained = meta["held_out"]["trained"] = trainer.acceptance(held=True)
    trained_seen = meta["training_prompts"]["trained"] = trainer.acceptance(held=False)
    meta["training"]["epoch_losses"] = [round(x, 4) for x in at.losses]
    trainer.save(folder, at, meta, dtype)
    return TrainResult(folder, settings.kind, saved=(folder / STATE).is_file(), untrained=untrained, trained=trained,
                       untrained_seen=untrained_seen, trained_seen=trained_seen, losses=tuple(at.losses))
