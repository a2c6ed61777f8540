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
from typing import Any, Callable, Protocol, Sequence

import torch

from ..api import Pipeline
from ..decoding.events import Finished, Verified
from ..decoding.stats import DecodeStats
from ..models.devices import device_clock, device_description, dtype_name
from ..models.loading import input_device
from ..specs import AUTO_TREE, SamplingSpec, TreeSpec
from .divergence import describe_divergence
from .paired import InterleavedRuns, speedup_fields
from .workload import BenchPrompt

ALL_METHODS = ("plain", "specdec", "specdec-tree", "hf-plain", "hf-assisted")
PRIME_TOKENS = 8  # an untimed first run: prefill and a few decode steps of every model a method uses

Clock = Callable[[], float]


def synced_clock(device: torch.device) -> Clock:
    """Seconds, read after the device has finished its queued work."""
    return lambda: device_clock(device)


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


class Method(Protocol):
    name: str

    def run(self, ids: list[int], max_new_tokens: int, sampling: SamplingSpec, seed: int) -> dict[str, Any]:
        """Generate once; the RunResult fields other than method, prompt and repeat."""


# --------------------------------------------------------------------------- our engine


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
        started = self.clock()
        first_at, first_tokens, finished = None, 0, None
        for event in self.decoder.stream(ids, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed):
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


# --------------------------------------------------------------------------- transformers


class FirstTokenClock:
    """A generate() streamer that notes when the first new tokens arrive (after a device sync)."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.calls = 0
        self.first_at: float | None = None
        self.first_tokens = 0

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2:  # the first call carries the prompt
            self.first_at = self.clock()
            self.first_tokens = int(value.numel())

    def end(self) -> None:
        pass


class ForwardCounter:
    """The target's forwards in one generate(), and the tokens they read."""

    def __init__(self, model: torch.nn.Module):
        self.count = 0
        self.tokens = 0
        self.handle = model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output) -> None:
        self.count += 1
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.tokens += int(ids.shape[-1]) if isinstance(ids, torch.Tensor) else 0

    def close(self) -> int:
        self.handle.remove()
        return self.count

    def drafted(self, prompt_length: int) -> int:
        """Candidates the target verified, in its own tokens: its first forward reads the prompt and
        the first candidates, each later one the last step's own token and the new candidates."""
        return self.tokens - prompt_length - max(0, self.count - 1)


class HFMethod:
    """transformers' generate: alone (`hf-plain`), or assisted by the profile's draft model.

    transformers 5 reads the assisted-generation knobs from the ASSISTANT's generation_config,
    so they are set there for the call and restored after it. `assistant_settings` None keeps
    transformers' defaults (up to 20 drafts, a 0.4 confidence threshold). A draft with another
    tokenizer gets both tokenizers in `generate_kwargs` (Universal Assisted Generation); there
    the knobs count the draft's own tokens.
    """

    def __init__(self, name: str, pipeline: Pipeline, assistant: torch.nn.Module | None = None,
                 assistant_settings: dict[str, Any] | None = None, generate_kwargs: dict[str, Any] | None = None,
                 clock: Clock | None = None):
        self.name = name
        self.pipeline = pipeline
        self.clock = clock or synced_clock(input_device(pipeline.target))
        self.assistant = assistant
        self.assistant_settings = assistant_settings or {}
        self.generate_kwargs = generate_kwargs or {}

    def run(self, ids, max_new_tokens, sampling, seed):
        pipeline = self.pipeline
        kwargs: dict[str, Any] = dict(self.generate_kwargs)
        if not sampling.greedy:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or None, top_p=sampling.top_p)
            torch.manual_seed(seed)
        if self.assistant is not None:
            kwargs["assistant_model"] = self.assistant
        clock = FirstTokenClock(self.clock)
        counter = ForwardCounter(pipeline.target)
        saved = self._apply_assistant_settings()
        try:
            started = self.clock()
            token_ids = pipeline.transformers_generate(ids, max_new_tokens, streamer=clock, **kwargs)
            ended = self.clock()
        except Exception as exc:  # noqa: BLE001 - transformers' own failure on one run ends no bench
            lines = str(exc).strip().splitlines()
            error = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
            return {"token_ids": (), "ttft_seconds": 0.0, "total_seconds": 0.0, "first_tokens": 0, "error": error}
        finally:
            self._restore_assistant_settings(saved)
            forwards = counter.close()
        assisted = self.assistant is not None
        return {
            "token_ids": token_ids,
            "ttft_seconds": (clock.first_at or ended) - started,
            "total_seconds": ended - started,
            "first_tokens": clock.first_tokens,
            "target_forwards": forwards,
            # counted in the target's tokens, whatever the draft's tokenizer
            "drafted": counter.drafted(len(ids)) if assisted else None,
            # each target forward emits its accepted drafts plus one token of its own
            "accepted": len(token_ids) - forwards if assisted else None,
        }

    def _apply_assistant_settings(self) -> dict[str, Any]:
        if self.assistant is None:
            return {}
        config = self.assistant.generation_config
        saved = {key: getattr(config, key, None) for key in self.assistant_settings}
        for key, value in self.assistant_settings.items():
            setattr(config, key, value)
        return saved

    def _restore_assistant_settings(self, saved: dict[str, Any]) -> None:
        for key, value in saved.items():
            setattr(self.assistant.generation_config, key, value)


def draft_model_of(pipeline: Pipeline) -> torch.nn.Module | None:
    """The profile drafter's own draft model, which transformers can use as an assistant (or None)."""
    return pipeline.drafter.draft_model


def other_tokenizer_assistant(pipeline: Pipeline, sampling: SamplingSpec) -> tuple[dict[str, Any] | None, str]:
    """Universal Assisted Generation for a draft with another tokenizer: the generate() arguments
    that ask for it (None where it is left out), and a note for the report.

    At temperature 0 transformers re-encodes the draft's text into target tokens and keeps the
    exact matches: the target's greedy text. Above it, transformers' sampled path (its own token
    intersection) prunes the assistant's output head in place, for good, and its first token did
    not follow the target's distribution on a tiny pair (chi-square): no speed to compare with.
    """
    def size(model: torch.nn.Module) -> int:
        return model.config.get_text_config().vocab_size

    if not sampling.greedy:
        return None, ("hf-assisted left out: above temperature 0 transformers' assisted generation with another "
                      "tokenizer did not keep the target's distribution when tested; it runs at temperature 0")
    if size(pipeline.drafter.draft_model) == size(pipeline.target):
        # transformers tells two tokenizers apart by this size alone, and refuses assistant_tokenizer where it matches
        return None, ("hf-assisted left out: transformers takes a draft with another tokenizer only where "
                      f"the two models' vocab_size differ (both {size(pipeline.target)})")
    overlap = getattr(pipeline.drafter, "overlap", None)
    note = ("hf-assisted: the draft has another tokenizer: transformers' Universal Assisted Generation "
            "(tokenizer= and assistant_tokenizer=), its k counted in the draft's tokens"
            + (f"; {overlap.describe()}" if overlap is not None else ""))
    return {"tokenizer": pipeline.tokenizer, "assistant_tokenizer": pipeline.drafter.draft_tokenizer}, note


def build_methods(pipeline: Pipeline, wanted: Sequence[str], k: int | str, hf_ks: Sequence[int] = (),
                  clock: Clock | None = None, sampling: SamplingSpec = SamplingSpec(),
                  ) -> tuple[list[Method], list[str]]:
    """The methods to run (plain always first: it is the reference), and notes on any left out.

    transformers' assisted generation uses the drafter's own draft model (kind model, or a chain's
    model member; with both tokenizers where the draft's is another), or prompt lookup for kind
    ngram. It runs at its defaults and at a constant k for each of `hf_ks` (default: the profile's
    k), so that the comparison can be with its best constant k. `sampling`: the runs' own.
    """
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
            assistant = draft_model_of(pipeline)
            kind = pipeline.profile.drafter.kind
            tokenizers: dict[str, Any] | None = {}
            if assistant is not None and pipeline.drafter.draft_tokenizer is not None:
                tokenizers, note = other_tokenizer_assistant(pipeline, sampling)
                notes.append(note)
                if tokenizers is None:
                    continue
            if assistant is not None:
                methods.append(HFMethod("hf-assisted-default", pipeline, assistant, generate_kwargs=tokenizers, clock=clock))
                for hf_k in hf_ks or ([k] if isinstance(k, int) else []):
                    constant = {"num_assistant_tokens": hf_k, "num_assistant_tokens_schedule": "constant",
                                "assistant_confidence_threshold": 0.0}
                    methods.append(HFMethod(f"hf-assisted-k{hf_k}", pipeline, assistant, constant, tokenizers, clock=clock))
            elif kind == "ngram":
                options = pipeline.profile.drafter.options
                lookup = {"prompt_lookup_num_tokens": k if isinstance(k, int) else 10,
                          "max_matching_ngram_size": options["max_ngram"]}
                methods.append(HFMethod("hf-assisted-default", pipeline, generate_kwargs=lookup, clock=clock))
            else:
                notes.append(f"hf-assisted left out: transformers has no equivalent of drafter kind '{kind}'")
    return methods, notes


# --------------------------------------------------------------------------- the run


@dataclass
class BenchSettings:
    max_new_tokens: int = 128
    repeats: int = 3
    warmup: int = 1
    sampling: SamplingSpec = SamplingSpec()
    seed: int = 0
    k: int | str = 5


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
