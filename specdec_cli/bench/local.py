"""The same prompts through plain decoding, specdec and transformers' generate, in one process.

Methods run interleaved per prompt (A B C A B C ...) after warm-up, so drift in the machine's
speed hits all of them alike. Every clock read follows a device sync. Each run is split at its
first emitted token: `ttft` (prefill and first step) apart, and the decode rate after it, since
transformers' assisted generation fuses the target's prefill with its first verification.

speedup = median over prompts of (method decode rate / plain decode rate), each run paired with
plain's run of the same prompt and repeat (paired.py, which also marks figures no decoding can give).

One-time costs land in no measurement, whatever --warmup says: every engine method compiles its
steps first (`prepare`; the time is reported apart as `compile_seconds`), then every method runs
once, untimed, for PRIME_TOKENS tokens of the first prompt: first calls of each model and each
kernel, allocator growth, weights paged in. Without that, the method that runs first (plain, the reference) paid
them alone, and every other method looked several times faster than its counts allow.
"""

from __future__ import annotations

import platform
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..api import Pipeline
from ..decoding.stats import DecodeStats
from ..models.devices import device_description, dtype_name
from ..specs import AUTO_TREE, SamplingSpec, Workload
from .divergence import describe_divergence
from .engine_methods import Clock, EngineMethod, Method
from .options import BenchSettings
from .paired import InterleavedRuns, speedup_fields
from .transformers_methods import HFMethod, assisted_methods
from .workload import BenchPrompt

PRIME_TOKENS = 8  # an untimed first run: prefill and a few decode steps of every model a method uses


@dataclass
class RunResult:
    method: str
    prompt: BenchPrompt
    repeat: int
    token_ids: tuple[int, ...]
    ttft_seconds: float  # until the first token(s) were out: prefill + first step
    total_seconds: float
    first_tokens: int  # how many tokens that first step emitted
    target_forwards: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    stats: DecodeStats | None = None  # our engine's own statistics, for tune-k
    error: str | None = None  # transformers' generate failed on this run: left out of every figure

    @property
    def decode_tokens(self) -> int:
        return len(self.token_ids) - self.first_tokens

    @property
    def decode_seconds(self) -> float:
        return self.total_seconds - self.ttft_seconds

    @property
    def tokens_per_second(self) -> float | None:
        seconds = self.decode_seconds
        return self.decode_tokens / seconds if self.decode_tokens > 0 and seconds > 0 else None


def build_methods(pipeline: Pipeline, wanted: Sequence[str], k: int | str, hf_ks: Sequence[int] = (),
                  clock: Clock | None = None, sampling: SamplingSpec = SamplingSpec(),
                  ) -> tuple[list[Method], list[str]]:
    """The methods to run (plain always first: it is the reference), and notes on any left out.
    `hf_ks`: constant ks for transformers' assisted generation; `sampling`: the runs' own."""
    methods: list[Method] = [EngineMethod("plain", pipeline, None, plain=True, clock=clock)]
    notes = []
    for name in wanted:
        if name == "specdec":
            methods.append(EngineMethod("specdec", pipeline, k, clock=clock))
        elif name == "specdec-tree":  # the profile's tree (or --tree), else tree: auto
            methods.append(EngineMethod("specdec-tree", pipeline, k, tree=pipeline.profile.tree or AUTO_TREE, clock=clock))
        elif name == "hf-plain":
            methods.append(HFMethod("hf-plain", pipeline, clock=clock))
        elif name == "hf-assisted":
            assisted, note = assisted_methods(pipeline, k, hf_ks, sampling, clock)
            methods += assisted
            notes += [note] if note else []
    return methods, notes


def bench_workload(prompts: int, settings: BenchSettings, methods: Sequence[str]) -> Workload:
    """The generations a bench of `methods` (parse_methods' names) runs on our engine, which
    `compile: auto` weighs: plain and each engine method, every prompt and repeat (transformers'
    methods run eager: they compile nothing)."""
    engine_methods = 1 + sum(m in ("specdec", "specdec-tree") for m in methods)
    return Workload.of(prompts * settings.repeats * engine_methods, settings.max_new_tokens)


# --------------------------------------------------------------------------- the run


@dataclass
class Bench(InterleavedRuns):
    pipeline: Pipeline
    prompts: list[BenchPrompt]
    settings: BenchSettings
    methods: list[Method]
    notes: list[str] = field(default_factory=list)
    results: list[RunResult] = field(default_factory=list)
    drift: dict[str, Any] | None = None  # measure_drift's: a quantized target against its unquantized model

    @property
    def total_runs(self) -> int:
        return len(self.prompts) * self.settings.repeats * len(self.methods)

    def run(self, on_progress: Callable[[str], None] | None = None) -> None:
        s = self.settings
        encoded = [self.pipeline.encode(p.text) for p in self.prompts]
        for method in self.methods:  # compiling first: never inside a timed run
            prepare = getattr(method, "prepare", None)
            if prepare is not None:
                prepare()
        for method in self.methods:  # first calls, whatever --warmup says: never inside a timed run
            method.run(encoded[0], min(PRIME_TOKENS, s.max_new_tokens), s.sampling, s.seed)
        for _ in range(s.warmup):  # warm-up: allocator, kernels, caches; not recorded
            for method in self.methods:
                method.run(encoded[0], min(16, s.max_new_tokens), s.sampling, s.seed)
        for prompt, ids in zip(self.prompts, encoded):
            for repeat in range(s.repeats):
                for method in self.methods:  # interleaved: A B C A B C
                    measured = method.run(ids, s.max_new_tokens, s.sampling, s.seed + repeat)
                    self.results.append(RunResult(method.name, prompt, repeat, **measured))
                    if on_progress:
                        on_progress(f"{prompt.id} · {method.name}")

    @property
    def drift_applies(self) -> bool:
        """Whether measure_drift has anything to compare: greedy text of a quantized target."""
        return self.settings.sampling.greedy and self.pipeline.profile.target.quantize != "none"

    def measure_drift(self) -> None:
        """At temperature 0 with a quantized target: the unquantized model's greedy text against
        the quantized target's (plain decoding's, else the first method's) on every finished prompt."""
        if not self.drift_applies:
            return
        from .quant_drift import quantization_drift

        prompts = self.complete_prompts()
        method = "plain" if any(m.name == "plain" for m in self.methods) else self.methods[0].name
        quantized = [next(iter(self.runs(method, [p]))).token_ids for p in prompts]
        self.drift = quantization_drift(self.pipeline, [self.pipeline.encode(p.text) for p in prompts], quantized,
                                        self.settings.max_new_tokens)

    # --- aggregation
    def compile_seconds(self) -> float:
        """Seconds our engine's methods spent compiling their steps (0 with compile off), never
        part of a measured run."""
        return sum(getattr(method, "compile_seconds", 0.0) for method in self.methods)

    def runs_per_repeat(self) -> int:
        return len(self.methods)

    def paired_speedup(self, method: str, reference: str, prompts: Sequence[BenchPrompt]) -> float | None:
        return self.paired(method, reference, prompts).median

    def method_summary(self, method: str, prompts: Sequence[BenchPrompt]) -> dict[str, Any]:
        rates = [rate for prompt in prompts if (rate := self.prompt_rate(method, prompt))]
        runs = [r for r in self.runs(method, prompts) if r.error is None]
        forwards = [r.target_forwards for r in runs if r.target_forwards is not None]
        drafted = sum(r.drafted or 0 for r in runs)
        accepted = sum(r.accepted or 0 for r in runs if r.drafted)
        new_tokens = sum(len(r.token_ids) for r in runs)
        tau = new_tokens / sum(forwards) if forwards and sum(forwards) else None
        # tau bounds our engine's methods against its plain decoding; transformers' steps cost what they cost
        ours = not method.startswith("hf-")
        return {
            "method": method,
            "tokens_per_second": statistics.median(rates) if rates else None,
            **speedup_fields(self.paired(method, "plain", prompts), tau, bounded=ours),
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_length": tau,
            "target_forwards": statistics.mean(forwards) if forwards else None,
            "ttft_seconds": statistics.median([r.ttft_seconds for r in runs]) if runs else None,
            "new_tokens": statistics.mean([len(r.token_ids) for r in runs]) if runs else None,
            "prompts": len(prompts),
        }

    def differences(self, prompts: Sequence[BenchPrompt]) -> list[dict[str, Any]]:
        """At temperature 0, every run against plain decoding's output for the same prompt."""
        if not self.settings.sampling.greedy:
            return []
        found = []
        for prompt in prompts:
            reference = next(r for r in self.runs("plain", [prompt]))
            ids = self.pipeline.encode(prompt.text)
            for r in self.results:
                if r.prompt.id != prompt.id or r.token_ids == reference.token_ids or r.error is not None:
                    continue
                divergence = describe_divergence(self.pipeline.target, ids, reference.token_ids, r.token_ids)
                found.append({"prompt": prompt.id, "category": prompt.category, "method": r.method,
                              "repeat": r.repeat, **divergence.to_dict()})
        return found

    def failures(self, prompts: Sequence[BenchPrompt]) -> list[str]:
        """A note for each method with runs that failed inside transformers (none of their figures count)."""
        notes = []
        for method in self.methods:
            runs = self.runs(method.name, prompts)
            failed = [r for r in runs if r.error is not None]
            if failed:
                notes.append(f"{method.name}: {len(failed)} of {len(runs)} runs failed inside transformers' "
                             f"generate and are left out of its figures (first: prompt {failed[0].prompt.id}: "
                             f"{failed[0].error})")
        return notes

    def summary(self) -> dict[str, Any]:
        prompts = self.complete_prompts()
        names = [m.name for m in self.methods]
        results = [self.method_summary(name, prompts) for name in names]
        categories = sorted({p.category for p in prompts if p.category})
        if categories:
            for row in results:
                row["per_category"] = {
                    c: self.method_summary(row["method"], [p for p in prompts if p.category == c]) for c in categories
                }
        differences = self.differences(prompts)
        comparisons = {}
        hf_rows = [r for r in results if r["method"].startswith("hf-assisted") and r["tokens_per_second"]]
        for ours in ("specdec", "specdec-tree"):
            if ours in names and hf_rows:
                best = max(hf_rows, key=lambda r: r["tokens_per_second"])["method"]
                comparisons[f"{ours}_vs_hf_assisted_best"] = {
                    "method": best, "speedup": self.paired_speedup(ours, best, prompts)}
        if "specdec" in names and "specdec-tree" in names:
            comparisons["specdec-tree_vs_specdec"] = {
                "method": "specdec", "speedup": self.paired_speedup("specdec-tree", "specdec", prompts)}
        return {
            "profile": self.pipeline.profile.name,
            "machine": machine_info(self.pipeline),
            "settings": {
                "prompts": len(prompts),
                "prompts_planned": len(self.prompts),
                "max_new_tokens": self.settings.max_new_tokens,
                "repeats": self.settings.repeats,
                "warmup": self.settings.warmup,
                "k": self.settings.k,
                "temperature": self.settings.sampling.temperature,
                "top_k": self.settings.sampling.top_k,
                "top_p": self.settings.sampling.top_p,
                "seed": self.settings.seed,
                "drafter": self.pipeline.profile.drafter.describe(),
                "constraint": None if self.pipeline.profile.constraint is None
                else self.pipeline.profile.constraint.describe(),
                "methods": names,
                "compile": self.pipeline.compile,
            },
            "compile_seconds": self.compile_seconds(),
            "dtype": dtype_name(next(self.pipeline.target.parameters()).dtype),
            "outputs_identical": not differences if self.settings.sampling.greedy else None,
            "differences": differences,
            "quantization_drift": self.drift,
            "notes": self.notes + self.failures(prompts),
            "results": results,
            "comparisons": comparisons,
        }


def machine_info(pipeline: Pipeline) -> dict[str, Any]:
    import transformers

    return {
        "device": str(pipeline.device),
        "device_name": device_description(pipeline.device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "threads": torch.get_num_threads(),
    }


def make_bench(pipeline: Pipeline, prompts: list[BenchPrompt], settings: BenchSettings, methods: Sequence[str],
               hf_ks: Sequence[int] = (), clock: Clock | None = None) -> Bench:
    built, notes = build_methods(pipeline, methods, settings.k, hf_ks, clock, settings.sampling)
    return Bench(pipeline, prompts, settings, built, notes)
