"""Static KV caches and one compiled model step: the `compile: on` path.

`StaticLM` has `CachedLM`'s interface (reset / reserve / prefill / forward / truncate / length).
Its cache is a transformers `Cache` of preallocated, position-indexed buffers
[1, kv_heads, capacity, head_dim]:

- a forward of n tokens writes token i at slot `length + i` and attends to the slots up to its own
  (a causal mask over the whole buffer, given explicitly), so it never sees a stale slot; a token
  tree's forward gives its own mask (each node sees the prefix and its ancestors, primitives/tree.py) and
  position ids, and the accepted path is gathered into consecutive slots (forward_parts.gather_path);
- rolling back is only `length = committed`: the slots beyond stay, masked until overwritten;
- a forward is padded to its width (at least 2, and on CUDA up to a bucket): the pads sit after
  the real tokens, so no real token attends to them, and their slots are overwritten later; each
  pad repeats the last real token (its id, position and mask row), so its rows equal that token's
  in every layer, and the int4 CPU kernel computes such a row once (a 1-token step's pad is free);
- positions go in as a tensor made on the device: nothing in a step reads a device value on the
  host, and nothing is copied to the device but the ids.

Compiling: ONE graph per model, whose token width (2..MAX_WIDTH) and cache capacity are dynamic
dimensions. On CPU the weights are frozen into the graph and prepacked for the GEMMs, and each
graph holds its own packed copy of every weight: a graph per width would hold one copy per width
(measured: +3 GB per width for a 1.5B model in bf16; fp32 ran out of 24 GB at the second), so one
dynamic graph it is (resident memory: the weights twice). Width 1 is padded to 2 because a dynamic
size of 1 is specialized (a second graph, a second copy); compiled, 2 tokens cost what 1 does.
On CUDA: CUDA graphs ("reduce-overhead"), one recorded per bucket width; no freezing.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable

import torch

from ..cache_dirs import inductor_cache_dir
from ..kernels import cpu_attention
from ..models.properties import input_device
from ..primitives.sampling import fit_vocab
from ..primitives.tree import TreeAttention, additive_mask
from ..specs import MAX_K
from . import compile_choice
from .compiled_step import CompileSettings, compile_failed, model_step, note_compile_failure, shared_step
from .forward_parts import check_tree_attention, gather_path
from .static_cache import PositionedCache, capacity_for, check_one_device, check_supported

log = logging.getLogger("specdec")

MIN_WIDTH = 2  # narrower forwards are padded: a dynamic dimension of size 1 would be specialized
# wider forwards (prefill, long catch-ups) run eagerly, unpadded; so does the one verify a profile
# allows past it: the root and MAX_K drafted nodes (k: 64, or a tree of 64 nodes), a step of 65
MAX_WIDTH = MAX_K
SHRINK_FACTOR = 4  # a cache this many times larger than a generation asks for is given back (reset)
CUDA_BUCKETS = (2, 4, 8, 16, 32, 64)  # CUDA records a graph per width: a few widths serve every step


# --------------------------------------------------------------------------- the LM


class StaticLM:
    """CachedLM's interface over a static, position-indexed KV cache and one compiled step.

    `CompileSettings(enabled=False)` runs the same padded steps eagerly: the static cache's logic
    apart from the compiler. Prefill and forwards wider than MAX_WIDTH run eagerly, unpadded.
    `buckets`: the widths a step is padded up to; None: exact widths on CPU (one dynamic graph
    serves them all), CUDA_BUCKETS on CUDA.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        vocab: int,
        *,
        settings: CompileSettings = CompileSettings(),
        buckets: tuple[int, ...] | None = None,
        on_compile: Callable[[str], None] | None = None,
    ):
        inductor_cache_dir()  # before torch's compiler loads: it fixes its cache dir when first asked
        import torch._dynamo  # here, not at import: a second of start-up for every command

        check_supported(model.config)  # fail at construction, not mid-generation
        check_one_device(model)
        if input_device(model).type == "cpu":
            cpu_attention.use_on(model)
        self.model = model
        self.vocab = vocab
        self.device = input_device(model)
        self.settings = settings.for_model(model)
        self.buckets = buckets if buckets is not None else (CUDA_BUCKETS if self.device.type == "cuda" else ())
        self.on_compile = on_compile  # told before the step compiles (a progress line)
        self.length = 0
        self.cache: PositionedCache | None = None
        self.capacity = 0
        self._wanted = 0  # the capacity the last reserve asked for
        self.compile_seconds = 0.0  # time spent in forwards that compiled
        # see lm.LM; a graph is compiled per distinct value (a constant of the step)
        self.feature_layers: tuple[int, ...] = ()
        self.features: torch.Tensor | None = None
        self.max_positions = absolute_position_limit(model)
        self.step = shared_step(model, self.settings, self.device)
        self._ids = torch.zeros(1, MAX_WIDTH, dtype=torch.long, device=self.device)  # stale ids serve as pads
        self._clone_outputs = settings.enabled and self.device.type == "cuda"  # CUDA graphs reuse output memory

    def want_features(self, layers: tuple[int, ...]) -> None:
        """Every forward from now on also leaves these hidden states in `features` (lm.LM)."""
        self.feature_layers = tuple(layers)
        self.step = shared_step(self.model, self.settings, self.device, self.feature_layers)
        if layers:  # transformers installs its hidden-state hooks on the first such call: eagerly, not in a graph
            with torch.inference_mode():
                self.model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=self.device), output_hidden_states=True)

    # --- capacity
    def reserve(self, positions: int) -> None:
        """Make room for `positions` tokens (prompt + new tokens) before a generation, so that the
        buffers are not reallocated (and copied) mid-way. Every step attends over the whole
        capacity (its unused slots masked), so the room a long prompt left would slow every shorter
        generation after it (measured: 27 -> 19 tok/s for the Qwen 1.5B int4 target after a
        1000-token prompt): the next reset gives it back when it is SHRINK_FACTOR times what this
        generation asks for."""
        self._wanted = capacity_for(positions + MAX_WIDTH)
        self._ensure_slots(positions)

    def _ensure_slots(self, slots: int) -> None:
        """At least `slots` slots, plus the widest step's padding."""
        if slots + MAX_WIDTH > self.capacity:
            self._allocate(capacity_for(slots + MAX_WIDTH))

    def _allocate(self, capacity: int) -> None:
        old, length = self.cache, self.length
        self.cache = PositionedCache(self.model.config, capacity)
        self.capacity = capacity
        # the buffers are allocated by a one-token eager forward into slot 0, never inside a graph
        self.cache.start = 0
        one = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        with torch.inference_mode():
            model_step(self.model, self.cache, one, one[0], one[0], None, 1)
        for layer in self.cache.layers:  # one graph serves every capacity
            torch._dynamo.mark_dynamic(layer.keys, 2)
            torch._dynamo.mark_dynamic(layer.values, 2)
        if old is not None:
            with torch.inference_mode():  # the buffers are inference tensors
                for new_layer, old_layer in zip(self.cache.layers, old.layers):
                    new_layer.keys[:, :, :length].copy_(old_layer.keys[:, :, :length])
                    new_layer.values[:, :, :length].copy_(old_layer.values[:, :, :length])
        self.length = length

    # --- CachedLM's interface
    def reset(self) -> None:
        self.length = 0  # the buffers are kept: every slot is overwritten before it is attended to
        if self.cache is None:
            self._ensure_slots(0)
        elif self._wanted and self.capacity >= SHRINK_FACTOR * self._wanted:
            self._allocate(self._wanted)  # the same graph: the capacity is a dynamic dimension

    def forward(self, ids: torch.Tensor, keep: int, tree: TreeAttention | None = None) -> torch.Tensor:
        """Append `ids` [n] to the cache; logits [keep, vocab] for the last `keep` positions.
        `tree`: the tokens are branches of a token tree (primitives/tree.py)."""
        n = ids.shape[-1]
        width = self.width_for(n)
        if tree is not None:
            check_tree_attention(self.model)
        one_token_eager = n == 1 and tree is None and self.step.one_token_eager
        if width is None or self.length + width > self.max_positions or one_token_eager:
            logits = self._eager(ids.view(-1), start=self.length, keep=keep, tree=tree)
        else:
            logits = self._padded(ids.view(-1), n, width, tree)[n - keep : n]
            if self.features is not None:
                self.features = self.features[:n]
        self.length += n
        return fit_vocab(logits, self.vocab)

    def keep_path(self, start: int, slots: list[int]) -> None:
        """Move the entries at `slots` (an accepted path through a tree, in order) to start,
        start + 1, ..., and forget everything after them."""
        gather_path(self.cache.layers, start, slots)
        self.truncate(start + len(slots))

    def prefill(self, ids: torch.Tensor) -> None:
        """Fill the cache with `ids`, eagerly: a prompt is read once, in one wide forward that eager
        kernels serve well (and a graph of that width would cost more than it saves)."""
        if ids.numel():
            self._eager(ids.view(-1), start=self.length, keep=1)
            self.length += ids.numel()

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on: the slots stay, masked until overwritten."""
        self.length = min(self.length, length)

    def cached_positions(self) -> int:
        """The slots that hold committed tokens (a static cache keeps no count of its own)."""
        return self.length

    def warmup(self, calls: Iterable[tuple[int, int]]) -> float:
        """Compile ahead what these (tokens, logits kept) forwards need, by running a forward of
        each width not yet compiled; seconds spent. The cache is left empty (the slots written
        are overwritten later)."""
        started = time.perf_counter()
        first_compile = self.settings.enabled and not self.step.widths
        warm = first_compile and compile_choice.warm_cache(self.model, self.device)  # asked before it fills
        self.reset()
        for width in sorted({w for w in (self.width_for(n) for n, _ in calls) if w is not None}):
            if self._compiles(width):
                zeros = torch.zeros(width, dtype=torch.long, device=self.device)
                self._padded(zeros, width, width)
                if self.buckets and self.settings.enabled:  # a CUDA graph's first call warms up, its second records
                    self._padded(zeros, width, width)
        if any(n == 1 for n, _ in calls):
            self._choose_one_token_path()
        self.reset()
        if first_compile and self.settings.enabled:  # `compile: auto` weighs these next time (compile_choice)
            eager, compiled = self.step.one_token_seconds or (None, None)
            compile_choice.record_compile(self.model, self.device, compile_s=self.compile_seconds, warm=warm,
                                          eager_step_s=eager, compiled_step_s=compiled)
        return time.perf_counter() - started

    def _choose_one_token_path(self, runs: int = 3) -> None:
        """On a CPU, time a 1-token forward both ways: padded to MIN_WIDTH through the compiled
        step, and unpadded eager. Where a matrix-vector product is much cheaper than a product of
        two rows (fp32 on AVX2 kernels: 231 ms eager against 345 ms compiled for the 1.5B target),
        plain decoding and drafting run their 1-token steps eagerly; wider ones stay compiled."""
        if self.step.one_token_eager is not None or not self.settings.enabled or self.device.type != "cpu":
            return
        token = torch.zeros(1, dtype=torch.long, device=self.device)

        def median_seconds(forward) -> float:
            times = []
            for _ in range(runs + 1):  # the first: untimed
                self.reset()
                started = time.perf_counter()
                forward()
                times.append(time.perf_counter() - started)
            return sorted(times[1:])[runs // 2]

        padded = median_seconds(lambda: self._padded(token, 1, self.width_for(1)))
        eager = median_seconds(lambda: self._eager(token, start=0, keep=1))
        self.step.one_token_eager = eager < 0.9 * padded
        self.step.one_token_seconds = (eager, padded)
        log.info("%s: a 1-token forward takes %.1f ms eager, %.1f ms compiled at width %d: %s",
                 type(self.model).__name__, 1e3 * eager, 1e3 * padded, self.width_for(1),
                 "1-token steps run eagerly" if self.step.one_token_eager else "all steps run compiled")

    def width_for(self, n: int) -> int | None:
        """The padded width of a forward of n tokens; None: too wide, run it eagerly."""
        if n > MAX_WIDTH:
            return None
        width = max(n, MIN_WIDTH)
        return next((b for b in self.buckets if b >= width), width)

    # --- the two ways to run a forward
    def _padded(self, ids: torch.Tensor, n: int, width: int, tree: TreeAttention | None = None) -> torch.Tensor:
        """A forward of `width` tokens, the first n real, at slots length..; logits of all `width`.
        Every padded step takes an explicit mask, a sequence's (causal) as a tree's, so that one
        graph serves both."""
        self._ensure_slots(self.length + width)
        padded = self._ids[:, :width]
        with torch.inference_mode():  # ids may be inference tensors
            padded[0, :n].copy_(ids, non_blocking=True)
            repeat_last_row(padded[0], n)
        slots = torch.arange(self.length, self.length + width, device=self.device)  # made there: no copy
        # a tensor of its own even where it equals `slots`: an alias would be guarded on, and a
        # tree's step (whose positions differ) would compile a second graph
        positions = slots.clone()
        if tree is not None:
            positions[:n].copy_(tree.positions, non_blocking=True)
        repeat_last_row(positions, n)
        mask = additive_mask(width, self.capacity, self.length, tree, self.model.dtype, self.device)
        repeat_last_row(mask[0, 0], n)
        torch._dynamo.mark_dynamic(padded, 1, min=MIN_WIDTH, max=MAX_WIDTH)
        torch._dynamo.mark_dynamic(slots, 0, min=MIN_WIDTH, max=MAX_WIDTH)
        torch._dynamo.mark_dynamic(positions, 0, min=MIN_WIDTH, max=MAX_WIDTH)
        torch._dynamo.mark_dynamic(mask, 2, min=MIN_WIDTH, max=MAX_WIDTH)
        torch._dynamo.mark_dynamic(mask, 3)
        self.cache.start = self.length
        args = (self.model, self.cache, padded, slots, positions, mask, 0, self.feature_layers)
        # inference mode whatever the caller's (grad mode is part of the graph's guards; freezing needs it off)
        with torch.inference_mode(), self.settings.inductor_config(self.device):
            out = self._first_call(args) if self._compiles(width) else self.step.call(*args)
        return self._outputs(out)

    def _outputs(self, out) -> torch.Tensor:
        """Logits of a step; its features (if asked for) go to `features`. Copied on CUDA, whose
        graphs reuse their output memory."""
        logits, features = out if self.feature_layers else (out, None)
        if self._clone_outputs:
            logits = logits.clone()
            features = None if features is None else features.clone()
        self.features = features
        return logits

    def _compiles(self, width: int) -> bool:
        """Whether a forward of this width compiles: the model's first, and on CUDA the first of
        each bucket (a CUDA graph recording); on CPU one dynamic graph serves every width."""
        return not self.step.widths or (bool(self.buckets) and width not in self.step.widths)

    def _first_call(self, args: tuple) -> torch.Tensor:
        """A forward that compiles (see `_compiles`), timed as compile time."""
        width = args[2].shape[1]
        if self.settings.enabled and compile_failed():
            self._uncompiled()
        if self.settings.enabled and self.on_compile is not None and not self.step.widths:
            self.on_compile(f"compiling {type(self.model).__name__} (once per process)")
        started = time.perf_counter()
        try:
            logits = self.step.call(*args)
        except torch.OutOfMemoryError:
            raise
        except Exception as error:  # noqa: BLE001 - dynamo raises some errors unwrapped, CUDA graphs RuntimeErrors
            # retrying eagerly is safe: a step writes its cache slots by position, so a second run
            # of it (after a failed recording ran part of it) writes the same values again
            note_compile_failure(self.model, error)
            self._uncompiled()
            logits = self.step.call(*args)
        if self.settings.enabled:
            self.compile_seconds += time.perf_counter() - started
        self.step.widths.add(width)
        return logits

    def _uncompiled(self) -> None:
        self.settings = CompileSettings(enabled=False)
        self.step = shared_step(self.model, self.settings, self.device, self.feature_layers)
        self._clone_outputs = False

    def _eager(self, ids: torch.Tensor, start: int, keep: int, tree: TreeAttention | None = None) -> torch.Tensor:
        """An unpadded eager forward of n tokens at slots start.. (prefill, or past MAX_WIDTH)."""
        n = ids.shape[0]
        self._ensure_slots(start + n)
        slots = torch.arange(start, start + n, device=self.device)
        positions, mask = slots, None
        if tree is not None:
            positions = tree.positions.to(self.device)
            mask = additive_mask(n, self.capacity, start, tree, self.model.dtype, self.device)
        self.cache.start = start
        with torch.inference_mode():
            out = model_step(self.model, self.cache, ids.view(1, -1), slots, positions, mask, keep, self.feature_layers)
        self.features = out[1] if self.feature_layers else None
        return (out[0] if self.feature_layers else out)[-keep:]


def repeat_last_row(rows: torch.Tensor, n: int) -> torch.Tensor:
    """Rows n.. (a padded step's pads) set to row n - 1, in place, on the device; returns `rows`."""
    if n < rows.shape[0]:
        rows[n:].copy_(rows[n - 1 : n].expand_as(rows[n:]))
    return rows


def absolute_position_limit(model: torch.nn.Module) -> int:
    """Models with a table of learned positions (GPT-2) cannot embed a pad past its end; rotary ones can."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(config, "rope_parameters", None) or getattr(config, "rope_theta", None):
        return 1 << 62
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 1 << 62
