"""Plain decoding against specdec at several batch sizes: where does drafting stop paying?

A batch shares each target forward, so the target's spare capacity that speculation feeds on is
the capacity the batch uses: the speedup narrows as the batch grows, and can reverse.

At each batch size B every method decodes the same requests: the bench's P prompts in order,
cycled (request i is prompt i mod P, with seed + i) up to ceil(P / B) * B requests, so that every
prompt runs at least once and the batch starts full (a finished row's slot takes the next request).
Batch size 1 runs the usual decoder (SpeculativeDecoder, as bench does); above it BatchedDecoder,
with the profile's drafter at each k asked for, and with no drafter for plain decoding. A profile
with `k: auto` runs as generate runs it (BatchMethod, AUTO) against plain decoding; tune-k
--batch-sizes measures each fixed k.

Timing: every run is the whole set of requests, prefills included, from the first request in to
the last token out (device synced): total tokens/s = every row's new tokens over that time. At each
batch size, first an untimed warm-up of every method (the first calls of each kernel and batch
shape), then the repeats interleaved (plain, k1, k2, ..., plain, k1, ...), each run paired with
plain's run of the same repeat (paired.py), whose bound marks figures no decoding can give.
The k chosen at a batch size is the one with the best goodput (tokens/s) whose figure is not
marked; the crossover is the smallest batch size where that k is no faster than plain decoding.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..api import Pipeline
from ..decoding.batched import BatchedDecoder, Request
from ..decoding.events import Finished
from ..decoding.stats import DecodeStats
from ..models.devices import dtype_name
from ..specs import SamplingSpec
from . import engine_methods  # synced_clock looked up at run time, so that a test clock can take its place
from .divergence import describe_divergence
from .local import machine_info
from .options import BenchSettings
from .paired import TIE, PairedRatios, pair_runs, speedup_fields
from .workload import BenchPrompt

AUTO = "auto"  # the method that runs the profile's k: auto, beside those fixed ks
WARMUP_TOKENS = 8


def label(k: int | str) -> str:
    return "plain" if k == 0 else f"k={k}"


def batch_requests(prompts: Sequence[list[int]], batch_size: int) -> list[list[int]]:
    """The prompts cycled to ceil(P / B) * B requests: each at least once, the batch full at the start."""
    count = math.ceil(len(prompts) / batch_size) * batch_size
    return [prompts[i % len(prompts)] for i in range(count)]


@dataclass
class BatchRun:
    """One method's pass over every request at one batch size (a paired.TimedRun)."""

    method: str
    prompt: BenchPrompt  # the batch size as pairing's key: runs pair by batch size and repeat
    repeat: int
    token_ids: list[tuple[int, ...]]
    stats: list[DecodeStats]
    seconds: float

    @property
    def new_tokens(self) -> int:
        return sum(len(ids) for ids in self.token_ids)

    @property
    def tokens_per_second(self) -> float | None:
        return self.new_tokens / self.seconds if self.seconds > 0 and self.new_tokens else None

    @property
    def row_tokens_per_second(self) -> float | None:
        """Each row's own decode speed (its tokens over the steps it was in), averaged over rows."""
        rates = [s.tokens_per_second for s in self.stats if s.tokens_per_second]
        return statistics.mean(rates) if rates else None


class BatchMethod:
    """Plain decoding (k 0), specdec at k, or (AUTO) the profile's `k: auto` as generate runs it at
    this batch size: at 1 the adaptive k, above it k chosen by goodput (0 included), learning from
    one run to the next at this size as a pipeline does."""

    def __init__(self, pipeline: Pipeline, k: int | str, batch_size: int):
        self.pipeline = pipeline
        self.name = label(k)
        self.batch_size = batch_size
        if batch_size == 1:  # the usual decoder, as bench runs it
            # fixed ks measure chains; AUTO runs the profile's k: auto (its tree, where it has one)
            self.decoder = pipeline.decoder(drafter=None) if k == 0 else pipeline.decoder(k=k, tree="profile" if k == AUTO else None)
        elif k == AUTO:
            self.decoder = pipeline.batched_decoder(batch_size)
        else:
            make = None if k == 0 else (lambda: pipeline.make_drafter(pipeline.profile.drafter))
            self.decoder = BatchedDecoder(pipeline.target, make, vocab=pipeline.vocab, eos_ids=pipeline.eos_ids,
                                          k=k, batch_size=batch_size, context_length=pipeline.context_length,
                                          compile=pipeline.compile, on_compile=pipeline.announce_compiling)

    def run(self, requests: Sequence[list[int]], max_new_tokens: int, sampling: SamplingSpec,
            seed: int) -> list[Finished]:
        """Every request's Finished, in request order; request i draws with seed + i. Prompt lookup
        searches this run's requests alone (none reads an earlier repeat's answer)."""
        self.pipeline.lookup_pool.clear()
        if self.batch_size == 1:
            return [[e for e in self.decoder.stream(ids, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed + i)
                     if isinstance(e, Finished)][-1] for i, ids in enumerate(requests)]
        done = dict(self.decoder.run(Request(i, ids, max_new_tokens, sampling, seed + i) for i, ids in enumerate(requests)))
        return [done[i] for i in range(len(requests))]


@dataclass
class BatchBench:
    """The runs of every method at every batch size, and what they say."""

    pipeline: Pipeline
    prompts: list[BenchPrompt]
    settings: BenchSettings
    batch_sizes: list[int]
    ks: list[int]
    auto: bool = False  # run the profile's k: auto (AUTO) instead of fixed ks
    results: list[BatchRun] = field(default_factory=list)
    finished_sizes: list[int] = field(default_factory=list)

    def run(self, on_progress: Callable[[str], None] | None = None) -> None:
        s = self.settings
        clock = engine_methods.synced_clock(self.pipeline.device)
        encoded = [self.pipeline.encode(p.text) for p in self.prompts]
        for size in self.batch_sizes:
            methods = [BatchMethod(self.pipeline, k, size) for k in self.method_ks]
            requests = batch_requests(encoded, size)
            for _ in range(1 + s.warmup):  # untimed: first calls at this batch shape
                for method in methods:
                    method.run(requests[:size], min(WARMUP_TOKENS, s.max_new_tokens), s.sampling, s.seed)
            key = BenchPrompt(f"batch={size}", "")
            for repeat in range(s.repeats):
                for method in methods:  # interleaved: plain k1 k2 ... plain k1 k2 ...
                    started = clock()
                    finished = method.run(requests, s.max_new_tokens, s.sampling, s.seed)
                    seconds = clock() - started
                    self.results.append(BatchRun(method.name, key, repeat, [f.token_ids for f in finished],
                                                 [f.stats for f in finished], seconds))
                    if on_progress:
                        on_progress(f"batch {size} · {method.name}")
            self.finished_sizes.append(size)

    @property
    def method_ks(self) -> list[int | str]:
        return [0, AUTO] if self.auto else [0, *self.ks]

    # --- aggregation
    def runs(self, size: int, name: str) -> list[BatchRun]:
        return [r for r in self.results if r.prompt.id == f"batch={size}" and r.method == name]

    def paired(self, size: int, name: str, reference: str) -> PairedRatios:
        return pair_runs(self.runs(size, name), self.runs(size, reference))

    def method_row(self, size: int, k: int | str) -> dict[str, Any]:
        runs = self.runs(size, label(k))
        stats = [s for r in runs for s in r.stats]
        drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
        forwards = sum(s.target_forwards for s in stats)
        tau = sum(s.new_tokens for s in stats) / forwards if forwards else None
        rates = [r.tokens_per_second for r in runs if r.tokens_per_second]
        row_rates = [r.row_tokens_per_second for r in runs if r.row_tokens_per_second]
        row: dict[str, Any] = {
            "k": k,
            "tokens_per_second": statistics.median(rates) if rates else None,
            "row_tokens_per_second": statistics.median(row_rates) if row_rates else None,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_length": tau,
        }
        if k:
            row.update(speedup_fields(self.paired(size, label(k), "plain"), tau))
        return row

    def chosen(self, rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
        """The k with the best goodput whose figure can be taken at its word (the smaller on a tie)."""
        ranked = [r for r in rows if r["speedup"] and not r["speedup_flags"]]
        if not ranked:
            return None
        top = max(r["speedup"] for r in ranked)
        return min((r for r in ranked if r["speedup"] >= top * (1 - TIE)), key=lambda r: r["k"])

    def verdict(self, size: int, rows: Sequence[dict[str, Any]], spec: dict[str, Any] | None) -> dict[str, Any]:
        """The best k at this batch size, 0 where plain decoding wins, and whether it beat the runner-up
        (the next fastest of plain and the ranked ks) outside the noise, as tune-k judges its winner."""
        if spec is None:  # no k's figure can be ranked: nor can plain's against them
            return {"k": None, "against": None, "outside_noise": False}
        best = 0 if spec["speedup"] <= 1.0 else spec["k"]
        others = [{"k": 0, "speedup": 1.0}] + [r for r in rows if r["speedup"] and not r["speedup_flags"]]
        against = label(max((r for r in others if r["k"] != best), key=lambda r: r["speedup"])["k"])
        paired = pair_runs(self.runs(size, label(best)), self.runs(size, against))
        return {"k": best, "against": against, "outside_noise": paired.outside_noise(), **paired.describe()}

    def size_summary(self, size: int) -> dict[str, Any]:
        plain = self.method_row(size, 0)
        if self.auto:
            return self.auto_summary(size, plain)
        rows = [self.method_row(size, k) for k in self.ks]
        spec = self.chosen(rows)
        shown = spec or max(rows, key=lambda r: r["tokens_per_second"] or 0.0)  # marked, so never ranked
        verdict = self.verdict(size, rows, spec)
        return {
            "batch_size": size,
            "requests": len(batch_requests(self.prompts, size)),
            "plain": plain,
            "specdec": shown,
            "k": spec["k"] if spec else None,
            "best_k": verdict["k"],
            "recommended_k": verdict["k"] if verdict["outside_noise"] else None,
            "verdict": verdict,
            "ks": rows,
        }

    def auto_summary(self, size: int, plain: dict[str, Any]) -> dict[str, Any]:
        """Plain against the profile's k: auto: ranked unless its figure is marked; no best k of
        its own (k changes from step to step: tune-k --batch-sizes measures each k)."""
        auto = self.method_row(size, AUTO)
        ranked = bool(auto["speedup"]) and not auto["speedup_flags"]
        return {"batch_size": size, "requests": len(batch_requests(self.prompts, size)), "plain": plain,
                "specdec": auto, "k": AUTO if ranked else None, "best_k": None, "recommended_k": None,
                "verdict": None, "ks": [auto]}

    def differences(self) -> list[dict[str, Any]]:
        """At temperature 0, each request of every run against plain decoding's at the same batch size."""
        if not self.settings.sampling.greedy:
            return []
        encoded = [self.pipeline.encode(p.text) for p in self.prompts]
        found = []
        for size in self.finished_sizes:
            reference = self.runs(size, "plain")[0].token_ids
            for run in self.results:
                if run.prompt.id != f"batch={size}":
                    continue
                for i, (ids, expected) in enumerate(zip(run.token_ids, reference)):
                    if ids != expected:
                        prompt = self.prompts[i % len(self.prompts)]
                        divergence = describe_divergence(self.pipeline.target, encoded[i % len(encoded)], expected, ids)
                        found.append({"prompt": prompt.id, "category": prompt.category, "batch_size": size,
                                      "method": f"batch={size} {run.method}", "repeat": run.repeat,
                                      **divergence.to_dict()})
        return found

    def summary(self) -> dict[str, Any]:
        sizes = [self.size_summary(size) for size in self.finished_sizes]
        differences = self.differences()
        s = self.settings
        return {
            "profile": self.pipeline.profile.name,
            "machine": machine_info(self.pipeline),
            "settings": {
                "prompts": len(self.prompts),
                "max_new_tokens": s.max_new_tokens,
                "repeats": s.repeats,
                "warmup": s.warmup,
                "k": s.k,
                "ks": self.ks,
                "k_auto": self.auto,
                "batch_sizes": self.batch_sizes,
                "temperature": s.sampling.temperature,
                "top_k": s.sampling.top_k,
                "top_p": s.sampling.top_p,
                "seed": s.seed,
                "drafter": self.pipeline.profile.drafter.describe(),
                "compile": self.pipeline.compile,
            },
            "dtype": dtype_name(next(self.pipeline.target.parameters()).dtype),
            "batch_sizes": sizes,
            "crossover_batch_size": crossover(sizes),
            "k_by_batch_size": k_table(sizes, recommended_only=False),
            "outputs_identical": not differences if s.sampling.greedy else None,
            "differences": differences,
        }


def crossover(sizes: Sequence[dict[str, Any]]) -> int | None:
    """The smallest batch size where the chosen k is no faster than plain decoding (None: it paid at
    every batch size measured, or no figure there could be ranked)."""
    for size in sizes:
        if size["k"] is not None and size["specdec"]["speedup"] <= 1.0:
            return size["batch_size"]
    return None


def k_table(sizes: Sequence[dict[str, Any]], recommended_only: bool = True) -> dict[int, int] | None:
    """The best k per batch size as 'from this batch size up' (a k repeating the one before is left
    out); None when a batch size has no k to give (`recommended_only`: none outside the noise)."""
    table: dict[int, int] = {}
    for size in sizes:
        k = size["recommended_k"] if recommended_only else size["best_k"]
        if k is None:
            return None
        if not table or list(table.values())[-1] != k:
            table[size["batch_size"]] = k
    return table or None


def run_batches(pipeline: Pipeline, prompts: list[BenchPrompt], settings: BenchSettings, batch_sizes: list[int],
                ks: Sequence[int], on_progress: Callable[[str], None] | None = None,
                holder: list | None = None, auto: bool = False) -> BatchBench:
    """`auto`: plain against the profile's k: auto at each batch size (BatchMethod), not `ks`."""
    bench = BatchBench(pipeline, prompts, settings, batch_sizes, list(ks), auto)
    if holder is not None:  # lets the caller report the batch sizes that finished after Ctrl-C
        holder.append(bench)
    bench.run(on_progress)
    return bench


def plot_batches(summary: dict[str, Any], path: Path) -> None:
    """Total tokens/s against batch size, plain and specdec (at the k chosen per batch size)."""
    from .tune import require_plotting, save_figure

    require_plotting()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = summary["batch_sizes"]
    xs = [s["batch_size"] for s in sizes]
    figure, axis = plt.subplots(figsize=(6, 4))
    axis.plot(xs, [s["plain"]["tokens_per_second"] for s in sizes], "o-", label="plain")
    chosen = "k: auto" if summary["settings"]["k_auto"] else "k chosen per batch size"
    axis.plot(xs, [s["specdec"]["tokens_per_second"] for s in sizes], "s-", label=f"specdec ({chosen})")
    if summary["crossover_batch_size"] is not None:
        axis.axvline(summary["crossover_batch_size"], color="gray", linestyle=":", label="crossover")
    axis.set_xscale("log", base=2)
    axis.set_xticks(xs, [str(x) for x in xs])
    axis.set_xlabel("batch size")
    axis.set_ylabel("total tokens/s")
    axis.set_title(f"{summary['profile']}: throughput by batch size")
    axis.legend()
    save_figure(figure, path)
