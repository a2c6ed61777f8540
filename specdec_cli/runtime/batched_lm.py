"""A causal LM over a batch of sequences in one KV cache, each row as long as its own sequence and
rolled back on its own.

Every forward appends T columns to every row; a row with fewer real tokens pads with dummies. A
column holds a token of its row only where `valid` says so: pads and rejected drafts stay in the
cache as holes that no later token attends to (a 4D mask). A token's position id is the count of
valid tokens before it in its row, so RoPE (or learned positions) sees each row as if it ran
alone (a pad takes the position before it). Keys are stored already rotated, so moving a column never changes what it holds: compact()
gathers each row's valid columns to the right end (left padding) once the holes pass a bound,
so that attention stops paying for them.

A new row is prefilled alone (the same forward as batch-1 decoding) and joins at the bottom; a
finished row is dropped. `valid` lives on the host: every mask is built there, one copy a forward.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

import torch

from ..errors import UsageError
from ..models.properties import input_device
from ..primitives.sampling import fit_vocab
from ..primitives.tree import row_block
from .forward_parts import batch_features, check_tree_attention, pick_features

log = logging.getLogger("specdec")


class BatchedLM:
    """One model plus one DynamicCache of B rows; `valid` [B, W] (host) marks each row's tokens."""

    def __init__(self, model: torch.nn.Module, vocab: int, slack: int = 16):
        """`slack`: how many columns past the longest row the cache may grow before compact()."""
        from transformers import DynamicCache

        check_tree_attention(model, "batched decoding needs", "use --batch-size 1")
        self.model = model
        self.vocab = vocab
        self.slack = slack
        self.device = input_device(model)
        self.cache = DynamicCache(config=model.config)
        kinds = {type(layer).__name__ for layer in self.cache.layers}
        if kinds != {"DynamicLayer"}:
            raise UsageError(
                f"batched decoding needs full-attention caches; {type(model).__name__} uses {', '.join(sorted(kinds))}: "
                "use --batch-size 1"
            )
        self.valid = torch.zeros(0, 0, dtype=torch.bool)
        self.feature_layers: tuple[int, ...] = ()
        self.features: torch.Tensor | None = None  # the last forward's states at feature_layers [B, T, F]
        self.prefill_features: torch.Tensor | None = None  # the last add_row's [n, F]

    def want_features(self, layers: tuple[int, ...]) -> None:
        """From now on keep the target's hidden states at `layers` (forward_parts.pick_features)
        of every forward and prefill: what draft heads read."""
        self.feature_layers = tuple(layers)

    @property
    def rows(self) -> int:
        return self.valid.shape[0]

    @property
    def width(self) -> int:
        return self.valid.shape[1]

    def lengths(self) -> list[int]:
        """Each row's count of cached tokens."""
        return self.valid.sum(dim=1).tolist()

    def warmup(self, widths) -> float:
        """Eager steps: nothing to compile."""
        return 0.0

    # --- rows joining and leaving
    def reserve(self, positions: int) -> None:
        """A DynamicCache grows as it goes: nothing to reserve."""

    def add_row(self, ids: torch.Tensor) -> None:
        """A new last row holding `ids` [n] (n may be 0), prefilled alone."""
        from transformers import DynamicCache

        own = DynamicCache(config=self.model.config)
        self.prefill_features = None
        if ids.numel():
            with torch.inference_mode():
                out = self.model(input_ids=ids.view(1, -1).to(self.device), cache=own, use_cache=True, logits_to_keep=1,
                                 output_hidden_states=bool(self.feature_layers))
            if self.feature_layers:
                self.prefill_features = pick_features(out.hidden_states, self.feature_layers)
        n = int(ids.numel())
        width = max(self.width, n)
        with torch.inference_mode():  # cache buffers are inference tensors
            for layer, mine in zip(self.cache.layers, own.layers):
                if not (layer.is_initialized or mine.is_initialized):
                    continue  # no row holds a token yet: the first forward sizes this layer
                like = mine if mine.is_initialized else layer
                shape = (like.keys.shape[1], like.keys.shape[3])
                if not layer.is_initialized:
                    layer.lazy_initialization(mine.keys, mine.values)
                    layer.keys = layer.values = mine.keys.new_zeros(self.rows, shape[0], 0, shape[1])
                if not mine.is_initialized:
                    mine.keys = mine.values = layer.keys.new_zeros(1, shape[0], 0, shape[1])
                layer.keys = torch.cat([_left_pad(layer.keys, width), _left_pad(mine.keys, width)])
                layer.values = torch.cat([_left_pad(layer.values, width), _left_pad(mine.values, width)])
        row = torch.arange(width) >= width - n
        self.valid = torch.cat([_left_pad(self.valid, width, dim=1), row[None]])
        self.compact_if_wide()

    def extend_row(self, row: int, have: Sequence[int], more: Sequence[int]) -> None:
        """Row `row`, which holds `have`, now holds have + more, read in a forward alone. This
        cache cannot grow one row alone: the row is prefilled anew at the bottom and put in its place."""
        self.add_row(torch.tensor([*have, *more], dtype=torch.long))
        last = self.rows - 1
        self.remove_rows([last if b == row else b for b in range(last)])

    def remove_rows(self, keep: Sequence[int]) -> None:
        """Keep only the rows `keep`, in that order."""
        index = torch.tensor(list(keep), dtype=torch.long)
        with torch.inference_mode():
            for layer in self._live_layers():
                where = index.to(layer.keys.device)
                layer.keys, layer.values = layer.keys.index_select(0, where), layer.values.index_select(0, where)
        self.valid = self.valid.index_select(0, index)
        self.compact_if_wide()

    # --- decoding
    def forward(self, ids: torch.Tensor, real: torch.Tensor, trees: Sequence[Sequence[int] | None] | None = None,
                ) -> torch.Tensor:
        """Append ids [B, T] to every row; logits [B, T, vocab]. `real` [B, T] (host, bool): which
        of them are the row's tokens; each row's real tokens come first, the rest are pads.
        `trees`: per row None, or the parents of a token tree whose root is the row's first token
        (primitives/tree.py): its nodes see the root and their own ancestors, at depth positions."""
        # the j-th real token of a row sits at (its cached tokens + j); a pad repeats the position
        # before it, so that no position passes the row's own (learned positions end at the context)
        offsets = real.cumsum(dim=1) - 1
        new = torch.ones(real.shape[1], real.shape[1], dtype=torch.bool).tril().expand(*real.shape, -1)
        if trees is not None and any(tree is not None for tree in trees):
            new, offsets = new.clone(), offsets.clone()
            for b, tree in enumerate(trees):
                if tree is not None:
                    new[b], offsets[b] = row_block(tree, real.shape[1])
        positions = (self.valid.sum(dim=1, keepdim=True) + offsets).clamp_min(0)
        mask = self._mask(new)
        with torch.inference_mode():
            out = self.model(
                input_ids=ids.to(self.device, non_blocking=True),
                attention_mask=mask,
                position_ids=positions.to(self.device, non_blocking=True),
                cache=self.cache,
                use_cache=True,
                output_hidden_states=bool(self.feature_layers),
            )
        if self.feature_layers:
            self.features = batch_features(out.hidden_states, self.feature_layers)
        self.valid = torch.cat([self.valid, real], dim=1)
        return fit_vocab(out.logits, self.vocab)

    def _mask(self, new: torch.Tensor) -> torch.Tensor:
        """Additive [B, 1, T, W + T] on the model's device: a new token sees its row's valid columns
        and, of the new tokens, those `new` [B, T, T] says (causal, or a tree's ancestors; each row's
        real tokens come first, so no real token sees a pad). Which is seen is known on the host;
        it crosses as booleans and becomes the model's dtype on the device."""
        rows, t, _ = new.shape
        seen = torch.cat([self.valid[:, None, :].expand(rows, t, self.width), new], dim=2)
        seen = seen.to(self.device, non_blocking=True)
        dtype = self.model.dtype
        mask = torch.zeros(seen.shape, dtype=dtype, device=self.device).masked_fill_(~seen, torch.finfo(dtype).min)
        return mask[:, None]

    def keep_new(self, kept: Sequence[int], since: int) -> None:
        """Of the columns from `since` on, row b keeps its first kept[b] valid ones (the pending
        tokens and the accepted drafts); the rest become holes."""
        tail = self.valid[:, since:]
        tail &= tail.cumsum(dim=1) <= torch.tensor(list(kept))[:, None]
        self.compact_if_wide()

    def keep_columns(self, columns: Sequence[Sequence[int]], since: int) -> None:
        """Of the columns from `since` on (one forward's), row b keeps those at the offsets
        columns[b] (a tree's root and accepted path); the rest become holes. Keys are stored
        rotated at their positions, so a kept node needs no moving."""
        kept = torch.zeros_like(self.valid[:, since:])
        for b, offsets in enumerate(columns):
            kept[b, list(offsets)] = True
        self.valid[:, since:] &= kept
        self.compact_if_wide()

    def compact_if_wide(self) -> None:
        """compact() once the cache is more than `slack` columns wider than its longest row."""
        if self.rows and self.width - max(self.lengths()) > self.slack:
            self.compact()

    def compact(self) -> None:
        """Gather each row's valid columns, in order, to the right end; width = the longest row."""
        lengths = self.valid.sum(dim=1)
        width = int(lengths.max()) if self.rows else 0
        # a stable sort puts each row's holes first and its tokens after them, both in order
        index = torch.sort(self.valid.to(torch.int8), dim=1, stable=True).indices[:, self.width - width :]
        with torch.inference_mode():
            for layer in self._live_layers():
                heads, dim = layer.keys.shape[1], layer.keys.shape[3]
                where = index.to(layer.keys.device)[:, None, :, None].expand(-1, heads, -1, dim)
                layer.keys, layer.values = layer.keys.gather(2, where), layer.values.gather(2, where)
        self.valid = torch.arange(width)[None, :] >= (width - lengths)[:, None]

    def row_cache(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (keys, values) [heads, n, head_dim] of the row's valid columns (for tests)."""
        columns = self.valid[row].nonzero().view(-1)
        return [(layer.keys[row][:, columns.to(layer.keys.device)], layer.values[row][:, columns.to(layer.keys.device)])
                for layer in self._live_layers()]

    def _live_layers(self):
        return [layer for layer in self.cache.layers if layer.is_initialized]


def _left_pad(tensor: torch.Tensor, width: int, dim: int = 2) -> torch.Tensor:
    """Zeros (or False) before the entries along `dim`, up to `width`."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def make_batched_lm(model: torch.nn.Module, vocab: int, compile: str = "off", *, slack: int = 16, rows_hint: int = 2,
                    on_compile: Callable[[str], None] | None = None):
    """The batch's LM for `compile` (make_lm's values): "off" -> BatchedLM (a DynamicCache, eager),
    "on" -> BatchedStaticLM (a static cache of rows, compiled steps), "static" -> BatchedStaticLM
    with eager steps (its logic apart from the compiler). A model whose cache layout the static
    cache does not serve falls back to BatchedLM, with a warning."""
    if compile == "off":
        return BatchedLM(model, vocab, slack)
    if compile not in ("on", "static"):
        raise ValueError(f"make_batched_lm: compile must be 'off', 'on' or 'static', not '{compile}'")
    from .batched_static import BatchedStaticLM
    from .compiled_step import CompileSettings
    from .static_cache import StaticCacheUnsupported

    try:
        return BatchedStaticLM(model, vocab, settings=CompileSettings(enabled=compile == "on"), rows_hint=rows_hint,
                               on_compile=on_compile)
    except StaticCacheUnsupported as error:
        log.warning("compile: on is not available for %s in a batch (%s): decoding uncompiled",
                                             type(model).__name__, error)
        return BatchedLM(model, vocab, slack)
