"""The decoding loop: prefill, then draft -> verify -> commit, one target forward per step.

Plain autoregressive decoding is the same loop with no drafter (every step verifies zero drafts
and keeps the target's own token), so the baseline shares every line of caching and sampling.
The engine yields events and never prints.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, Sequence

import torch

from .devices import PhaseTimer, device_clock
from .drafters.base import Drafter
from .errors import ContextLengthError
from .events import Event, Finished, Prefilled, Verified
from .lm import make_lm
from .lookahead import make_lookahead
from .specs import AdaptiveSpec, SamplingSpec
from .sampling import probabilities
from .stats import DecodeStats
from .verify import greedy_verify, speculative_verify


def cut_at_stop(
    new_tokens: list[int], produced: int, limit: int, eos_ids: frozenset[int]
) -> tuple[list[int], str | None]:
    """The part of this step's tokens that may be emitted, and why generation ends (if it does).

    Nothing passes max_new_tokens or the first EOS, not even an accepted run of drafts.
    """
    kept = new_tokens[: limit - produced]
    for i, token in enumerate(kept):
        if token in eos_ids:
            return kept[: i + 1], "eos"
    return kept, ("length" if produced + len(kept) >= limit else None)


def room_after(context_length: int | None, prompt_tokens: int) -> int:
    """How many new tokens fit after a prompt of this length (no limit when the model states none)."""
    return (1 << 30) if context_length is None else context_length - prompt_tokens


class SpeculativeDecoder:
    """Speculative decoding of one target with one drafter (or none: plain decoding).

    The target's cache holds every committed token but the last, which is fed with the next
    step's drafts; after each step both caches hold exactly the committed sequence.
    """

    def __init__(
        self,
        target: torch.nn.Module,
        drafter: Drafter | None,
        *,
        vocab: int,
        eos_ids: frozenset[int],
        k: int | str = 5,
        adaptive: AdaptiveSpec = AdaptiveSpec(),
        context_length: int | None = None,
        compile: str = "off",
        on_compile: Callable[[str], None] | None = None,
    ):
        # compile "off": a DynamicCache, eager (CachedLM); "on": a static cache and a compiled step
        # (compiled.StaticLM); "auto" is resolved by the caller (lm.resolve_compile)
        self.compile = compile
        self.lm = make_lm(target, vocab, compile, on_compile=on_compile)
        self.compile_seconds = 0.0  # ahead-of-decoding compile time (warmup), never in decode timings
        self._warm_for: int | None = None  # the k limit whose step widths are compiled
        self.drafter = drafter
        self.eos_ids = eos_ids
        self.k = k if drafter is not None else 0
        self.adaptive = adaptive
        self.context_length = context_length
        self.output_device = target.get_output_embeddings().weight.device
        # k: auto learns acceptance and costs of this pair on this machine, kept across this
        # decoder's generations (generate --samples and bench repeats reuse one decoder)
        self.lookahead = make_lookahead(self.k, adaptive.k_max, adaptive.threshold)

    @property
    def k_limit(self) -> int:
        return self.adaptive.k_max if self.k == "auto" else int(self.k)

    def room_for(self, prompt_tokens: int) -> int:
        return room_after(self.context_length, prompt_tokens)

    def reserve(self, positions: int) -> None:
        """Static caches: room for `positions` tokens in the target's and the drafter's caches."""
        if self.compile == "off":
            return
        self.lm.reserve(positions)
        reserve = getattr(self.drafter, "reserve", None)  # drafters with a model of their own
        if reserve is not None:
            reserve(positions + self.k_limit)

    def warmup(self) -> float:
        """Compile the target's step and the drafter's, and run every width this decoder can take
        (1..k+1 tokens) once, per k limit; seconds spent. A no-op with compile off."""
        if self.compile == "off" or self._warm_for == self.k_limit:
            return 0.0
        started = time.perf_counter()
        # a verify of n tokens keeps all n rows; plain decoding's one token keeps one
        self.lm.warmup([(n, n) for n in range(1, self.k_limit + 2)])
        warm_drafter = getattr(self.drafter, "warmup", None)
        if warm_drafter is not None:
            warm_drafter()
        self._warm_for = self.k_limit
        seconds = time.perf_counter() - started
        self.compile_seconds += seconds
        return seconds

    def stream(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        *,
        max_new_tokens: int,
        sampling: SamplingSpec = SamplingSpec(),
        seed: int = 0,
    ) -> Iterator[Event]:
        ids = torch.as_tensor(prompt_ids, dtype=torch.long).to(self.lm.device)
        if ids.numel() == 0:
            raise ContextLengthError("the prompt has no tokens")
        room = self.room_for(ids.numel())
        if room < 1:
            raise ContextLengthError(
                f"the prompt is {ids.numel()} tokens, and the model's context is {self.context_length}; shorten it"
            )
        limit = min(max_new_tokens, room)
        device = self.lm.device
        generator = None if sampling.greedy else torch.Generator(device=self.output_device).manual_seed(seed)
        stats = DecodeStats(k=self.k, k_limit=self.k_limit)
        timer = PhaseTimer(device)
        lookahead = self.lookahead

        # 0. static caches sized for this generation; compiled steps built before any clock starts
        self.reserve(ids.numel() + limit)
        self.warmup()

        # 1. prefill: the target and the drafter read the prompt (the last token waits for step 1)
        started = device_clock(device)
        self.lm.reset()
        self.lm.prefill(ids[:-1])
        if self.drafter is not None:
            self.drafter.begin(ids, sampling, seed + 1)
        pending = ids[-1:]
        event: Event = Prefilled(int(ids.numel()), device_clock(device) - started)
        stats.observe(event)
        yield event

        generated: list[int] = []
        finish: str | None = None
        while finish is None:
            step_started = time.perf_counter()
            # 2. draft up to k tokens (never more than the tokens still allowed, minus the target's own)
            k_plan, budget = lookahead.plan()
            k_step = min(k_plan, limit - len(generated) - 1)
            mark = timer.start()
            draft = self.drafter.propose(k_step, budget) if self.drafter is not None and k_step > 0 else None
            timer.stop("draft", mark)
            drafted_at = time.perf_counter()
            draft_ids = draft.token_ids if draft is not None else pending[:0]

            # 3. verify: ONE target forward over the last committed token and the drafts
            mark = timer.start()
            cached_before = self.lm.length
            logits = self.lm.forward(torch.cat([pending, draft_ids]), keep=draft_ids.numel() + 1)
            n_accepted, next_token = self.verify(logits, draft, draft_ids, sampling, generator)
            # the verify's one device -> host transfer (a model drafter under k: auto also reads
            # each draft's confidence while drafting)
            values = torch.cat([n_accepted.view(1), next_token.view(1), draft_ids.to(logits.device)]).tolist()
            timer.stop("verify", mark)
            verified_at = time.perf_counter()
            n, token, drafted = values[0], values[1], values[2:]

            # 4. commit: emit, then roll both caches back to exactly the committed tokens
            emitted, finish = cut_at_stop(drafted[:n] + [token], len(generated), limit, self.eos_ids)
            generated.extend(emitted)
            self.lm.truncate(cached_before + len(emitted))
            pending = torch.tensor(emitted[-1:], dtype=torch.long, device=device)
            if self.drafter is not None:
                self.drafter.accept(emitted, min(n, len(emitted)))
            step_seconds = time.perf_counter() - step_started
            drafter_name = draft.drafter if draft is not None else None
            lookahead.observe(
                drafter_name, budget, len(drafted), n, len(emitted),
                drafted_at - step_started, verified_at - drafted_at, step_seconds,
            )
            event = Verified(drafter_name, tuple(drafted), n, token, tuple(emitted), step_seconds)
            stats.observe(event)
            yield event

        phases = timer.totals()
        stats.draft_seconds = phases.get("draft", 0.0)
        stats.verify_seconds = phases.get("verify", 0.0)
        yield Finished(tuple(generated), finish, stats)

    @staticmethod
    def verify(logits, draft, draft_ids, sampling: SamplingSpec, generator):
        draft_ids = draft_ids.to(logits.device)
        if sampling.greedy:
            return greedy_verify(draft_ids, logits)
        target_probs = probabilities(logits, sampling)
        draft_probs = draft.probs.to(logits.device) if draft is not None and draft.probs is not None else None
        return speculative_verify(draft_ids, draft_probs, target_probs, generator)


def run(decoder: SpeculativeDecoder, prompt_ids: Sequence[int], **kwargs) -> Finished:
    """Drain the stream; the Finished event."""
    finished = None
    for event in decoder.stream(prompt_ids, **kwargs):
        if isinstance(event, Finished):
            finished = event
    return finished
