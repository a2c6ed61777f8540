"""EAGLE / EAGLE-3: one small decoder layer that drafts from the target's own hidden states,
autoregressively, with its own KV cache; a tree grows level by level as a draft model's does
(it is a ModelDrafter over `HeadLM`, an LM made of the head).

The head's cache holds pairs (the target's state of token i, token i + 1). A drafted node is
paired with the head's own output for its parent instead; after the target's verdict those
guesses are dropped and the committed tokens go in with the target's real states (one forward of
the tiny head, in the next proposal's first)."""

from __future__ import annotations

from typing import Sequence

import torch

from ..errors import UsageError
from ..primitives.sampling import fit_vocab
from ..primitives.tree import TreeAttention, additive_mask
from ..specs import DrafterSpec
from .base import DraftContext
from .growth import Level
from .model import ModelDrafter


class HeadLM:
    """The LM interface (lm.LM) over an EAGLE head. Committed tokens are paired, in order, with the
    target states queued by `take`; drafted tokens with the head's output at their parent's slot.
    Eager: the head is one layer, and its logits are what costs."""

    compile_seconds = 0.0

    def __init__(self, head, target: torch.nn.Module, vocab: int):
        self.model = head
        self.embed = head.own_embeddings or target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()
        self.vocab = vocab
        self.device = head.fc.weight.device
        self.reset()

    def reset(self) -> None:
        from .heads import HeadCache

        self.cache = HeadCache()
        self.outputs = torch.empty(0, self.model.shape.hidden, device=self.device, dtype=self.model.fc.weight.dtype)
        self.queue = self.outputs[:0]
        self.length = 0

    def take(self, features: torch.Tensor) -> None:
        with torch.inference_mode():
            self.queue = torch.cat([self.queue, self.model.project(features.to(self.device, self.queue.dtype))])

    def reserve(self, positions: int) -> None:
        """The cache grows as it goes."""

    def warmup(self, calls) -> float:
        return 0.0

    def prefill(self, ids: torch.Tensor) -> None:
        if ids.numel():
            self.forward(ids, keep=1)

    def forward(
        self, ids: torch.Tensor, keep: int, tree: TreeAttention | None = None, parent_slots: list[int] | None = None
    ) -> torch.Tensor:
        """Append `ids` [n]; logits [keep, vocab] of the last `keep`. `parent_slots` None: committed
        tokens (paired with queued target states); else drafted ones, paired with those slots' outputs."""
        n = ids.shape[-1]
        with torch.inference_mode():
            if parent_slots is None:
                hidden, self.queue = self.queue[:n], self.queue[n:]
            else:
                hidden = self.outputs[torch.tensor(parent_slots, device=self.device)]
            positions = tree.positions.to(self.device) if tree is not None else torch.arange(self.length, self.length + n, device=self.device)
            mask = additive_mask(n, self.length + n, self.length, tree, hidden.dtype, self.device)
            embeds = self.embed(ids.view(1, -1).to(self.embed.weight.device)).to(self.device, hidden.dtype)
            out = self.model.step(embeds, hidden.view(1, n, -1), positions.view(1, -1), self.cache.append, mask)[0]
            self.outputs = torch.cat([self.outputs, out])
            self.length += n
            kept = out[-keep:].to(self.lm_head.weight.device)
            return fit_vocab(self.model.logits(kept, self.lm_head), self.vocab)

    def truncate(self, length: int) -> None:
        self.cache.truncate(length)
        self.outputs = self.outputs[:length]
        self.length = min(self.length, length)

    def keep_path(self, start: int, slots: list[int]) -> None:
        """The drafter drops every drafted slot (see EagleDrafter.accept): nothing is gathered."""
        if slots:
            raise ValueError("HeadLM keeps no drafted slots")
        self.truncate(start)

    def cached_positions(self) -> int:
        return self.cache.length


class EagleDrafter(ModelDrafter):
    def __init__(self, head, context: DraftContext, name: str, config: dict):
        from .head_files import feature_layers

        super().__init__(head, context, name, separate_model=False, lm=HeadLM(head, context.target, context.vocab))
        self.feature_layers = feature_layers(head.kind, context.target, config)

    def warmup(self) -> None:
        """Eager: nothing to compile."""

    def begin(self, prompt_ids: torch.Tensor, sampling, noise) -> None:
        """The first prompt token has no state before it: the head's first pair is (state 0, token 1),
        and the rest of the prompt waits for its states (take_features)."""
        self.sampling = sampling
        self.noise = noise
        self.lm.reset()
        self.pending = prompt_ids[1:].to(self.lm.device)
        self.slot_of = None
        self.committed = int(prompt_ids.shape[0])

    def take_features(self, features: torch.Tensor) -> None:
        self.lm.take(features)

    def propose(self, shape, budget=None):
        if not self.pending.numel():  # a one-token prompt: no (state, token) pair to draft from yet
            return None
        return super().propose(shape, budget)

    def _forward_nodes(self, levels: list[Level], nodes: list[int], ids: torch.Tensor, tree) -> torch.Tensor:
        parents = [p for lv in levels for p in lv.parents]
        parent_slots = [self.slot_of.get(parents[node], self.base - 1) for node in nodes]
        return self.lm.forward(ids, keep=len(nodes), tree=tree, parent_slots=parent_slots)

    def accept(self, new_tokens: Sequence[int], path: Sequence[int]) -> None:
        """Drop every drafted slot (they were fed the head's guesses): all committed tokens wait
        in `pending` for their real states."""
        super().accept(new_tokens, ())


def build(spec: DrafterSpec, context: DraftContext) -> EagleDrafter:
    from .head_files import load_head

    reference = spec.options.get("head")
    if not reference:
        raise UsageError("drafter.head: give the folder (or hub id) of the EAGLE head, e.g. head: ~/.cache/specdec/heads/NAME")
    head, config = load_head(reference, context.target, kind="eagle", allow_pickle=context.allow_pickle)
    if head.kind == "medusa":
        raise UsageError(f"drafter.head: '{reference}' holds Medusa heads; use kind: medusa with heads: {reference}")
    return EagleDrafter(head, context, "eagle-3" if head.kind == "eagle3" else "eagle", config)
