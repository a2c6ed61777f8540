"""Batched speculative decoding: B sequences share each target forward, each drafting, accepting
and rolling back on its own.

The loop is engine.py's (draft -> verify -> commit) over rows: every row feeds its last committed
token and its drafts in one forward of the batch (models/batched_lm.py: one cache, per-row
positions, pads and rejected drafts masked), each row's choices and acceptance come from the
same functions as at batch size 1 (sampling.choose, acceptance.accept), and one transfer a step
reads every row's result. A finished row leaves the batch at once and the next request takes its
place, so a long stream of requests keeps the batch full. Plain decoding is the same loop with no
drafter (k = 0).

Above temperature 0 each row has its own seed and its own position-keyed noise, so a row's text
is the text its prompt gets at batch size 1 with that seed, whoever shares its batch.

In a batch: no drafter, a draft model, early exit, prompt lookup, Medusa heads or an EAGLE head
(drafters/batched.py; the heads get each row's hidden states of the target from the batch's forward),
drafting a chain of a fixed k, or with `k: auto` the k of each step chosen by measured goodput, 0
included (batch_k.py). Only at batch size 1, refused with a one-line message: chains of drafters and
token trees. `compile: on` runs the steps of the target and of a draft model
compiled over static caches of rows (models/batched_static.py), compiled before the first row
joins; `compile: off` runs them eagerly over DynamicCaches (models/batched_lm.py).
"""

from __future__ import annotations

import time
from typing import Callable, Hashable, Iterable, Iterator, NamedTuple, Sequence

import torch

from ..drafters.base import Draft, Drafter
from ..drafters.batched import BatchDrafter, batch_drafter
from ..errors import ContextLengthError, UsageError
from ..models.batched_lm import make_batched_lm
from ..models.devices import device_clock
from ..models.quantize import head_device
from ..specs import SamplingSpec, TreeSpec
from .acceptance import accept
from .batch_k import GoodputK
from .engine import SpeculativeDecoder, StopCheck, cut_at_stop, token_limit
from .events import Finished, Prefilled
from .sampling import PositionNoise, choose
from .stats import DecodeStats
from .tree import chain_parents


class Request(NamedTuple):
    """One prompt to decode; `key` comes back with its Finished event."""

    key: Hashable
    prompt_ids: Sequence[int]
    max_new_tokens: int
    sampling: SamplingSpec = SamplingSpec()
    seed: int = 0
    stop: StopCheck | None = None


class Row:
    """One sequence in the batch: what it has produced and what it waits to feed."""

    def __init__(self, request: Request, limit: int, noise: PositionNoise | None, stats: DecodeStats):
        self.key = request.key
        self.sampling = request.sampling
        self.stop = request.stop
        self.limit = limit
        self.noise = noise
        self.stats = stats
        self.generated: list[int] = []
        self.pending = int(request.prompt_ids[-1])  # the last committed token, fed with the next drafts
        self.finish: str | None = None

    @property
    def room(self) -> int:
        """Drafts this row may still verify: one token of what it may emit is the target's own."""
        return self.limit - len(self.generated) - 1


class BatchedDecoder:
    """Speculative decoding of up to `batch_size` sequences at once, with one drafter (or none).
    One run at a time: the caches hold that run's rows."""

    def __init__(
        self,
        target: torch.nn.Module,
        drafter: Callable[[], Drafter] | None,
        *,
        vocab: int,
        eos_ids: frozenset[int],
        k: int | str | GoodputK = 5,
        batch_size: int = 8,
        context_length: int | None = None,
        tree: TreeSpec | None = None,
        slack: int = 16,
        compile: str = "off",
        on_compile: Callable[[str], None] | None = None,
    ):
        """`drafter`: builds a fresh batch-1 drafter (Pipeline.make_drafter), whose batch form
        is made here; None: plain decoding. `k`: a number, "auto" (a fresh GoodputK) or a GoodputK
        that already learned at this batch size. `tree`: the profile's, refused unless None.
        `slack`: columns of holes an eager cache may carry before it is compacted. `compile`: "off",
        "on" or "static" (make_batched_lm); `on_compile` is told before a step compiles."""
        if isinstance(k, str) and k != "auto" or isinstance(k, bool):
            raise UsageError(f"k: {k!r} is not a number or auto")
        if tree is not None and drafter is not None:
            raise UsageError("tree: token trees run only at batch size 1: remove `tree:` (a chain of k), or use --batch-size 1")
        if batch_size < 1:
            raise UsageError(f"batch size {batch_size}: give 1 or more")
        self.lm = make_batched_lm(target, vocab, compile, slack=slack, rows_hint=batch_size, on_compile=on_compile)
        self.vocab = vocab
        self.eos_ids = eos_ids
        self.batch_size = batch_size
        self.context_length = context_length
        self.output_device = head_device(target)
        self.drafter: BatchDrafter | None = None
        if drafter is not None and k != 0:
            self.drafter = batch_drafter(drafter, vocab=vocab, device=self.lm.device, slack=slack, compile=compile,
                                         rows=batch_size, on_compile=on_compile)
            if self.drafter.feature_layers:
                self.lm.want_features(self.drafter.feature_layers)
        self.k = k if self.drafter is not None and isinstance(k, int) else 0  # the k of every step, unless chosen
        self.chooser: GoodputK | None = None
        if self.drafter is not None and not isinstance(k, int):
            self.chooser = k if isinstance(k, GoodputK) else GoodputK(clock=lambda: device_clock(self.lm.device))
            self.chooser.overhead = self.draft_overhead  # a GoodputK from an earlier run reads this run's
        self.prompt_tokens = 0  # of the rows admitted so far, and the tokens they emitted or may emit
        self.budget_tokens = 0

    def draft_overhead(self) -> float:
        """Seconds that drafting costs per committed token outside its steps' usual figure: the draft
        reads each joining row's prompt (its seconds a token so far) and rows bring prompt_tokens for
        every budget_tokens they emit (what finished rows emitted, what running rows may: rows that
        stop early bring more prompt a token, and the figure learns it as they finish)."""
        drafter = self.drafter
        if drafter is None or not drafter.catch_up_tokens or not self.budget_tokens:
            return 0.0
        return drafter.catch_up_seconds / drafter.catch_up_tokens * self.prompt_tokens / self.budget_tokens

    def run(self, requests: Iterable[Request | tuple]) -> Iterator[tuple[Hashable, Finished]]:
        """(key, Finished) for each request, in the order they finish. Requests are read as slots
        free up; each is (key, prompt_ids, max_new_tokens, sampling, seed[, stop]). A prompt with
        no tokens, or one that fills the context, raises ContextLengthError: check them first
        (engine.token_limit) to keep the others running."""
        pending = iter(requests)
        rows: list[Row] = []
        full = 0  # the rows of the run's first step: k: auto measures only steps as full, and not
        # the first (the slowest of a run's plain steps, 10-30% above the next: it stood first in
        # every first round, against plain decoding)
        self.warmup()
        try:
            while True:
                while len(rows) < self.batch_size and (request := next(pending, None)) is not None:
                    rows.append(self._admit(Request(*request)))
                if not rows:
                    return
                self._step(rows, measured=bool(full) and len(rows) >= full)
                full = full or len(rows)
                done = [row for row in rows if row.finish is not None]
                if done:
                    keep = [b for b, row in enumerate(rows) if row.finish is None]
                    rows = [rows[b] for b in keep]
                    self._remove(keep)
                    for row in done:
                        self.budget_tokens -= row.limit - len(row.generated)
                        yield row.key, Finished(tuple(row.generated), row.finish, row.stats)
        finally:
            self._remove([])  # a closed run leaves empty caches

    def warmup(self) -> float:
        """Compile ahead every step this decoder runs (none when eager), so that no row's timing
        (nor k: auto's goodput) counts a compile; seconds spent."""
        if self.drafter is None:
            return self.lm.warmup((1,))
        return self.lm.warmup((1, 2)) + self.drafter.warmup()

    def _admit(self, request: Request) -> Row:
        """Prefill a new row alone and put it at the bottom of the batch."""
        ids = torch.as_tensor(list(request.prompt_ids), dtype=torch.long)
        if ids.numel() == 0:
            raise ContextLengthError("the prompt has no tokens")
        limit = token_limit(self.context_length, ids.numel(), request.max_new_tokens)
        self.prompt_tokens += int(ids.numel())
        self.budget_tokens += limit
        sampling = request.sampling
        noise = None if sampling.greedy else PositionNoise(request.seed, self.vocab, self.output_device)
        stats = DecodeStats(k="auto", k_limit=self.chooser.k_max) if self.chooser else DecodeStats(k=self.k, k_limit=self.k)
        started = device_clock(self.lm.device)
        self.lm.add_row(ids[:-1])
        if self.drafter is not None:
            self.drafter.add(ids.to(self.lm.device), sampling, noise, self.lm.prefill_features)
        stats.observe(Prefilled(int(ids.numel()), device_clock(self.lm.device) - started))
        return Row(request, limit, noise, stats)

    def _remove(self, keep: list[int]) -> None:
        self.lm.remove_rows(keep)
        if self.drafter is not None:
            self.drafter.remove(keep)

    def _step(self, rows: list[Row], measured: bool = True) -> None:
        """One draft -> verify -> commit over every row; `measured`: whether k: auto counts the step."""
        k = self.chooser.next_k(measured) if self.chooser else self.k
        read_before = self.drafter.catch_up_seconds if self.drafter is not None else 0.0
        started = time.perf_counter()
        for row in rows:
            if row.noise is not None:
                row.noise.move_to(len(row.generated))
        # 2. draft: each row a chain of up to k, never past what it may still emit
        rooms = [max(0, min(k, row.room)) for row in rows]
        drafts = self.drafter.propose(rooms) if self.drafter is not None else [None] * len(rows)
        drafted_at = time.perf_counter()
        # 3. verify: ONE target forward over every row's last token and drafts
        mark = self.lm.width
        results = self._verify(rows, drafts)
        verified_at = time.perf_counter()
        # 4. commit: each row emits its accepted drafts and the target's token; caches keep them
        emitted = self._commit(rows, results, mark)
        if self.chooser:  # the draft's reads of missed tokens are charged by draft_overhead instead
            self.chooser.record(sum(len(tokens) for tokens in emitted), self.drafter.catch_up_seconds - read_before)
        timings = dict(seconds=time.perf_counter() - started, draft_seconds=drafted_at - started,
                       verify_seconds=verified_at - drafted_at)
        for row, draft, (n, token, drafted), tokens in zip(rows, drafts, results, emitted):
            row.stats.observe(SpeculativeDecoder.step_event(draft, drafted, list(range(n)), token, tokens, **timings))
            row.stats.draft_seconds += timings["draft_seconds"]
            row.stats.verify_seconds += timings["verify_seconds"]

    def _commit(self, rows: list[Row], results: list[tuple[int, int, list[int]]], mark: int) -> list[list[int]]:
        """Each row's tokens of this step (cut at EOS, its limit or a stop text); the target's cache
        keeps each row's fed token and accepted drafts (from column `mark` on), the drafter's the same."""
        emitted = []
        for row, (n, token, drafted) in zip(rows, results):
            tokens, row.finish = cut_at_stop(drafted[:n] + [token], len(row.generated), row.limit, self.eos_ids,
                                             row.stop, row.generated)
            row.generated.extend(tokens)
            row.pending = tokens[-1] if tokens else row.pending
            emitted.append(tokens)
        self.lm.keep_new([1 + n for n, _, _ in results], mark)
        if self.drafter is not None:
            features = None
            if self.drafter.feature_layers:  # each row's fed token's and kept drafts' (as the batch-1 engine)
                features = [self.lm.features[b, : 1 + min(n, len(tokens))] for b, ((n, _, _), tokens)
                            in enumerate(zip(results, emitted))]
            self.drafter.accept(emitted, [n for n, _, _ in results], features)
        return emitted

    def _verify(self, rows: list[Row], drafts: list[Draft | None]) -> list[tuple[int, int, list[int]]]:
        """The batch's forward, then per row the target's choices and the acceptance rule;
        per row (n accepted, next token, drafted ids), read back in one transfer."""
        sizes = [len(d) if d is not None else 0 for d in drafts]
        width = 1 + max(sizes)
        ids = torch.zeros(len(rows), width, dtype=torch.long, device=self.lm.device)
        ids[:, 0] = torch.tensor([row.pending for row in rows])
        for b, draft in enumerate(drafts):
            if draft is not None:
                ids[b, 1 : 1 + sizes[b]] = draft.token_ids
        real = torch.arange(width)[None, :] <= torch.tensor(sizes)[:, None]
        logits = self.lm.forward(ids, real)
        outcomes = []
        for b, row in enumerate(rows):
            m = sizes[b]
            noise = None if row.noise is None else row.noise.ahead(list(range(1, m + 2)))
            n, _, token = accept(ids[b, 1 : 1 + m].to(logits.device), chain_parents(m), choose(logits[b, : m + 1], row.sampling, noise))
            outcomes.append(torch.stack([n, token]))
        # the step's one device -> host transfer
        values = torch.cat([torch.stack(outcomes).view(-1), ids[:, 1:].reshape(-1).to(logits.device)]).tolist()
        pairs, drafted = values[: 2 * len(rows)], values[2 * len(rows) :]
        return [
            (pairs[2 * b], pairs[2 * b + 1], drafted[b * (width - 1) : b * (width - 1) + sizes[b]])
            for b in range(len(rows))
        ]
