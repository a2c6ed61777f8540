"""The one compiled model step every decoder of a model shares: inductor's settings (frozen, prepacked
weights on a CPU; CUDA graphs on CUDA) and the step function compiled once per model."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import types
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..cache_dirs import bound_inductor_cache, inductor_cache_dir, inductor_limit_bytes
from ..errors import first_line
from .forward_parts import pick_features

log = logging.getLogger("specdec")
notice = logging.getLogger("specdec.notice")
_bounded = False  # the inductor cache checked against its bound, once a process


@dataclass(frozen=True)
class CompileSettings:
    """How the step is compiled.

    `autotune`: inductor's max-autotune, which on CPU benchmarks its C++ micro-GEMM templates
    against the prepacked library GEMMs for each matmul, at the width of the first call (2).
    Off by default: on the CPUs measured it was never faster than the library GEMMs (its choices
    are made at the first call's width, 2), while it doubled the compile time and the peak memory
    (each candidate holds its own packed copy of the weights while it is benchmarked); on CUDA,
    minutes of Triton autotuning for little over cuBLAS at these shapes. Measure a machine with
    benchmarks/compile_costs.py (BENCHMARKS.md, "Plain decoding and compiling").
    """

    enabled: bool = True
    autotune: bool = False
    fullgraph: bool = True
    freezing: bool = True  # CPU: weights frozen into the graph and prepacked (see `for_model`)
    layout: str = ""  # unfrozen CPU graphs: the int4 weights' layout, which the merged graph assumes

    def options(self, device: torch.device) -> dict:
        """torch.compile options; freezing is not among them (see `inductor_patch`).

        No guards on the model's modules and parameters: every call checked a few hundred of them
        (SmolLM2-135M, bf16: 1.0 ms of a 15.6 ms plain step, benchmarks/guard_cost.py). Safe here:
        each model has a compiled step of its own (`shared_step`), whose weights nobody changes (on
        CPU they are frozen into the graph anyway); the guards on the cache and the inputs stay."""
        import torch.compiler

        options = {"max_autotune": self.autotune, "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
        if device.type == "cuda":
            # CUDA graphs ("reduce-overhead"): one launch per step instead of hundreds
            options["triton.cudagraphs"] = True
        return options

    def for_model(self, model: torch.nn.Module) -> "CompileSettings":
        """These settings for `model`: freezing only where it pays. It prepacks plain Linears'
        weights for the CPU GEMMs, and it keeps the whole graph out of the caches a later process
        reads (AOTAutograd's cache refuses frozen graphs). A model whose every Linear runs
        specdec's int4 kernel has nothing to prepack, so it compiles unfrozen and a later process
        loads its graph from those caches: the int4 pair's second process compiled in 18 s, not
        44 s, its steps as fast (BENCHMARKS.md, "Compiled steps across processes")."""
        if self.enabled and self.freezing and not any(type(m) is torch.nn.Linear for m in model.modules()):
            from ..kernels.int4_siblings import layout_key

            return dataclasses.replace(self, freezing=False, layout=layout_key(model))
        return self

    def inductor_patch(self, device: torch.device) -> dict:
        """Inductor config around every call. Freezing (weights as constants, prepacked for the
        CPU GEMMs) is read from the global config when a graph compiles: given in torch.compile's
        options it does not take effect (measured: a Linear stays an unfrozen mm). On CPU, int4
        layers reading one input run as one kernel call (int4_merge_pass.py, a pass on the joint
        graph: the merged weights are a view of the graph's inputs, folded into a constant where
        the graph is frozen)."""
        if device.type != "cpu":
            return {"freezing": False}
        from ..kernels.int4_merge_pass import MergeSiblings

        return {"freezing": self.freezing, "joint_custom_post_pass": MergeSiblings(self.layout)}

    def inductor_config(self, device: torch.device):
        """The context every call of the step runs in: inductor's config patched (`inductor_patch`);
        nothing when not compiling."""
        if not self.enabled:
            return contextlib.nullcontext()
        import torch._inductor.config

        return torch._inductor.config.patch(self.inductor_patch(device))


def configure_compiler() -> None:
    """Process-wide settings the compiled steps need (idempotent); the first call keeps the
    inductor cache within its bound (cache_dirs.bound_inductor_cache)."""
    global _bounded
    if not _bounded:
        _bounded = True
        removed = bound_inductor_cache()
        if removed:
            notice.info("cleared inductor's cache in %s (%.1f GB, over its %.1f GB bound: SPECDEC_INDUCTOR_MAX_GB); "
                        "this run compiles anew", inductor_cache_dir(), removed / 1024 ** 3, inductor_limit_bytes() / 1024 ** 3)
    inductor_cache_dir()
    import torch._inductor.config as inductor

    # on disk: whole graphs where torch can, and always the compiled C++/Triton kernels and
    # autotune choices. A frozen CPU graph is not cached whole: AOTAutograd's cache refuses
    # freezing (and inductor's FX graph cache bypasses graphs holding mkldnn-packed weights), so
    # a later process traces, freezes and lowers it again and reuses the kernels; an unfrozen
    # graph (an all-int4 model, `for_model`) it loads from both caches after dynamo's trace. The
    # mega-cache (torch.compiler.save_cache_artifacts) packages these same caches: nothing more.
    inductor.fx_graph_cache = True
    inductor.autotune_local_cache = True


def model_step(model, cache, ids, slots, positions, mask, keep, layers=()):
    """One forward: ids [1, M] written at cache slots `slots` [M], at position ids `positions` [M]
    (the slots themselves for a sequence, prefix length + depth for a tree's branches), attending
    by `mask` [1, 1, M, capacity] (None: causal over the slots); logits [M or keep, V], and with
    `layers` also those hidden states [M, F] (forward_parts.pick_features)."""
    cache.positions = slots
    out = model(
        input_ids=ids,
        position_ids=positions.view(1, -1),
        attention_mask=mask,
        cache=cache,
        use_cache=True,
        logits_to_keep=keep,
        output_hidden_states=bool(layers),
    )
    if layers:
        return out.logits[0], pick_features(out.hidden_states, layers)
    return out.logits[0]


@dataclass
class SharedStep:
    """One model's compiled step and the widths it has run: shared by every LM over that model
    (bench and tune-k build a decoder per k), so it compiles once per process."""

    call: Callable
    widths: set = field(default_factory=set)
    # CPU: whether a 1-token forward runs eagerly rather than padded to MIN_WIDTH (measured in warmup)
    one_token_eager: bool | None = None
    # CPU: that measurement, seconds of a 1-token forward (eager, compiled)
    one_token_seconds: tuple[float, float] | None = None


_steps: "weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, SharedStep]]" = weakref.WeakKeyDictionary()


def shared_step(
    model: torch.nn.Module, settings: CompileSettings, device: torch.device, layers: tuple[int, ...] = (),
    step: Callable = model_step,
) -> SharedStep:
    """The `step` (model_step, or batched_static.batch_step) of this model under these settings,
    returning the hidden states at `layers` too (a graph of its own). Each is a copy of `step` with
    a code object of its own: dynamo keeps compiled graphs per code object, so each model's table
    holds its graph only (a draft's guards are never tried on the target's steps)."""
    by_settings = _steps.setdefault(model, {})
    key = (step.__name__, settings, layers)
    if key not in by_settings:
        call = types.FunctionType(step.__code__.replace(), step.__globals__, step.__name__)
        if settings.enabled:
            configure_compiler()
            call = torch.compile(call, fullgraph=settings.fullgraph, dynamic=False, options=settings.options(device))
        by_settings[key] = SharedStep(call)
    return by_settings[key]


# why this process's first compile failed; once set, no step compiles any more (the cause, a
# compiler or a backend, is the machine's, and each new try would cost its seconds again)
_failure: list[str] = []


def compile_failed() -> bool:
    """Whether a compile failed earlier in this process (every step then runs uncompiled)."""
    return bool(_failure)


def note_compile_failure(model: torch.nn.Module, error: Exception) -> None:
    """A compile (or CUDA graph recording) that failed: one warning a process, naming the first
    failure's root cause (inductor wraps it: the innermost exception says what is wrong)."""
    cause: BaseException = error
    while cause.__cause__ is not None or cause.__context__ is not None:
        cause = cause.__cause__ or cause.__context__
    reason = f"{type(cause).__name__}: {first_line(cause)}" if str(cause) else type(cause).__name__
    if _failure:
        log.debug("compile failed for %s too (%s)", type(model).__name__, reason)
        return
    _failure.append(reason)
    log.warning("compile failed for %s (%s): decoding uncompiled, the same tokens", type(model).__name__, reason)
