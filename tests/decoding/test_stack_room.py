"""A decode step must not pay for where its caller sits on CPython's frame stack (stack_room.py).

On CPython 3.11 and 3.12 a loop whose calls cross the end of a 16 KiB frame-stack chunk maps a
fresh chunk on every call and faults its page in again; the kernel counts those page faults, so
they are measured here (getrusage's minor faults), never time. Every test sweeps the caller's
depth over more than one chunk, so that some depth puts the edge right under the loop.
"""

from __future__ import annotations

import resource
import statistics
import sys

import pytest

from specdec_cli.decoding.events import Verified
from specdec_cli.profile import load_profile
from specdec_cli.api import Pipeline
from specdec_cli.decoding.stack_room import with_stack_room

CALLS = 2000
# a frame of at_depth takes ~15 slots: 400 depths sweep ~6000 slots, about three 2048-slot chunks.
# Each chunk's edge falls at another offset within a frame, and only some offsets leave the loop's
# frame in the old chunk and its calls' in a new one; over three, one does, whatever the caller's
# own depth (a pytest worker's differs from a lone process's)
DEPTHS = range(0, 400)
THRASHING_CPYTHON = (3, 11) <= sys.version_info[:2] < (3, 13)


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def at_depth(depth: int, fn):
    return fn() if depth == 0 else at_depth(depth - 1, fn)


def leaf() -> None:
    pass


def hot_loop() -> int:
    before = minor_faults()
    for _ in range(CALLS):
        leaf()
    return minor_faults() - before


def worst_depth(loop) -> int:
    """The most page faults the loop took at any caller depth."""
    return max(at_depth(depth, loop) for depth in DEPTHS)


@pytest.mark.skipif(not THRASHING_CPYTHON, reason="only CPython 3.11 and 3.12 free a chunk on every return")
def test_the_sweep_finds_the_depth_where_plain_calls_thrash():
    # the control: called directly, some depth puts the chunk edge between the loop and its calls
    assert worst_depth(hot_loop) >= CALLS // 2


def test_a_loop_behind_the_trampoline_never_thrashes():
    assert worst_depth(lambda: with_stack_room(hot_loop)) < 50


@pytest.mark.parametrize("drafting", [False, True], ids=["plain", "draft-model"])
def test_decode_steps_cost_no_page_faults_at_any_caller_depth(llama_profile, drafting):
    """The tiny llama pair, eager: page faults per step stay flat over caller depths (at a bad
    depth, before steps ran on a fresh chunk, 64 a step against 0.4 at the others)."""
    pipe = Pipeline(load_profile(str(llama_profile)))
    decoder = pipe.decoder(k=3) if drafting else pipe.decoder(drafter=None)
    ids = pipe.encode("the cat sat on the mat")
    list(decoder.stream(ids, max_new_tokens=4))  # allocator and caches warm

    def faults_per_step() -> float:
        before = minor_faults()
        steps = sum(isinstance(event, Verified) for event in decoder.stream(ids, max_new_tokens=8))
        return (minor_faults() - before) / steps

    per_step = [at_depth(depth, faults_per_step) for depth in DEPTHS]
    assert max(per_step) < statistics.median(per_step) + 8, per_step
