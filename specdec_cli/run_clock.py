"""Where a run's seconds went before and around its tokens: each part (imports, tokenizer, weights,
kernel build, compile, prefill, decode) timed where it happens, added up per process, and said in
one line at -v, so that a slow start names its cause."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

_started = time.perf_counter()  # restart() sets it when a command starts: the wall to account for
_parts: dict[str, float] = {}
_inner: list[float] = []  # per open timed() block, the seconds of the parts timed inside it


def restart() -> None:
    """A command starts: its wall counts from now, with no parts yet."""
    global _started
    _started = time.perf_counter()
    _parts.clear()


@contextmanager
def timed(part: str) -> Iterator[None]:
    """Adds the block's seconds to `part` (a part timed again, as each draft model's weights, adds
    up), less those of parts timed inside it (the kernels built while int4 weights load)."""
    started = time.perf_counter()
    _inner.append(0.0)
    try:
        yield
    finally:
        elapsed = time.perf_counter() - started
        add(part, elapsed - _inner.pop())
        if _inner:
            _inner[-1] += elapsed


def add(part: str, seconds: float) -> None:
    _parts[part] = _parts.get(part, 0.0) + seconds


def describe(extra: dict[str, float] | None = None) -> str:
    """`where the 7.9 s went: imports 1.3 s · tokenizer 0.2 s · ... · other 0.4 s`: the parts timed
    (and `extra`, measured by the caller), then what none of them covers."""
    wall = time.perf_counter() - _started
    shown = {**_parts, **(extra or {})}
    other = wall - sum(shown.values())
    items = [f"{name} {seconds:.2f} s" for name, seconds in shown.items()]
    if other >= 0.005:
        items.append(f"other {other:.2f} s")
    return f"where the {wall:.1f} s went: " + " · ".join(items)
