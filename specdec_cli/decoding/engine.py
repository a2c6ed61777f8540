"""Speculative decoding of one sequence: the decoding core (batched.py) with one row.

Every step is the core's draft -> verify -> commit, one target forward per step, batch size 1
being its ordinary case: a chain or a token tree from any drafter, verified in one forward of the
one-sequence LM (runtime/one_row.py: its padded and compiled steps), the same acceptance rule, the
same commit. Plain autoregressive decoding is the same loop with no drafter. The engine yields
events and never prints; timing and `k: auto` learn from the events.

Above temperature 0 each token is the target's seeded choice at its position (sampling.py), made
from noise keyed by (seed, position): the same seed gives the same text for any k, tree or drafter.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import torch

from ..constraints.matcher import RowMatcher
from ..drafters.base import Drafter
from ..specs import AdaptiveSpec, SamplingSpec, TreeSpec
from .batched import BatchedDecoder, Request
from .commit import StopCheck
from .events import Event, Finished


class SpeculativeDecoder:
    """Speculative decoding of one target with one drafter (or none: plain decoding), a sequence
    at a time. The target's cache holds every committed token but the last, which is fed with the
    next step's drafts; after each step both caches hold exactly the committed sequence."""

    def __init__(
        self,
        target: torch.nn.Module,
        drafter: Drafter | None,
        *,
        vocab: int,
        eos_ids: frozenset[int],
        k: int | str = 5,
        adaptive: AdaptiveSpec = AdaptiveSpec(),
        tree: TreeSpec | None = None,
        context_length: int | None = None,
        compile: str = "off",
        on_compile: Callable[[str], None] | None = None,
    ):
        """compile "off": a DynamicCache, eager (lm.CachedLM); "on": a static cache and a compiled
        step (static.StaticLM); "auto" is resolved by the caller (lm.resolve_compile)."""
        self.drafter = drafter
        self.core = BatchedDecoder(
            target, None if drafter is None else (lambda: drafter), vocab=vocab, eos_ids=eos_ids, k=k, batch_size=1,
            context_length=context_length, tree=tree, adaptive=adaptive, compile=compile, on_compile=on_compile,
        )
        self.lm = self.core.lm.lm  # the target's one-sequence LM
        # k: auto and tree: auto learn acceptance and costs of this pair on this machine, kept
        # across this decoder's generations (generate --samples and bench repeats reuse one decoder)
        self.lookahead = self.core.lookahead
        self.k = self.core.row_k
        self.tree = self.core.tree

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.core.eos_ids

    @eos_ids.setter
    def eos_ids(self, ids: frozenset[int]) -> None:
        self.core.eos_ids = ids

    @property
    def k_limit(self) -> int:
        """The deepest a draft can go (a chain's k)."""
        return self.core.k_limit

    @property
    def node_limit(self) -> int:
        """The most tokens a draft can hold (the widest verify is one more)."""
        return self.core.node_limit

    @property
    def compile_seconds(self) -> float:
        """Ahead-of-decoding compile time (warmup), never in decode timings."""
        return self.core.compile_seconds

    def warmup(self) -> float:
        """Compile the target's step and the drafter's, and run every width this decoder can take
        (1..nodes+1 tokens) once; seconds spent. A no-op with compile off."""
        return self.core.warmup()

    def stream(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        *,
        max_new_tokens: int,
        sampling: SamplingSpec = SamplingSpec(),
        seed: int = 0,
        stop: StopCheck | None = None,
        constraint: RowMatcher | None = None,
    ) -> Iterator[Event]:
        """Prefilled, one Verified per step, then Finished. `stop`: ends generation where a stop
        text appears (finish reason "stop"); `constraint`: what the text must spell."""
        steps = self.core.stream([Request(None, prompt_ids, max_new_tokens, sampling, seed, stop, constraint)])
        try:
            for _, event in steps:
                yield event
        finally:
            steps.close()


def run(decoder: SpeculativeDecoder, prompt_ids: Sequence[int], **kwargs) -> Finished:
    """Drain the stream; the Finished event."""
    finished = None
    for event in decoder.stream(prompt_ids, **kwargs):
        if isinstance(event, Finished):
            finished = event
    return finished
