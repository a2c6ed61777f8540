"""`specdec bench --endpoint URL`: a running OpenAI-compatible server's speed and speculation.

The same prompts go through `/v1/chat/completions` (or `/v1/completions`), streamed, one request at
a time unless `--concurrency N`. Per request: TTFT (until the first content chunk) and the decode
rate after it, (completion tokens - 1) / (last chunk - first chunk), the same split as a local bench.
With `--baseline-endpoint` (the same model served without speculation) each prompt's rate is paired
with the baseline's: speedup = median over prompts of endpoint rate / baseline rate.

Speculation comes from the server's own counters (serving/wire.py reads each engine's), in this
order of preference:
- Prometheus `/metrics` (vLLM, and llama.cpp with `--metrics`), read before and after (after every
  request at concurrency 1, so each prompt has its own difference) and subtracted;
- per response: llama.cpp's `timings`, or vLLM's `speculative_decoding_stats`;
- SGLang's `meta_info.spec_verify_ct` (verify passes): SGLang refuses `return_meta_info` on a
  streamed request, so after each timed request an untimed non-streaming copy of it asks for it.
A server with none of these still gets its speed measured; acceptance is then reported unknown.

Derived as for a local run: acceptance = accepted drafts / drafted tokens; tau (mean accepted length)
= tokens per target forward = completion tokens / (completion tokens - accepted drafts), every
forward emitting one token of the target's own (SGLang: completion tokens / spec_verify_ct);
per-position acceptance i = drafts whose token i was kept / drafts.

The HTTP side (settings, client, probe, one streamed request) is serving/endpoint_client.py.
"""

from __future__ import annotations

import queue
import statistics
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..serving.endpoint_client import Client, EndpointSettings, Server, sglang_meta, stream_once
from ..serving.wire import SpecCounters
from .paired import InterleavedRuns, PairedRatios, speedup_fields
from .workload import BenchPrompt

ENDPOINT_NAME, BASELINE_NAME = "endpoint", "baseline"


@dataclass
class RunResult:
    """One prompt through one server: its timings and whatever speculation counts the server gave."""

    method: str  # the server's role, endpoint or baseline (the report's row name, as a local bench's method)
    prompt: BenchPrompt
    repeat: int
    text: str
    completion_tokens: int
    tokens_from: str  # usage, timings or chunks
    ttft_seconds: float
    total_seconds: float
    first_at: float
    last_at: float
    finish_reason: str | None = None
    drafted: int | None = None  # per-response counts: llama.cpp timings, vLLM speculative_decoding_stats
    accepted: int | None = None
    drafted_from: str | None = None
    verify_steps: int | None = None  # SGLang meta_info
    sglang_accepted: int | None = None
    sglang_drafted: int | None = None
    counters: SpecCounters | None = None  # /metrics difference over this request (concurrency 1)

    @property
    def decode_tokens(self) -> int:
        return self.completion_tokens - 1

    @property
    def decode_seconds(self) -> float:
        return self.last_at - self.first_at

    @property
    def tokens_per_second(self) -> float | None:
        seconds = self.decode_seconds
        return self.decode_tokens / seconds if self.decode_tokens > 0 and seconds > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.method, "prompt": self.prompt.id, "category": self.prompt.category, "repeat": self.repeat,
            "completion_tokens": self.completion_tokens, "tokens_from": self.tokens_from,
            "ttft_seconds": self.ttft_seconds, "total_seconds": self.total_seconds,
            "tokens_per_second": self.tokens_per_second, "finish_reason": self.finish_reason,
            "drafted": self.drafted, "accepted": self.accepted, "drafted_from": self.drafted_from,
            "verify_steps": self.verify_steps,
            "counters": self.counters.to_dict() if self.counters else None,
        }


def total_rate(runs: Sequence[RunResult]) -> float | None:
    """What the server delivered to all clients together: each repeat's tokens over the span from
    its first request sent to its last answer done (the median over repeats); at concurrency 1 about
    the per-request rate, above it the throughput the requests in flight shared."""
    rates = []
    for repeat in sorted({r.repeat for r in runs}):
        batch = [r for r in runs if r.repeat == repeat]
        start = min(r.first_at - r.ttft_seconds for r in batch)
        end = max(r.first_at - r.ttft_seconds + r.total_seconds for r in batch)
        if end > start:
            rates.append(sum(r.completion_tokens for r in batch) / (end - start))
    return statistics.median(rates) if rates else None


# --------------------------------------------------------------------------- the run


@dataclass
class EndpointBench(InterleavedRuns):
    client: Client
    endpoint: Server
    baseline: Server | None
    prompts: list[BenchPrompt]
    settings: EndpointSettings
    notes: list[str] = field(default_factory=list)
    results: list[RunResult] = field(default_factory=list)
    run_counters: SpecCounters | None = None  # whole-run /metrics difference (concurrency > 1)
    _last_reading: SpecCounters | None = None

    @property
    def servers(self) -> list[Server]:
        return [self.endpoint] + ([self.baseline] if self.baseline else [])

    @property
    def total_runs(self) -> int:
        return len(self.prompts) * self.settings.repeats * len(self.servers)

    def run(self, on_progress: Callable[[str], None] | None = None) -> None:
        s = self.settings
        for _ in range(s.warmup):  # untimed: connections, caches, CUDA graphs; not recorded
            for server in self.servers:
                stream_once(self.client, server, self.prompts[0].text, s, min(16, s.max_new_tokens))
        if self.endpoint.metrics:
            self._last_reading = self.client.read_metrics(self.endpoint.url).counters
        start_counters = self._last_reading
        interrupted = False
        try:
            if s.concurrency == 1:
                for prompt in self.prompts:
                    for repeat in range(s.repeats):
                        for server in self.servers:  # interleaved per prompt, never two servers at once
                            self.results.append(self.run_one(server, prompt, repeat))
                            if on_progress:
                                on_progress(f"{prompt.id} · {server.role}")
            else:
                for server in self.servers:  # one server at a time, N requests in flight
                    for repeat in range(s.repeats):
                        self.run_concurrently(server, repeat, on_progress)
        except KeyboardInterrupt:
            interrupted = True  # no more requests, not even to /metrics: Ctrl-C means now
            raise
        finally:
            if not interrupted and s.concurrency > 1 and self.endpoint.metrics and start_counters is not None:
                after = self.client.read_metrics(self.endpoint.url).counters
                if after is not None:
                    self.run_counters = after.minus(start_counters)

    def run_one(self, server: Server, prompt: BenchPrompt, repeat: int) -> RunResult:
        s = self.settings
        measured = stream_once(self.client, server, prompt.text, s, s.max_new_tokens)
        if server.engine == "sglang" and server is self.endpoint and "verify_steps" not in measured:
            measured.update(sglang_meta(self.client, server, prompt.text, s, s.max_new_tokens))
        result = RunResult(server.role, prompt, repeat, **measured)
        if server is self.endpoint and server.metrics and s.concurrency == 1:
            now = self.client.read_metrics(server.url).counters
            if now is not None and self._last_reading is not None:
                result.counters = now.minus(self._last_reading)
            self._last_reading = now
        return result

    def run_concurrently(self, server: Server, repeat: int, on_progress: Callable[[str], None] | None) -> None:
        """Every prompt through one server, `concurrency` requests at a time, on daemon threads (so
        that Ctrl-C is never held up by a request still streaming); the first failure stops the rest."""
        jobs: queue.Queue = queue.Queue()
        for prompt in self.prompts:
            jobs.put(prompt)
        done: queue.Queue = queue.Queue()
        stop = threading.Event()

        def work() -> None:
            while not stop.is_set():
                try:
                    prompt = jobs.get_nowait()
                except queue.Empty:
                    return
                try:
                    done.put(("ok", self.run_one(server, prompt, repeat)))
                except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                    done.put(("error", exc))
                    return

        threads = [threading.Thread(target=work, daemon=True, name=f"specdec-endpoint-{i}")
                   for i in range(min(self.settings.concurrency, len(self.prompts)))]
        for thread in threads:
            thread.start()
        try:
            remaining = len(self.prompts)
            while remaining:
                try:
                    status, value = done.get(timeout=0.1)
                except queue.Empty:
                    if not any(t.is_alive() for t in threads) and done.empty():
                        break
                    continue
                if status == "error":
                    raise value
                remaining -= 1
                self.results.append(value)
                if on_progress:
                    on_progress(f"{value.prompt.id} · {server.role}")
        finally:
            stop.set()

    # --- aggregation
    def runs_per_repeat(self) -> int:
        return len(self.servers)

    def baseline_pairs(self, method: str, prompts: Sequence[BenchPrompt]) -> PairedRatios:
        """Each run against the baseline's run of the same prompt and repeat (none without a baseline)."""
        if self.baseline is None:
            return PairedRatios()
        return self.paired(method, BASELINE_NAME, prompts)

    def speculation(self, prompts: Sequence[BenchPrompt], whole_run: bool) -> dict[str, Any]:
        """Drafted / accepted counts over these prompts' endpoint runs, from the best source there is."""
        runs = self.runs(ENDPOINT_NAME, prompts)
        tokens = sum(r.completion_tokens for r in runs)
        engine = self.endpoint.engine
        result: dict[str, Any] = {"source": None, "acceptance_rate": None, "mean_accepted_length": None,
                                  "target_forwards": None, "per_position_acceptance": None, "counters": None}
        counters = None
        if runs and all(r.counters is not None for r in runs):
            counters = SpecCounters()
            for r in runs:
                counters = counters.plus(r.counters)
        elif whole_run and self.run_counters is not None:
            counters = self.run_counters
        if counters is not None:
            result["source"] = f"{engine} /metrics" if engine != "unknown" else "/metrics"
            result["counters"] = counters.to_dict()
            result["acceptance_rate"] = counters.accepted / counters.draft_tokens if counters.draft_tokens else None
            if counters.drafts:
                result["per_position_acceptance"] = [counters.per_position[p] / counters.drafts
                                                     for p in sorted(counters.per_position)]
            accepted = counters.accepted
        elif runs and all(r.drafted is not None for r in runs):
            drafted, accepted = sum(r.drafted for r in runs), sum(r.accepted for r in runs)
            result["source"] = " + ".join(sorted({r.drafted_from for r in runs if r.drafted_from}))
            result["counters"] = {"draft_tokens": drafted, "accepted_tokens": accepted}
            result["acceptance_rate"] = accepted / drafted if drafted else None
        elif runs and all(r.verify_steps is not None for r in runs):
            steps = sum(r.verify_steps for r in runs)
            result["source"] = "sglang meta_info"
            result["counters"] = {"verify_steps": steps}
            if all(r.sglang_drafted is not None for r in runs):
                drafted, accepted = sum(r.sglang_drafted for r in runs), sum(r.sglang_accepted for r in runs)
                result["counters"] |= {"draft_tokens": drafted, "accepted_tokens": accepted}
                result["acceptance_rate"] = accepted / drafted if drafted else None
            if steps:
                result["mean_accepted_length"] = tokens / steps
                result["target_forwards"] = steps / len(runs)
            return result
        else:
            return result
        forwards = tokens - accepted
        if forwards > 0:
            result["mean_accepted_length"] = tokens / forwards
            result["target_forwards"] = forwards / len(runs)
        return result

    def target_summary(self, target: str, prompts: Sequence[BenchPrompt], whole_run: bool) -> dict[str, Any]:
        rates = [rate for prompt in prompts if (rate := self.prompt_rate(target, prompt))]
        runs = self.runs(target, prompts)
        row: dict[str, Any] = {
            "method": target,
            "tokens_per_second": statistics.median(rates) if rates else None,
            **speedup_fields(self.baseline_pairs(target, prompts), None),
            "acceptance_rate": None,
            "mean_accepted_length": None,
            "target_forwards": None,
            "ttft_seconds": statistics.median([r.ttft_seconds for r in runs]) if runs else None,
            "new_tokens": statistics.mean([r.completion_tokens for r in runs]) if runs else None,
            "total_tokens_per_second": total_rate(runs),
            "prompts": len(prompts),
        }
        if target == ENDPOINT_NAME:
            spec = self.speculation(prompts, whole_run)
            row.update(acceptance_rate=spec["acceptance_rate"], mean_accepted_length=spec["mean_accepted_length"],
                       target_forwards=spec["target_forwards"])
            row["per_position_acceptance"] = spec["per_position_acceptance"]
            row["speculation_source"] = spec["source"]
            row["speculation_counters"] = spec["counters"]
            # the same model served without speculation: its tau bounds the speedup as it does locally
            row.update(speedup_fields(self.baseline_pairs(target, prompts), spec["mean_accepted_length"]))
        return row

    def differences(self, prompts: Sequence[BenchPrompt]) -> list[dict[str, Any]]:
        """At temperature 0 with a baseline: prompts whose text differs from the baseline's."""
        found = []
        for prompt in prompts:
            reference = next((r for r in self.runs(BASELINE_NAME, [prompt])), None)
            if reference is None:
                continue
            for r in self.runs(ENDPOINT_NAME, [prompt]):
                if r.text != reference.text:
                    position = next((i for i, (a, b) in enumerate(zip(r.text, reference.text)) if a != b),
                                    min(len(r.text), len(reference.text)))
                    found.append({"prompt": prompt.id, "category": prompt.category, "repeat": r.repeat,
                                  "character": position})
                    break
        return found

    def summary(self, profile_name: str | None) -> dict[str, Any]:
        """The report. profile_name: the profile whose sampling settings the requests carried, or None
        when they are the defaults (greedy, no top-k/top-p): a server's model and speculation are its own."""
        prompts = self.complete_prompts()
        targets = ([BASELINE_NAME] if self.baseline else []) + [ENDPOINT_NAME]
        results = [self.target_summary(t, prompts, whole_run=True) for t in targets]
        categories = sorted({p.category for p in prompts if p.category})
        if categories:
            for row in results:
                row["per_category"] = {
                    c: self.target_summary(row["method"], [p for p in prompts if p.category == c], whole_run=False)
                    for c in categories
                }
        endpoint_row = results[-1]
        notes = list(self.notes)
        if endpoint_row["speculation_source"] is None:
            notes.append(f"acceptance unknown: {self.endpoint.url} gave no speculation counters (no spec_decode_* "
                         "in /metrics, no timings.draft_n, no speculative_decoding_stats, no meta_info.spec_verify_ct); "
                         "speed only")
        elif endpoint_row["speculation_source"].endswith("/metrics"):
            notes.append("the /metrics counters include any other traffic the server had during the run")
        counted = endpoint_row.get("speculation_counters") or {}
        if counted.get("draft_tokens") == 0:
            note = f"{self.endpoint.url} drafted no tokens during the run: is speculation on for this model?"
            if endpoint_row["speculation_source"] == "llama.cpp timings":
                note += (" (llama.cpp writes timings.draft_n only for a request that drafted; builds older than "
                         "its PR #12603, 2025, never write it)")
            notes.append(note)
        if any(r.tokens_from == "chunks" for r in self.results):
            notes.append("some responses carried no usage: their token counts are streamed chunks, which "
                         "undercounts when a chunk carries several tokens")
        greedy = self.settings.sampling.greedy
        differences = self.differences(prompts) if greedy and self.baseline else []
        s = self.settings
        return {
            "profile": profile_name,
            "endpoint": self.endpoint.describe(),
            "baseline_endpoint": self.baseline.describe() if self.baseline else None,
            "settings": {
                "prompts": len(prompts),
                "prompts_planned": len(self.prompts),
                "max_new_tokens": s.max_new_tokens,
                "repeats": s.repeats,
                "warmup": s.warmup,
                "temperature": s.sampling.temperature,
                "top_k": s.sampling.top_k,
                "top_p": s.sampling.top_p,
                "seed": s.seed,
                "api": s.api,
                "concurrency": s.concurrency,
                "timeout_seconds": s.timeout,
            },
            "outputs_identical": (not differences) if greedy and self.baseline else None,
            "differences": differences,
            "notes": notes,
            "results": results,
            "runs": [r.to_dict() for r in self.results if r.prompt in prompts],
        }
