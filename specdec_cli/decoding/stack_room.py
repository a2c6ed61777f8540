"""Run a decode step where the interpreter's frame stack has room for all of it.

CPython 3.11 and 3.12 (3.13 and 3.14 before their fix) keep a thread's Python frames in 16 KiB
chunks and free a chunk the moment its last frame returns (python/cpython#142183). A step whose
calls go just past a chunk's end maps and unmaps that memory, and faults its pages in again, on
each of the hundreds of module and kernel calls of a model forward: depending only on how deep the
caller happens to be (a console script, a wrapper, a test), every step costs 30-50% more
(SmolLM2-135M, 2-core Xeon: 45 against 60-67 ms eager, 24 against 35 ms compiled).

A frame too large for any 16 KiB chunk always starts a new chunk, which CPython sizes to hold the
frame plus 1000 slots, rounded up to a power of two: 64 KiB for TRAMPOLINE_SLOTS, leaving ~4000
slots (31 KiB) after it for the step's own frames. So a step crosses one chunk edge on entry, not
hundreds inside. The frame takes more than half its chunk, so a trampoline called inside another
(a warmup inside a step) never fits behind the first one and gets a fresh chunk of its own.
"""

from __future__ import annotations

import sys
from typing import Callable, TypeVar

T = TypeVar("T")

# 8-byte slots in the trampoline's frame: more than a 16 KiB chunk's 2048, so it never fits in the
# chunk it is called from; 4200 + 1000 > 4096 makes CPython's chunk 8192 slots, and 4200 > 8192 / 2
# leaves too little behind it for a second trampoline
TRAMPOLINE_SLOTS = 4200


def with_stack_room(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs), its frames at the start of a fresh frame-stack chunk."""
    return fn(*args, **kwargs)


if sys.version_info >= (3, 11):  # 3.10 allocates each frame on its own: nothing to do there
    with_stack_room.__code__ = with_stack_room.__code__.replace(co_stacksize=TRAMPOLINE_SLOTS)
