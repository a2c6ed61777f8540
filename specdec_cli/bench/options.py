"""What bench, tune-k and verify are asked to run, parsed and checked before any model loads (and
without importing torch, so that a mistyped option costs no start-up): the methods, the ks and
trees to sweep, the batch sizes, the settings of every run, --plot's optional dependency."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ProfileError, UsageError
from ..profile_checks import check_tree
from ..specs import MAX_K, SamplingSpec, TreeSpec

ALL_METHODS = ("plain", "specdec", "specdec-tree", "hf-plain", "hf-assisted")
# bench's methods a batch measures: plain against specdec (a chain of each k, or the profile's k: auto)
BATCH_METHODS = ("plain", "specdec")
MAX_BATCH_SIZE = 1024


@dataclass
class BenchSettings:
    """What every timed run of a bench or a sweep decodes, and how often."""

    max_new_tokens: int = 128
    repeats: int = 3
    warmup: int = 1
    sampling: SamplingSpec = SamplingSpec()
    seed: int = 0
    k: int | str = 5


def parse_ks(ks: str | None, k_max: int | None, option: str = "--ks") -> list[int]:
    """--ks 1,2,4 or --k-max N as sorted distinct ks (default 1,2,3,4,6,8)."""
    if ks and k_max:
        raise UsageError("give --ks or --k-max, not both")
    if k_max:
        if not 1 <= k_max <= MAX_K:
            raise UsageError(f"--k-max: must be between 1 and {MAX_K}")
        return list(range(1, k_max + 1))
    try:
        values = sorted({int(v) for v in (ks or "1,2,3,4,6,8").split(",") if v.strip()})
    except ValueError:
        raise UsageError(f"{option}: '{ks}' is not a comma-separated list of integers") from None
    if not values or values[0] < 1 or values[-1] > MAX_K:
        raise UsageError(f"{option}: each k must be between 1 and {MAX_K}")
    return values


def parse_trees(trees: str | None) -> dict[str, TreeSpec]:
    """--trees 8,16,32,auto (node budgets, or auto; a full shape as NODES/WIDTH/DEPTH): label -> shape."""
    parsed: dict[str, TreeSpec] = {}
    for item in (trees or "").split(","):
        item = item.strip()
        if item:
            try:
                shape = check_tree(item, "--trees")
            except ProfileError as error:
                raise UsageError(f"{error} (in --trees give each tree as auto, NODES or NODES/WIDTH/DEPTH)") from None
            if shape is None:
                raise UsageError("--trees: 'off' is the chain: the k rows already run it")
            parsed[f"tree={item}"] = shape
    return parsed


def parse_batch_sizes(text: str, option: str = "--batch-sizes") -> list[int]:
    """'1,2,4,8' as sorted distinct batch sizes."""
    try:
        sizes = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise UsageError(f"{option}: '{text}' is not a comma-separated list of batch sizes, e.g. 1,2,4,8") from None
    if not sizes or sizes[0] < 1 or sizes[-1] > MAX_BATCH_SIZE:
        raise UsageError(f"{option}: each batch size must be between 1 and {MAX_BATCH_SIZE}")
    return sizes


def require_plotting() -> None:
    """--plot's optional dependency, checked before any work is done."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'specdec-cli[plot]'") from None
