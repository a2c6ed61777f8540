"""bench's and tune-k's options checked before any model loads (and without torch, so that a
typo costs no start-up): the methods, what goes with --batch-sizes, --write and --force, and the
settings every timed run uses."""

from __future__ import annotations

from pathlib import Path

from ..bench.options import ALL_METHODS, BATCH_METHODS, BenchSettings, parse_batch_sizes, require_plotting
from ..bench.workload import BenchPrompt, load_prompts
from ..errors import UsageError
from ..specs import Profile
from .setup import resolved_profile

DEFAULT_METHODS = "plain,specdec,hf-plain,hf-assisted"
CONSTRAINED_METHODS = "plain,specdec"  # specdec's own plain decoding is the constrained reference


def parse_methods(methods: str | None, constrained: bool = False) -> list[str]:
    """--methods (None: the default set) as method names, plain left out (it always runs).
    `constrained`: transformers' methods cannot follow the constraint, so the default leaves them out
    and naming one is an error."""
    given = methods
    methods = (CONSTRAINED_METHODS if constrained else DEFAULT_METHODS) if methods is None else methods
    names = [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [m for m in names if m not in ALL_METHODS]
    if unknown or not names:
        raise UsageError(f"--methods: '{unknown[0] if unknown else methods}' is not one of {', '.join(ALL_METHODS)}")
    unconstrained = next((m for m in names if m.startswith("hf-")), None)
    if constrained and given is not None and unconstrained:
        raise UsageError(f"--methods: {unconstrained} (transformers' generate) cannot follow a constraint: "
                         f"measure {CONSTRAINED_METHODS}")
    return [m for m in names if m != "plain"]  # plain always runs: it is the reference


def refuse_beside_batch_sizes(given: dict[str, object], fmt: str) -> None:
    """--batch-sizes measures chains of k against plain decoding, as a table or JSON: nothing else."""
    named = next((name for name, value in given.items() if value is not None), None)
    if named is not None:
        raise UsageError(f"{named} cannot go with --batch-sizes (it measures plain decoding, chains of k and the "
                         "profile's k: auto, trees included; measure the other methods at batch size 1)")
    if fmt == "csv":
        raise UsageError("--format csv cannot go with --batch-sizes: use human or json")


def check_batch_methods(methods: str) -> None:
    """--methods beside --batch-sizes: those it measures, specdec against plain (both run), and
    a one-line error naming any other."""
    names = parse_methods(methods)
    other = next((name for name in names if name not in BATCH_METHODS), None)
    if other is not None:
        raise UsageError(f"--methods: {other} cannot go with --batch-sizes (it measures {', '.join(BATCH_METHODS)}; "
                         f"measure {other} at batch size 1)")
    if not names:  # plain alone: a batch bench is the comparison
        raise UsageError("--methods: --batch-sizes measures specdec against plain: give plain,specdec")


def batch_setup(batch_sizes: str, plot: Path | None, profile: str | None, *, prompts: Path | None,
                category: list[str] | None, limit: int | None, max_new_tokens: int | None, repeats: int,
                warmup: int, seed: int, compile: str | None,
                **overrides: object) -> tuple[Profile, list[int], list[BenchPrompt], BenchSettings]:
    """--batch-sizes' options checked before the models load: (profile, batch sizes, prompts, settings).
    compile defaults to off: the batched engine runs eager, and batch size 1 runs as it does."""
    sizes = parse_batch_sizes(batch_sizes)
    chosen = resolved_profile(profile, compile=compile or "off", **overrides)
    if chosen.constraint is not None:
        raise UsageError("--batch-sizes measures unconstrained batches: drop the constraint (the profile's too), "
                         "or measure it at batch size 1")
    if plot is not None:
        require_plotting()
    chosen_prompts = load_prompts(prompts, category or (), limit)
    return chosen, sizes, chosen_prompts, bench_settings(chosen, max_new_tokens, repeats, warmup, seed)


def check_write_options(write: bool, force: bool, profile: Profile) -> None:
    """--write and --force, before any model loads: --force only beside --write, which needs the
    profile's file to write to."""
    if force and not write:
        raise UsageError("--force goes with --write (it writes a winner within noise)")
    if write and profile.source is None:
        raise UsageError("--write: this profile has no file to write to")


def bench_settings(profile, max_new_tokens: int | None, repeats: int, warmup: int, seed: int) -> BenchSettings:
    """Sampling and k come from the profile (with the command line's overrides already in it)."""
    if repeats < 1 or warmup < 0:
        raise UsageError("--repeats must be at least 1 and --warmup at least 0")
    return BenchSettings(
        max_new_tokens=max_new_tokens or 128,
        repeats=repeats,
        warmup=warmup,
        sampling=profile.sampling,
        seed=seed,
        k=profile.k,
    )
