"""A causal LM with its own KV cache, where rolling back means cropping to the committed length.

Two implementations share one interface (reset / prefill / forward / truncate / length): CachedLM
here (a DynamicCache, eager: `compile: off`) and compiled.StaticLM (a static position-indexed cache
and one compiled step: `compile: on`). `make_lm` picks one; `resolve_compile` settles `auto`.
"""

from __future__ import annotations

import logging
from typing import Protocol, Sequence

import torch

from ..models.properties import input_device
from ..primitives.sampling import fit_vocab
from ..primitives.tree import TreeAttention, additive_mask
from ..specs import Workload
from .compile_choice import TYPICAL_ANSWER_TOKENS, resolve_auto
from .forward_parts import check_tree_attention, gather_path, pick_features

log = logging.getLogger("specdec")


class LM(Protocol):
    """What the engine and the model drafters need of a model with a KV cache."""

    model: torch.nn.Module
    device: torch.device
    length: int  # committed positions in the cache (kept on the host)
    compile_seconds: float

    def reset(self) -> None: ...
    def reserve(self, positions: int) -> None: ...
    def warmup(self, calls) -> float: ...
    def prefill(self, ids: torch.Tensor) -> None: ...
    def forward(self, ids: torch.Tensor, keep: int, tree: TreeAttention | None = None) -> torch.Tensor: ...
    def truncate(self, length: int) -> None: ...
    def keep_path(self, start: int, slots: list[int]) -> None: ...
    def cached_positions(self) -> int: ...

    # drafters that read the target's hidden states (Medusa, EAGLE) set `feature_layers`; each
    # forward then leaves `features` [n, F]: those layers' states of its n tokens, side by side
    feature_layers: tuple[int, ...]
    features: torch.Tensor | None

    def want_features(self, layers: tuple[int, ...]) -> None: ...


class CachedLM:
    """One model plus one DynamicCache; `length` (kept on the host) is how many positions the cache holds."""

    def __init__(self, model: torch.nn.Module, vocab: int):
        self.model = model
        self.vocab = vocab
        self.device = input_device(model)
        self.cache = None
        self.length = 0
        self.compile_seconds = 0.0  # never compiles
        self.feature_layers: tuple[int, ...] = ()
        self.features: torch.Tensor | None = None

    def want_features(self, layers: tuple[int, ...]) -> None:
        """Every forward from now on also leaves these hidden states in `features` (LM)."""
        self.feature_layers = tuple(layers)

    def reserve(self, positions: int) -> None:
        """A DynamicCache grows as it goes: nothing to reserve."""

    def warmup(self, calls) -> float:
        """Eager steps: nothing to compile."""
        return 0.0

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.length = 0

    def forward(self, ids: torch.Tensor, keep: int, tree: TreeAttention | None = None) -> torch.Tensor:
        """Append `ids` [n] to the cache; logits [keep, vocab] for the last `keep` positions.
        `tree`: the tokens are branches of a token tree (a 4D mask and their own positions)."""
        n = ids.shape[-1]
        extra = {}
        if tree is not None:
            check_tree_attention(self.model)
            mask = additive_mask(n, self.length + n, self.length, tree, self.model.dtype, self.device)
            extra = {"attention_mask": mask, "position_ids": tree.positions.view(1, -1).to(self.device)}
        with torch.inference_mode():  # no autograd graph: decoding never needs gradients
            out = self.model(
                input_ids=ids.view(1, -1).to(self.device, non_blocking=True),
                cache=self.cache,
                use_cache=True,
                logits_to_keep=keep,
                output_hidden_states=bool(self.feature_layers),
                **extra,
            )
        if self.feature_layers:
            self.features = pick_features(out.hidden_states, self.feature_layers)
        self.length += n
        return fit_vocab(out.logits[0, -keep:], self.vocab)

    def keep_path(self, start: int, slots: list[int]) -> None:
        """Move the entries at `slots` (an accepted path through a tree, in order) to start,
        start + 1, ..., and forget everything after them."""
        gather_path(self.cache.layers, start, slots)
        self.truncate(start + len(slots))

    def prefill(self, ids: torch.Tensor) -> None:
        """Fill the cache with `ids`; only the last position's logits are computed (and dropped)."""
        if ids.numel():
            self.forward(ids, keep=1)

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (rejected drafts)."""
        if length < self.length:
            self.cache.crop(length - self.length)  # a negative count removes that many from the end
            self.length = length

    def cached_positions(self) -> int:
        """The cache's own count, for tests that check the host-side bookkeeping."""
        return self.cache.get_seq_length() if self.cache is not None else 0


def make_lm(model: torch.nn.Module, vocab: int, compile: str = "off", **options) -> LM:
    """The LM for `compile`: "off" -> CachedLM (DynamicCache, eager; today's behaviour), "on" ->
    StaticLM (static cache, one compiled step); "static" -> StaticLM with eager steps (a diagnostic:
    the static cache's logic without the compiler). Resolve "auto" first (resolve_compile).
    A model whose cache layout the static cache does not serve falls back to CachedLM, with a warning.
    `options` go to StaticLM (settings, buckets, on_compile); "off" ignores them."""
    if compile == "off":
        return CachedLM(model, vocab)
    if compile not in ("on", "static"):
        raise ValueError(f"make_lm: compile must be 'off', 'on' or 'static' (resolve 'auto' first), not '{compile}'")
    from .compiled_step import CompileSettings
    from .static import StaticLM
    from .static_cache import StaticCacheUnsupported

    if compile == "static":
        options = {"settings": CompileSettings(enabled=False), **options}
    try:
        return StaticLM(model, vocab, **options)
    except StaticCacheUnsupported as error:
        log.warning("compile: on is not available for %s (%s): decoding uncompiled", type(model).__name__, error)
        return CachedLM(model, vocab)


def resolve_compile(mode: str, device: torch.device, models: Sequence[torch.nn.Module] = (),
                    workload: Workload | None = None, room: int | None = None) -> str:
    """`auto` -> "on" or "off"; "on" and "off" pass through.

    Compiling costs a fixed time once per process (a warm inductor cache saves only part of it:
    compiled_step.configure_compiler; what it costs, measured, and how: BENCHMARKS.md, "Compile cost",
    benchmarks/compile_costs.py) and then saves a share of every step. So `auto` compiles `models` (the target and any draft model)
    only where the work expected pays for it: `workload`'s tokens (each generation capped at a
    typical answer and at the context's `room`) x what a token saves > what the compile costs, from
    this machine's records (compile_choice.decide); None: one generation of a typical answer.
    Devices other than CPU and CUDA stay off.
    """
    if mode in ("on", "off"):
        return mode
    if mode != "auto":
        raise ValueError(f"compile: '{mode}' is not one of off, auto, on")
    if device.type not in ("cpu", "cuda"):
        return "off"
    workload = workload or Workload.of(1, TYPICAL_ANSWER_TOKENS)
    return "on" if resolve_auto(device, models, workload, room).on else "off"
