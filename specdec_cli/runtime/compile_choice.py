"""`compile: auto`: compile only where the work expected pays for the compile.

Compiling costs a fixed time per process and then saves a little of every step. `decide` weighs
the two: on iff expected tokens x seconds a token saves > seconds the compile costs. The figures
come from this machine: every run that compiles records, per model, its eager and compiled
1-token step and how long its compile took, cold (nothing of it in inductor's disk cache) or
warm (an earlier run's kernels there), in <specdec cache>/compile_costs.json. Until a model has
a record, PRIOR_* stand in (conservative: a small job stays eager).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch

from ..cache_dirs import cache_dir, inductor_cache_dir
from ..models.devices import memory_bandwidth
from ..specs import Workload

log = logging.getLogger("specdec")
notice = logging.getLogger("specdec.notice")  # said once, shown without -v

# An answer usually ends at EOS long before a large -n ("-n 1000000000 hi" answered in 11 tokens),
# so a generation is expected to run at most this many tokens, whatever max_new_tokens allows.
TYPICAL_ANSWER_TOKENS = 256

# The prior, for a model this machine has not compiled yet: a compile of a minute (the demo's
# SmolLM2-135M took 49-58 s on a busy 2-core host, Qwen2.5-1.5B 65-77 s) that saves 30% of a step,
# and a step that streams the weights once: on a CPU at 10 GB/s (a busy 2-core host: 8.7-21.7
# GB/s), on a GPU at PRIOR_GPU_SHARE of the bandwidth its memory's clock and bus width give.
PRIOR_COMPILE_SECONDS = 60.0
PRIOR_SAVED_SHARE = 0.30
PRIOR_BYTES_PER_SECOND = 10e9
PRIOR_GPU_SHARE = 0.7  # decode kernels reach 60-80% of a GPU's peak bandwidth

RECORD_VERSION = 1
# auto staying off is explained only where a job of a few hundred answers would pay the compile back
ADVISE_UP_TO_TOKENS = 100_000


def expected_tokens(workload: Workload, room: int | None = None) -> int:
    """Tokens the workload is expected to decode: each generation runs min(max_new_tokens, the
    context's room, TYPICAL_ANSWER_TOKENS)."""
    cap = TYPICAL_ANSWER_TOKENS if room is None else min(room, TYPICAL_ANSWER_TOKENS)
    return sum(count * min(max_new_tokens, cap) for count, max_new_tokens in workload.parts)


@dataclass(frozen=True)
class CompileCosts:
    """One model's costs on this machine: a 1-token step eager and compiled, and its compile,
    cold and (once measured) warm. `warm_cache`: an earlier run's kernels of it are on disk."""

    eager_step_s: float
    compiled_step_s: float
    compile_cold_s: float
    compile_warm_s: float | None = None
    warm_cache: bool = False
    measured: bool = True  # every figure from this machine (else some are the prior's)
    compile_measured: bool = True  # the compile's figures from this machine

    @property
    def saved_per_token_s(self) -> float:
        # a token costs the target (and a draft model) about one 1-token forward each; where the
        # compiled one is no faster, 1-token steps run eagerly (compiled.StaticLM) and save nothing
        return max(0.0, self.eager_step_s - self.compiled_step_s)

    @property
    def compile_s(self) -> float:
        if self.warm_cache and self.compile_warm_s is not None:
            return self.compile_warm_s
        return self.compile_cold_s


@dataclass(frozen=True)
class Decision:
    on: bool
    tokens: int
    saved_per_token_s: float
    compile_s: float
    measured: bool

    def describe(self) -> str:
        """The -v line: the decision and its numbers."""
        saved = self.tokens * self.saved_per_token_s
        source = "measured on this machine" if self.measured else "a prior: nothing measured here yet"
        return (f"compile: auto -> {'on' if self.on else 'off'} (expect ~{self.tokens} tokens x "
                f"{1e3 * self.saved_per_token_s:.1f} ms saved = {saved:.1f} s {'>' if self.on else '<='} "
                f"{self.compile_s:.0f} s to compile; {source})")

    @property
    def pays_from(self) -> float:
        """The tokens a run must decode for the compile to pay back (inf: it never does)."""
        return math.ceil(self.compile_s / self.saved_per_token_s) if self.saved_per_token_s > 0 else math.inf

    def advice(self) -> str:
        """What a later, longer run gains by compiling: said once per machine where auto stays off."""
        source = "as measured here" if self.measured else "estimated: nothing measured here yet"
        return (f"compile: auto left the steps uncompiled for this run (~{self.tokens} tokens); compiling "
                f"({self.compile_s:.0f} s) saves {1e3 * self.saved_per_token_s:.1f} ms a token, so it pays "
                f"from ~{self.pays_from:,} tokens a run ({source}): --compile on for longer jobs (said once)")


def decide(tokens: int, models: Sequence[CompileCosts]) -> Decision:
    """On iff `tokens` x what the compiled models save per token > what compiling them costs."""
    saved = sum(m.saved_per_token_s for m in models)
    compile_s = sum(m.compile_s for m in models)
    measured = bool(models) and all(m.measured for m in models)
    return Decision(tokens * saved > compile_s, tokens, saved, compile_s, measured)


# --------------------------------------------------------------------------- the record on disk


def records_path() -> Path:
    return cache_dir() / "compile_costs.json"


def cost_key(model: torch.nn.Module, device: torch.device) -> str:
    """What the costs depend on: the model (its id or folder), its dtype and quantization (other
    kernels: a quantized model never reuses its bf16 figures), the device, torch."""
    from ..kernels.quantize import quantization_of

    name = getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "") or type(model).__name__
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    held = quantization_of(model)
    held = "" if held == "none" else f"|{held}"  # unquantized models keep the keys they had
    return f"{name}|{dtype}{held}|{device.type}|torch {torch.__version__}"


def read_records(path: Path | None = None) -> dict[str, dict]:
    """The records, {} where the file is missing, unreadable, corrupt or not ours."""
    path = path or records_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != RECORD_VERSION or not isinstance(data.get("models"), dict):
        return {}
    return {key: entry for key, entry in data["models"].items() if isinstance(entry, dict)}


def number(entry: dict, name: str) -> float | None:
    value = entry.get(name)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0 else None


def warm_cache(model: torch.nn.Module, device: torch.device, entry: dict | None = None) -> bool:
    """Whether an earlier run compiled this model into the inductor cache that is there now
    (`entry`: its record, when already read)."""
    if entry is None:
        entry = read_records().get(cost_key(model, device), {})
    compiled_before = number(entry, "compile_cold_s") is not None or number(entry, "compile_warm_s") is not None
    folder = Path(inductor_cache_dir())
    return compiled_before and folder.is_dir() and any(folder.iterdir())


def record_compile(model: torch.nn.Module, device: torch.device, *, compile_s: float, warm: bool,
                   eager_step_s: float | None = None, compiled_step_s: float | None = None) -> None:
    """Keep what this run measured."""
    changes: dict[str, object] = {"compile_warm_s" if warm else "compile_cold_s": round(compile_s, 3)}
    if eager_step_s is not None and compiled_step_s is not None:
        changes |= {"eager_step_s": round(eager_step_s, 6), "compiled_step_s": round(compiled_step_s, 6)}
    update_record(cost_key(model, device), changes)


def update_record(key: str, changes: dict[str, object]) -> None:
    """Merge `changes` into one model's record (a failed write costs only the record: it is never an error)."""
    from ..files import write_atomically

    path = records_path()
    records = read_records(path)
    records[key] = {**records.get(key, {}), **changes}
    try:
        write_atomically(path, json.dumps({"version": RECORD_VERSION, "models": records}, indent=1) + "\n")
    except OSError as error:
        log.debug("could not write %s: %s", path, error)


def prior_costs(model: torch.nn.Module, device: torch.device) -> CompileCosts:
    from ..kernels.quantize import stored_bytes

    peak = memory_bandwidth(device)  # None off CUDA
    step = stored_bytes(model) / (peak * PRIOR_GPU_SHARE if peak else PRIOR_BYTES_PER_SECOND)
    return CompileCosts(step, step * (1 - PRIOR_SAVED_SHARE), PRIOR_COMPILE_SECONDS, measured=False,
                        compile_measured=False)


def costs_for(model: torch.nn.Module, device: torch.device) -> CompileCosts:
    """This model's recorded costs, the prior's figures where none were recorded."""
    entry = read_records().get(cost_key(model, device), {})
    prior = prior_costs(model, device)
    eager, compiled = number(entry, "eager_step_s"), number(entry, "compiled_step_s")
    cold, warm = number(entry, "compile_cold_s"), number(entry, "compile_warm_s")
    steps_known = eager is not None and compiled is not None
    compile_known = cold is not None or warm is not None
    return CompileCosts(
        eager_step_s=eager if steps_known else prior.eager_step_s,
        compiled_step_s=compiled if steps_known else prior.compiled_step_s,
        compile_cold_s=cold if cold is not None else (warm if warm is not None else prior.compile_cold_s),
        compile_warm_s=warm,
        warm_cache=warm_cache(model, device, entry),
        measured=steps_known and compile_known,
        compile_measured=compile_known,
    )


def resolve_auto(device: torch.device, models: Iterable[torch.nn.Module], workload: Workload,
                 room: int | None) -> Decision:
    """`compile: auto` for these models (the target and any draft model that compiles). Where it
    stays off but a longer job would pay the compile back, that is said once on this machine."""
    models = list(models)
    decision = decide(expected_tokens(workload, room), [costs_for(m, device) for m in models])
    log.info("%s", decision.describe())
    if not decision.on and decision.pays_from <= ADVISE_UP_TO_TOKENS and models:
        key = cost_key(models[0], device)
        if not read_records().get(key, {}).get("advised"):
            notice.info("%s", decision.advice())
            update_record(key, {"advised": True})
    return decision
