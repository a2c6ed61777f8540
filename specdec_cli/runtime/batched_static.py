"""BatchedLM's interface over a static cache and compiled steps: batched decoding under `compile: on`.

The cache holds P physical rows [P, kv_heads, capacity, head_dim] per layer, and each row of the
batch owns one of them, in which its tokens sit at slots 0..length-1 (a token's slot is its
position). A forward of T columns writes row b's column j at slot length[b] + j: its real tokens
first, then pads, which its length never counts, so that a later forward overwrites them; rolling
back rejected drafts is lowering the length. So there are no holes and nothing to compact: each
query attends to its row's slots up to its own (a causal mask per row over the capacity; the CPU
attention kernel skips the masked slots).

A joining row is prefilled alone, eagerly, into a free physical row; a leaving row frees its own.
Physical rows still free at a forward (the end of a prompt file) are given back, the live ones
moved to the first rows, so that no forward computes an empty row (at least MIN_ROWS: a dynamic
size of 1 would be specialized).

Compiling: two graphs per model, both dynamic in the rows and in the capacity, one for T = 1
(plain decoding, a draft model's steps) and one for T = 2..MAX_WIDTH (verifies, a draft's first
read): a single graph would pad T = 1 to 2, twice the rows, which a batch on a CPU (where the
matmuls of a batch are compute-bound) pays in full. On CPU each frozen graph holds its own packed
copy of the weights.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, Sequence

import torch

from ..cache_dirs import inductor_cache_dir
from ..kernels import cpu_attention
from ..models.properties import input_device
from ..primitives.sampling import fit_vocab
from ..primitives.tree import row_block
from ..specs import MAX_K
from .compiled_step import CompileSettings, compile_failed, model_step, note_compile_failure, shared_step
from .forward_parts import batch_features, check_tree_attention
from .static import absolute_position_limit
from .static_cache import PositionedCache, RowsCache, capacity_for, check_one_device, check_supported

log = logging.getLogger("specdec")

MIN_ROWS = 2
MAX_ROWS = 1024  # the largest batch bench takes
MAX_WIDTH = MAX_K + 1  # a verify of k = MAX_K drafts and the pending token


def batch_step(model, cache, ids, slots, positions, mask, layers=()):
    """One forward of ids [P, T], row b's column j written at slots[b, j] and seen at
    positions[b, j], attending by mask [P, 1, T, capacity]; logits [P, T, V], and with `layers`
    also those hidden states [P, T, F] (forward_parts.batch_features)."""
    cache.slots = slots
    out = model(input_ids=ids, position_ids=positions, attention_mask=mask, cache=cache, use_cache=True,
                output_hidden_states=bool(layers))
    if layers:
        return out.logits, batch_features(out.hidden_states, layers)
    return out.logits


class BatchedStaticLM:
    """BatchedLM's interface (add_row / remove_rows / forward / keep_new / lengths / width) over
    a static cache of rows and compiled steps. `CompileSettings(enabled=False)` runs the same
    steps eagerly: the cache's logic apart from the compiler."""

    def __init__(self, model: torch.nn.Module, vocab: int, *, settings: CompileSettings = CompileSettings(),
                 rows_hint: int = MIN_ROWS, on_compile: Callable[[str], None] | None = None):
        """`rows_hint`: the physical rows to allocate at first (the batch size), so that rows
        joining one by one do not reallocate the cache each time."""
        inductor_cache_dir()  # before torch's compiler loads: it fixes its cache dir when first asked
        import torch._dynamo  # noqa: F401 - here, not at import: a second of start-up for every command

        check_supported(model.config)
        check_one_device(model)
        check_tree_attention(model, "batched decoding needs", "use --batch-size 1")
        self.device = input_device(model)
        if self.device.type == "cpu":
            cpu_attention.use_on(model)
        self.model = model
        self.vocab = vocab
        self.settings = settings.for_model(model)
        self.rows_hint = max(MIN_ROWS, rows_hint)
        self.on_compile = on_compile
        self.feature_layers: tuple[int, ...] = ()
        self.features: torch.Tensor | None = None  # the last forward's states at feature_layers [B, T, F]
        self.prefill_features: torch.Tensor | None = None  # the last add_row's [n, F]
        self.step = shared_step(model, self.settings, self.device, step=batch_step)
        self.max_positions = absolute_position_limit(model)
        self.cache: RowsCache | None = None
        self.capacity = 0
        self._lengths: list[int] = []  # per row of the batch: its tokens in the cache
        self._slot_of: list[int] = []  # per row of the batch: its physical row
        self._columns = 0  # columns appended so far: the marks keep_new is given (`width`)
        self._before: dict[int, list[int]] = {}  # the lengths before the forward at each mark
        self.compile_seconds = 0.0

    def want_features(self, layers: tuple[int, ...]) -> None:
        """From now on keep the hidden states at `layers` of every forward and prefill (a graph of
        their own: the step returns them too)."""
        self.feature_layers = tuple(layers)
        self.step = shared_step(self.model, self.settings, self.device, self.feature_layers, step=batch_step)

    @property
    def rows(self) -> int:
        return len(self._slot_of)

    @property
    def width(self) -> int:
        """A mark for keep_new: the columns appended so far."""
        return self._columns

    @property
    def physical_rows(self) -> int:
        return 0 if self.cache is None else self.cache.layers[0].keys.shape[0]

    def lengths(self) -> list[int]:
        """Each row's count of cached tokens."""
        return list(self._lengths)

    # --- rows joining and leaving
    def reserve(self, positions: int) -> None:
        """Nothing reserved ahead: every row's steps attend over the whole capacity, so it grows
        only as the longest row needs."""

    def add_row(self, ids: torch.Tensor) -> None:
        """A new last row holding `ids` [n] (n may be 0), prefilled alone into a free physical row."""
        n = int(ids.numel())
        free = sorted(set(range(self.physical_rows)) - set(self._slot_of))
        if not free or n + MAX_WIDTH > self.capacity:
            rows = self.physical_rows if free else max(self.rows_hint, self.rows + 1)
            self._reallocate(rows, max(self.capacity, capacity_for(max([n, *self._lengths]) + MAX_WIDTH)))
            free = sorted(set(range(self.physical_rows)) - set(self._slot_of))
        slot = free[0]
        self.prefill_features = None
        if n:
            self._prefill(slot, ids)
        self._slot_of.append(slot)
        self._lengths.append(n)
        self._before.clear()

    def extend_row(self, row: int, have: Sequence[int], more: Sequence[int]) -> None:
        """Row `row`, which holds `have`, now holds have + more: `more` read in a forward alone, at
        the row's slots after its tokens."""
        start = self._lengths[row]
        if start + len(more) + MAX_WIDTH > self.capacity:
            self._reallocate(self.physical_rows, capacity_for(max(self._lengths) + len(more) + MAX_WIDTH))
        self._prefill(self._slot_of[row], torch.tensor(list(more), dtype=torch.long), start)
        self._lengths[row] = start + len(more)
        self._before.clear()

    def remove_rows(self, keep: Sequence[int]) -> None:
        """Keep only the rows `keep`, in that order; the others' physical rows are free."""
        self._slot_of = [self._slot_of[b] for b in keep]
        self._lengths = [self._lengths[b] for b in keep]
        self._before.clear()

    def _prefill(self, slot: int, ids: torch.Tensor, start: int = 0) -> None:
        """A forward of ids alone (batch-1, eager: StaticLM's prefill) into physical row `slot`, at
        slots start..; the row's slots before `start` hold its earlier tokens."""
        view = PositionedCache(self.model.config, self.capacity)
        for mine, layer in zip(view.layers, self.cache.layers):
            mine.keys, mine.values = layer.keys[slot : slot + 1], layer.values[slot : slot + 1]
            mine.is_initialized = True
        slots = torch.arange(start, start + ids.numel(), device=self.device)
        view.start = start
        with torch.inference_mode():
            out = model_step(self.model, view, ids.view(1, -1).to(self.device), slots, slots, None, 1, self.feature_layers)
        if self.feature_layers:
            self.prefill_features = out[1]

    def _reallocate(self, rows: int, capacity: int) -> None:
        """New buffers of `rows` physical rows and `capacity` slots; the batch's rows move to the
        first physical rows, in order, with their tokens."""
        shapes = self._layer_shapes()
        buffers = [(torch.zeros(rows, heads, capacity, dim, dtype=dtype, device=self.device),
                    torch.zeros(rows, heads, capacity, value_dim, dtype=dtype, device=self.device))
                   for heads, dim, value_dim, dtype in shapes]
        if self.cache is not None and self._slot_of:
            moved = torch.tensor(self._slot_of, device=self.device)
            span = min(self.capacity, capacity)
            with torch.inference_mode():
                for (keys, values), layer in zip(buffers, self.cache.layers):
                    keys[: len(moved), :, :span] = layer.keys.index_select(0, moved)[:, :, :span]
                    values[: len(moved), :, :span] = layer.values.index_select(0, moved)[:, :, :span]
        self.cache = RowsCache(self.model.config, buffers)
        self.capacity = capacity
        self._slot_of = list(range(self.rows))
        for layer in self.cache.layers:  # one graph serves every number of rows and every capacity
            for tensor in (layer.keys, layer.values):
                torch._dynamo.mark_dynamic(tensor, 0, min=MIN_ROWS, max=MAX_ROWS)
                torch._dynamo.mark_dynamic(tensor, 2)

    def _layer_shapes(self) -> list[tuple[int, int, int, torch.dtype]]:
        """Per layer (kv heads, key dim, value dim, dtype), read off a one-token eager forward
        into a batch-1 cache (the model's own attention says what it stores)."""
        if self.cache is not None:
            return [(layer.keys.shape[1], layer.keys.shape[3], layer.values.shape[3], layer.keys.dtype)
                    for layer in self.cache.layers]
        probe = PositionedCache(self.model.config, 1)
        one = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        probe.start = 0
        with torch.inference_mode():
            model_step(self.model, probe, one, one[0], one[0], None, 1)
        return [(layer.keys.shape[1], layer.keys.shape[3], layer.values.shape[3], layer.keys.dtype)
                for layer in probe.layers]

    # --- decoding
    def forward(self, ids: torch.Tensor, real: torch.Tensor, trees: Sequence[Sequence[int] | None] | None = None,
                ) -> torch.Tensor:
        """Append ids [B, T] to every row; logits [B, T, vocab]. `real` [B, T] (host, bool): which
        of them are the row's tokens; each row's real tokens come first, the rest are pads.
        `trees`: per row None, or the parents of a token tree whose root is the row's first token:
        its nodes see the root and their own ancestors, at depth positions (BatchedLM.forward)."""
        rows, width = real.shape
        needed = max(self._lengths) + width
        if self.physical_rows != max(MIN_ROWS, rows) or needed > self.capacity:
            self._reallocate(max(MIN_ROWS, rows), max(self.capacity, capacity_for(needed + MAX_WIDTH)))
        where = torch.tensor(self._slot_of, device=self.device)
        full = torch.zeros(self.physical_rows, width, dtype=torch.long, device=self.device)
        full[where] = ids.to(self.device, non_blocking=True)
        starts = torch.zeros(self.physical_rows, dtype=torch.long)
        starts[torch.tensor(self._slot_of)] = torch.tensor(self._lengths)
        logits = self._step(full, starts.to(self.device, non_blocking=True), self._tree_blocks(trees, width))
        if self.feature_layers:
            logits, features = logits
            self.features = features.index_select(0, where)
        self._before[self._columns] = list(self._lengths)
        self._columns += width
        self._lengths = [n + int(count) for n, count in zip(self._lengths, real.sum(dim=1).tolist())]
        return fit_vocab(logits.index_select(0, where), self.vocab)

    def _tree_blocks(self, trees: Sequence[Sequence[int] | None] | None, width: int,
                     ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Per physical row (visible [P, T, T], offsets [P, T]) where a row verifies a tree; None
        where every row's tokens are a sequence (the causal step, made on the device)."""
        if trees is None or all(tree is None for tree in trees):
            return None
        visible = torch.ones(width, width, dtype=torch.bool).tril().repeat(self.physical_rows, 1, 1)
        offsets = torch.arange(width).repeat(self.physical_rows, 1)
        for slot, tree in zip(self._slot_of, trees):
            if tree is not None:
                visible[slot], offsets[slot] = row_block(tree, width)
        return visible.to(self.device, non_blocking=True), offsets.to(self.device, non_blocking=True)

    def keep_new(self, kept: Sequence[int], since: int) -> None:
        """Of the tokens appended since the mark `since` (a `width`), row b keeps its first kept[b]."""
        before = self._before[since]
        self._lengths = [n + keep for n, keep in zip(before, kept)]
        self._before.clear()

    def keep_columns(self, columns: Sequence[Sequence[int]], since: int) -> None:
        """Of one forward's columns from the mark `since`, row b keeps those at the offsets
        columns[b] (a tree's root and accepted path, ascending), gathered into consecutive slots
        after its earlier tokens (keys are stored rotated at their positions: a move changes nothing)."""
        before = self._before[since]
        physical, source, target = [], [], []
        for b, offsets in enumerate(columns):
            for i, offset in enumerate(offsets):
                if offset != i:
                    physical.append(self._slot_of[b])
                    source.append(before[b] + offset)
                    target.append(before[b] + i)
        if physical:
            rows, source, target = (torch.tensor(v, device=self.device) for v in (physical, source, target))
            with torch.inference_mode():
                for layer in self.cache.layers:
                    for tensor in (layer.keys, layer.values):
                        tensor[rows, :, target] = tensor[rows, :, source]
        self._lengths = [n + len(offsets) for n, offsets in zip(before, columns)]
        self._before.clear()

    def row_cache(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (keys, values) [heads, n, head_dim] of the row's tokens (for tests)."""
        slot, n = self._slot_of[row], self._lengths[row]
        return [(layer.keys[slot][:, :n], layer.values[slot][:, :n]) for layer in self.cache.layers]

    # --- compiling
    def warmup(self, widths: Iterable[int]) -> float:
        """Compile ahead the graphs that forwards of these widths use, before any row joins (a
        batch's first steps then measure decoding, not compiling); seconds spent."""
        started = time.perf_counter()
        if self._slot_of:
            return 0.0  # rows are running: their forwards compile as they come
        if self.cache is None:
            self._reallocate(self.rows_hint, capacity_for(MAX_WIDTH))
        for width in sorted({min(max(w, 1), 2) for w in widths}):
            if width not in self.step.widths:
                ids = torch.zeros(self.physical_rows, width, dtype=torch.long, device=self.device)
                self._step(ids, torch.zeros(self.physical_rows, dtype=torch.long, device=self.device))
        return time.perf_counter() - started

    def _step(self, ids: torch.Tensor, starts: torch.Tensor, trees: tuple[torch.Tensor, torch.Tensor] | None = None,
              ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The step over every physical row: row b's tokens at slots starts[b].. (logits [P, T, V],
        and the states [P, T, F] where features are wanted); `trees`: _tree_blocks' masks and offsets."""
        rows, width = ids.shape
        slots = starts[:, None] + torch.arange(width, device=self.device)
        if trees is None:
            positions = slots.clamp_max(self.max_positions - 1)  # learned positions end at the table (GPT-2)
            allowed = torch.arange(self.capacity, device=self.device) <= slots[:, :, None]
        else:  # the prefix, then the tree's own visibility over this step's slots
            visible, offsets = trees
            positions = (starts[:, None] + offsets).clamp_max(self.max_positions - 1)
            allowed = torch.arange(self.capacity, device=self.device) < starts[:, None, None]
            allowed = allowed.expand(rows, width, self.capacity).clone()
            allowed.scatter_(2, slots[:, None, :].expand(rows, width, width), visible)
        mask = torch.zeros(allowed.shape, dtype=self.model.dtype, device=self.device)
        mask = mask.masked_fill_(~allowed, torch.finfo(self.model.dtype).min)[:, None]
        args = (self.model, self.cache, ids, slots, positions, mask, self.feature_layers)
        if width > MAX_WIDTH:  # a draft catching up on many tokens: rare, and wide enough for eager kernels
            with torch.inference_mode():
                return batch_step(*args)
        for tensor, width_dim in ((ids, 1), (slots, 1), (positions, 1), (mask, 2)):
            torch._dynamo.mark_dynamic(tensor, 0, min=MIN_ROWS, max=MAX_ROWS)
            if width > 1:  # a width of 1 is a graph of its own
                torch._dynamo.mark_dynamic(tensor, width_dim, min=2, max=MAX_WIDTH)
        torch._dynamo.mark_dynamic(mask, 3)
        graph = 1 if width == 1 else 2
        with torch.inference_mode(), self.settings.inductor_config(self.device):
            if graph in self.step.widths:
                return self.step.call(*args)
            return self._first_call(args, graph)

    def _uncompiled(self) -> None:
        self.settings = CompileSettings(enabled=False)
        self.step = shared_step(self.model, self.settings, self.device, self.feature_layers, step=batch_step)

    def _first_call(self, args: tuple, graph: int) -> torch.Tensor:
        """A forward that compiles a graph, timed as compile time; a compile that fails leaves
        this LM eager, with one line (a step writes its slots by position: running it again is safe)."""
        if self.settings.enabled and compile_failed():
            self._uncompiled()
        if self.settings.enabled and self.on_compile is not None:
            self.on_compile(f"compiling {type(self.model).__name__}'s batched step (once per process)")
        started = time.perf_counter()
        try:
            out = self.step.call(*args)
        except torch.OutOfMemoryError:
            raise
        except Exception as error:  # noqa: BLE001 - dynamo raises some errors unwrapped
            note_compile_failure(self.model, error)
            self._uncompiled()
            out = self.step.call(*args)
        if self.settings.enabled:
            self.compile_seconds += time.perf_counter() - started
        self.step.widths.add(graph)
        return out
