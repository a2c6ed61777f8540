"""The interface every method bench times meets, the clock it reads, and our engine's methods.

Every clock read follows a device sync. Tests put a clock of their own in place of `synced_clock`
here: every method looks it up at run time, through this module.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from ..api import Pipeline
from ..decoding.events import Finished, Verified
from ..models.devices import device_clock
from ..specs import SamplingSpec, TreeSpec

Clock = Callable[[], float]


def synced_clock(device: torch.device) -> Clock:
    """Seconds, read after the device has finished its queued work."""
    return lambda: device_clock(device)


class Method(Protocol):
    name: str

    def run(self, ids: list[int], max_new_tokens: int, sampling: SamplingSpec, seed: int) -> dict[str, Any]:
        """Generate once; the RunResult fields other than method, prompt and repeat."""


class EngineMethod:
    """`plain` (no drafter), `specdec` (a chain of k) or a token tree: the same engine code path."""

    def __init__(self, name: str, pipeline: Pipeline, k: int | str | None, plain: bool = False,
                 tree: TreeSpec | None = None, clock: Clock | None = None):
        self.name = name
        self.pipeline = pipeline
        self.clock = clock or synced_clock(pipeline.device)
        self.decoder = pipeline.decoder(drafter=None) if plain else pipeline.decoder(k=k, tree=tree)

    def prepare(self) -> None:
        """Compile this decoder's steps (a no-op with compile off) before any clock starts."""
        self.decoder.warmup()

    @property
    def compile_seconds(self) -> float:
        return self.decoder.compile_seconds

    def run(self, ids, max_new_tokens, sampling, seed):
        self.pipeline.lookup_pool.clear()  # each generation stands alone: none reads an earlier repeat's answer
        started = self.clock()
        first_at, first_tokens, finished = None, 0, None
        events = self.decoder.stream(ids, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                                     constraint=self.pipeline.matcher())  # the profile's constraint, if any
        for event in events:
            if isinstance(event, Verified) and first_at is None:
                first_at, first_tokens = self.clock(), len(event.emitted)
            elif isinstance(event, Finished):
                finished = event
        ended = self.clock()
        stats = finished.stats
        return {
            "token_ids": finished.token_ids,
            "ttft_seconds": first_at - started,
            "total_seconds": ended - started,
            "first_tokens": first_tokens,
            "target_forwards": stats.target_forwards,
            "drafted": stats.drafted,
            "accepted": stats.accepted,
            "stats": stats,
        }
