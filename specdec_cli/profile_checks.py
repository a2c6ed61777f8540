"""One profile value checked: its type, range or choice, as a one-line ProfileError naming where it
came from (a profile key or a command-line option), with a "did you mean" for a near miss."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal

from .constraints.grammars import from_mapping
from .errors import ProfileError, UsageError
from .specs import AUTO_TREE, GROUP_SIZES, MAX_K, QUANTIZE_METHODS, ConstraintSpec, TreeSpec

# Each check takes (value, where) and returns the clean value or raises ProfileError(where: ...).

COMPILE_MODES = ("off", "auto", "on")


def shown_key(key: Any) -> str:
    """A key as a one-line message can show it: escaped when it holds newlines or control characters."""
    text = str(key)
    return text if text.isprintable() else repr(text)


def _type_name(t: type) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[t]


def check_type(value: Any, where: str, t: type) -> Any:
    # YAML `yes` is a bool, and bool is an int in Python: never accept it for a number
    if t is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise ProfileError(f"{where}: {str(value)[:12]}... is too large a number") from None
    if isinstance(value, bool) and t is not bool or not isinstance(value, t):
        raise ProfileError(f"{where}: {value!r} is not {_type_name(t)}")
    return value


def check_choice(value: Any, where: str, choices: tuple) -> Any:
    if value not in choices:
        shown = ", ".join("null" if c is None else str(c) for c in choices)
        raise ProfileError(f"{where}: {value!r} is not one of {shown}{did_you_mean(value, choices)}")
    return value


def did_you_mean(value: Any, choices: tuple) -> str:
    """' (did you mean X?)' when a choice is close to the given text, else ''."""
    named = [str(c) for c in choices if isinstance(c, str)]
    guess = difflib.get_close_matches(str(value), named, n=1) if isinstance(value, str) else []
    return f" (did you mean {guess[0]}?)" if guess else ""


def check_int(value: Any, where: str, minimum: int | None = None, maximum: int | None = None) -> int:
    value = check_type(value, where, int)
    if minimum is not None and value < minimum:
        raise ProfileError(f"{where}: {value} is below the minimum of {minimum}")
    if maximum is not None and value > maximum:
        raise ProfileError(f"{where}: {value} is above the maximum of {maximum}")
    return value


def check_k(value: Any, where: str) -> int | Literal["auto"]:
    if value == "auto":
        return "auto"
    if isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]{1,6}\s*", value):  # ASCII digits only, not '²'
        value = int(value)  # a negative k then gets the same "below the minimum" message as 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProfileError(f"{where}: {value!r} is not a whole number of tokens or 'auto'")
    return check_int(value, where, 1, MAX_K)


def check_k_by_batch_size(value: Any, where: str) -> tuple[tuple[int, int], ...] | None:
    """`k_by_batch_size: {1: 5, 4: 3, 16: 0}`: from each batch size up, that k (0: plain decoding)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        raise ProfileError(f"{where}: must be a mapping of batch size to k, e.g. {{1: 5, 4: 3, 16: 0}}")
    table = []
    for size, k in value.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ProfileError(f"{where}: batch size {shown_key(size)} is not a whole number of at least 1")
        table.append((size, check_int(k, f"{where}.{size}", 0, MAX_K)))
    return tuple(sorted(table))


MIN_TEMPERATURE = 1e-4  # below this, logits / T overflows float32 on the way to the argmax anyway


def check_temperature(value: Any, where: str) -> float:
    value = check_type(value, where, float)
    if not (value >= 0.0) or value == float("inf"):
        raise ProfileError(f"{where}: {value} must be 0 (greedy) or a positive number")
    if 0.0 < value < MIN_TEMPERATURE:
        raise ProfileError(f"{where}: {value} is too small to sample with; use 0 for greedy, or at least {MIN_TEMPERATURE}")
    return value


def check_top_p(value: Any, where: str) -> float:
    value = check_type(value, where, float)
    if not (0.0 < value <= 1.0):
        raise ProfileError(f"{where}: {value} must be in (0, 1]")
    return value


def check_threshold(value: Any, where: str) -> float:
    value = check_type(value, where, float)
    if not (0.0 <= value < 1.0):
        raise ProfileError(f"{where}: {value} must be in [0, 1)")
    return value


def check_device(value: Any, where: str) -> str:
    value = check_type(value, where, str)
    base, _, index = value.partition(":")
    if base not in ("auto", "cpu", "cuda", "mps") or (index and not (base == "cuda" and index.isdigit())):
        raise ProfileError(f"{where}: {value!r} is not one of auto, cpu, cuda, cuda:N, mps")
    return value


TREE_KEYS = ("nodes", "width", "depth", "auto")
DEFAULT_TREE = {"nodes": 16, "width": 4, "depth": 6}
MAX_TREE_WIDTH = 16


def check_tree(value: Any, where: str) -> TreeSpec | None:
    """`tree:` null/off/chain (a chain of k), auto, {nodes, width, depth[, auto]}, or from the
    command line "N" (nodes) / "N/W/D" (or "N,W,D", the older spelling)."""
    if value is None or value in ("off", "chain", "null"):
        return None
    if value == "auto":
        return AUTO_TREE
    if isinstance(value, int) and not isinstance(value, bool):
        value = {"nodes": value}
    if isinstance(value, str):
        parts = re.split(r"[/,]", value)
        if len(parts) not in (1, 3) or not all(re.fullmatch(r"\s*[0-9]{1,4}\s*", part) for part in parts):
            raise ProfileError(f"{where}: {value!r} is not auto, off, NODES or NODES/WIDTH/DEPTH (e.g. 16 or 16/4/6)")
        numbers = [int(part) for part in parts]
        value = {"nodes": numbers[0]} if len(numbers) == 1 else dict(zip(("nodes", "width", "depth"), numbers))
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: {value!r} is not null, auto or a mapping {{nodes, width, depth}}")
    unknown = [shown_key(key) for key in value if key not in TREE_KEYS]
    if unknown:
        raise ProfileError(f"{where}: unknown key {unknown[0]} (known: {', '.join(TREE_KEYS)})")
    fields = {**DEFAULT_TREE, **{k: v for k, v in value.items() if k != "auto"}}
    nodes = check_int(fields["nodes"], f"{where}.nodes", 1, MAX_K)
    width = check_int(fields["width"], f"{where}.width", 1, MAX_TREE_WIDTH)
    depth = check_int(fields["depth"], f"{where}.depth", 1, MAX_K)
    auto = check_type(value.get("auto", False), f"{where}.auto", bool)
    return TreeSpec(nodes, width, min(depth, nodes), auto)


def check_compile(value: Any, where: str) -> str:
    # YAML reads a bare `off` / `on` as a boolean
    named = {False: "off", True: "on"}.get(value, value) if isinstance(value, bool) else value
    return check_choice(named, where, COMPILE_MODES)


def check_quantize(value: Any, where: str) -> str:
    # null and YAML's bare `off` / `no` (a boolean) mean none
    named = "none" if value is None or value is False else value
    return check_choice(named, where, QUANTIZE_METHODS)


def check_group_size(value: Any, where: str) -> int | None:
    """null: not given (int4's default applies)."""
    return None if value is None else check_choice(check_type(value, where, int), where, GROUP_SIZES)


def check_chat(value: Any, where: str) -> bool | Literal["auto"]:
    if value == "auto" or isinstance(value, bool):
        return value
    raise ProfileError(f"{where}: {value!r} is not one of auto, true, false")


def check_nonempty_str(value: Any, where: str) -> str:
    value = check_type(value, where, str)
    if not value.strip():
        raise ProfileError(f"{where}: must not be empty")
    return value


def check_optional_str(value: Any, where: str) -> str | None:
    return None if value is None else check_nonempty_str(value, where)


def check_constraint(value: Any, where: str, base: Path | None) -> ConstraintSpec | None:
    """`constraint:` {json_schema: ...} | {json: true} | {regex: ...} | {grammar: ...}; null: none.
    Files are read relative to the profile's folder."""
    if value is None:
        return None
    try:
        return from_mapping(value, where, base)
    except UsageError as exc:
        raise ProfileError(str(exc)) from None
