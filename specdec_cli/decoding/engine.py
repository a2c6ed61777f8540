"""The decoding loop: prefill, then draft -> verify -> commit, one target forward per step.

A draft is a token tree (tree.py); a chain is the tree whose parents are the previous nodes, so
chains and trees share every line. Plain autoregressive decoding is the same loop with no drafter
(every step verifies zero drafts and keeps the target's own token), so the baseline shares every
line of caching and sampling. The engine yields events and never prints; timing and `k: auto`
learn from the events.

Above temperature 0 each token is the target's seeded choice at its position (sampling.py), made
from noise keyed by (seed, position): the same seed gives the same text for any k, tree or drafter.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterator, Sequence

import torch

from ..drafters.base import Draft, Drafter, DraftPart
from ..errors import ContextLengthError
from ..models.devices import PhaseTimer, device_clock
from ..models.lm import make_lm
from ..models.quantize import head_device
from ..specs import AdaptiveSpec, SamplingSpec, TreeSpec
from .acceptance import accept
from .events import Event, Finished, JudgedNode, JudgedPart, Prefilled, Verified
from .lookahead import make_lookahead
from .sampling import PositionNoise, choose
from .stack_room import with_stack_room
from .stats import DecodeStats
from .tree import TreeAttention, depths, path_to

log = logging.getLogger("specdec")


# given every generated id (this step's last), how many to keep when a stop text has just
# appeared among this step's tokens, else None (api.StopTexts)
StopCheck = Callable[[Sequence[int], int], "int | None"]


def cut_at_stop(
    new_tokens: list[int], produced: int, limit: int, eos_ids: frozenset[int],
    stop: StopCheck | None = None, generated: Sequence[int] = (),
) -> tuple[list[int], str | None]:
    """The part of this step's tokens that may be emitted, and why generation ends (if it does).

    Nothing passes max_new_tokens, the first EOS or the token that completes a stop text, not
    even an accepted run of drafts.
    """
    kept = new_tokens[: limit - produced]
    reason = None
    for i, token in enumerate(kept):
        if token in eos_ids:
            kept, reason = kept[: i + 1], "eos"
            break
    if stop is not None and kept:
        keep = stop(list(generated) + kept, len(kept))
        if keep is not None:
            return kept[: keep - produced], "stop"
    if reason is None and produced + len(kept) >= limit:
        reason = "length"
    return kept, reason


def token_limit(context_length: int | None, prompt_tokens: int, max_new_tokens: int) -> int:
    """max_new_tokens, cut to what fits after a prompt of this length (no cut when the model states
    no context length); ContextLengthError when nothing fits."""
    if context_length is None:
        return max_new_tokens
    room = context_length - prompt_tokens
    if room < 1:
        raise ContextLengthError(
            f"the prompt is {prompt_tokens} tokens, and the model's context is {context_length}; shorten it"
        )
    return min(max_new_tokens, room)


class SpeculativeDecoder:
    """Speculative decoding of one target with one drafter (or none: plain decoding).

    The target's cache holds every committed token but the last, which is fed with the next
    step's drafts; after each step both caches hold exactly the committed sequence.
    """

    def __init__(
        self,
        target: torch.nn.Module,
        drafter: Drafter | None,
        *,
        vocab: int,
        eos_ids: frozenset[int],
        k: int | str = 5,
        adaptive: AdaptiveSpec = AdaptiveSpec(),
        tree: TreeSpec | None = None,
        context_length: int | None = None,
        compile: str = "off",
        on_compile: Callable[[str], None] | None = None,
    ):
        # compile "off": a DynamicCache, eager (CachedLM); "on": a static cache and a compiled step
        # (compiled.StaticLM); "auto" is resolved by the caller (lm.resolve_compile)
        self.compile = compile
        self.lm = make_lm(target, vocab, compile, on_compile=on_compile)
        self.vocab = vocab
        self.compile_seconds = 0.0  # ahead-of-decoding compile time (warmup), never in decode timings
        self._warm_for: int | None = None  # the k limit whose step widths are compiled
        self.drafter = drafter
        self.eos_ids = eos_ids
        self.k = k if drafter is not None else 0
        self.adaptive = adaptive
        self.tree = tree if drafter is not None else None
        self.context_length = context_length
        self.output_device = head_device(target)
        # k: auto and tree: auto learn acceptance and costs of this pair on this machine, kept
        # across this decoder's generations (generate --samples and bench repeats reuse one decoder)
        self.lookahead = make_lookahead(self.k, adaptive.k_max, adaptive.threshold, self.tree)
        # heads that draft from the target's hidden states (Medusa, EAGLE) read them off each forward
        self.feature_layers: tuple[int, ...] = tuple(drafter.feature_layers) if drafter is not None else ()
        if self.feature_layers:
            self.lm.want_features(self.feature_layers)

    @property
    def k_limit(self) -> int:
        """The deepest a draft can go (a chain's k)."""
        if self.tree is not None:
            return self.tree.depth
        return self.adaptive.k_max if self.k == "auto" else int(self.k)

    @property
    def node_limit(self) -> int:
        """The most tokens a draft can hold (the widest verify is one more)."""
        return self.tree.nodes if self.tree is not None else self.k_limit

    def reserve(self, positions: int) -> None:
        """Static caches: room for `positions` tokens in the target's and the drafter's caches."""
        if self.compile == "off":
            return
        self.lm.reserve(positions)
        if self.drafter is not None:
            self.drafter.reserve(positions + self.node_limit)

    def warmup(self) -> float:
        """Compile the target's step and the drafter's, and run every width this decoder can take
        (1..nodes+1 tokens) once, per node limit; seconds spent. A no-op with compile off."""
        if self.compile == "off" or self._warm_for == self.node_limit:
            return 0.0
        started = time.perf_counter()
        # a verify of n tokens keeps all n rows; plain decoding's one token keeps one
        # on a fresh frame-stack chunk, as the steps will run: the eager/compiled choice times forwards
        with_stack_room(self.lm.warmup, [(n, n) for n in range(1, self.node_limit + 2)])
        if self.drafter is not None:
            with_stack_room(self.drafter.warmup)
        self._warm_for = self.node_limit
        seconds = time.perf_counter() - started
        self.compile_seconds += seconds
        return seconds

    def stream(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        *,
        max_new_tokens: int,
        sampling: SamplingSpec = SamplingSpec(),
        seed: int = 0,
        stop: StopCheck | None = None,
    ) -> Iterator[Event]:
        """Prefilled, one Verified per step, then Finished. Each step runs on a fresh chunk of
        CPython's frame stack, so that its cost does not depend on the caller's depth (stack_room.py).
        `stop`: ends generation where a stop text appears (finish reason "stop")."""
        steps = self._steps(prompt_ids, max_new_tokens, sampling, seed, stop)
        try:
            while (event := with_stack_room(next, steps, None)) is not None:
                yield event
        finally:
            steps.close()

    def _steps(
        self, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int, sampling: SamplingSpec, seed: int,
        stop: StopCheck | None = None,
    ) -> Iterator[Event]:
        ids = torch.as_tensor(prompt_ids, dtype=torch.long).to(self.lm.device)
        if ids.numel() == 0:
            raise ContextLengthError("the prompt has no tokens")
        limit = token_limit(self.context_length, ids.numel(), max_new_tokens)
        device = self.lm.device
        # the sampling noise of every position, read by the target's choice and the drafter alike
        noise = None if sampling.greedy else PositionNoise(seed, self.vocab, self.output_device)
        stats = DecodeStats(k=self.k, k_limit=self.k_limit)
        timer = PhaseTimer(device)
        lookahead = self.lookahead

        # 0. static caches sized for this generation; compiled steps built before any clock starts
        self.reserve(ids.numel() + limit)
        self.warmup()

        # 1. prefill: the target and the drafter read the prompt (the last token waits for step 1)
        started = device_clock(device)
        self.lm.reset()
        self.lm.prefill(ids[:-1])
        if self.drafter is not None:
            self.drafter.begin(ids, sampling, noise)
            if self.feature_layers and ids.numel() > 1:
                self.drafter.take_features(self.lm.features)  # every prompt token's but the last
        pending = ids[-1:]
        event: Event = Prefilled(int(ids.numel()), device_clock(device) - started)
        stats.observe(event)
        yield event

        generated: list[int] = []
        finish: str | None = None
        while finish is None:
            step_started = time.perf_counter()
            if noise is not None:
                noise.move_to(len(generated))
            # 2. draft: a chain or a tree, never deeper than the tokens still allowed (minus the target's own)
            shape, budget = lookahead.plan()
            mark = timer.start()
            draft = self.draft(shape, limit - len(generated) - 1, budget)
            timer.stop("draft", mark)
            drafted_at = time.perf_counter()

            # 3. verify: ONE target forward over the last committed token and every drafted node
            mark = timer.start()
            cached_before = self.lm.length
            n, end, token, drafted = self.verify(pending, draft, sampling, noise)
            timer.stop("verify", mark)
            verified_at = time.perf_counter()

            # 4. commit: emit the accepted path and the target's token; both caches keep exactly that
            shape_of = draft.shape if draft is not None else ()
            path = path_to(shape_of, end)
            emitted, finish = cut_at_stop([drafted[i] for i in path] + [token], len(generated), limit, self.eos_ids,
                                          stop, generated)
            generated.extend(emitted)
            kept = path[: len(emitted)]
            self.lm.keep_path(cached_before + 1, [cached_before + 1 + i for i in kept])
            self.lm.truncate(cached_before + len(emitted))
            pending = torch.tensor(emitted[-1:], dtype=torch.long, device=device)
            if self.drafter is not None:
                if self.feature_layers:  # the root's and the kept nodes' (the new last token's come next step)
                    rows = torch.tensor([0] + [1 + i for i in kept], device=self.lm.features.device)
                    self.drafter.take_features(self.lm.features.index_select(0, rows))
                self.drafter.accept(emitted, kept)
            event = self.step_event(
                draft, drafted, path, token, emitted,
                seconds=time.perf_counter() - step_started,
                draft_seconds=drafted_at - step_started,
                verify_seconds=verified_at - drafted_at,
            )
            lookahead.observe(event)
            stats.observe(event)
            yield event

        describe = getattr(lookahead, "describe", None)  # k: auto / tree: auto: what it judged by
        if describe is not None and log.isEnabledFor(logging.INFO):
            log.info(describe())
        phases = timer.totals()
        stats.draft_seconds = phases.get("draft", 0.0)
        stats.verify_seconds = phases.get("verify", 0.0)
        yield Finished(tuple(generated), finish, stats)

    def draft(self, shape: TreeSpec, room: int, budget) -> Draft | None:
        """The drafter's proposal within `shape`, no deeper than `room` tokens; None: nothing drafted."""
        if self.drafter is None or room < 1:
            return None
        if shape.depth > room:
            nodes = room if shape.is_chain else shape.nodes
            shape = TreeSpec(nodes, shape.width, room, shape.auto)
        draft = self.drafter.propose(shape, budget)
        return draft if draft is not None and len(draft) else None

    def verify(self, pending: torch.Tensor, draft: Draft | None, sampling: SamplingSpec, noise: PositionNoise | None):
        """One target forward over the root (`pending`) and the draft's nodes, the target's choice
        at every row (row r scores the token r's depth + 1 places on), then the acceptance rule:
        (n accepted, end node, next token, drafted ids) read back in one transfer."""
        parents = draft.shape if draft is not None else ()
        draft_ids = draft.token_ids if draft is not None else pending[:0]
        tree = None
        if draft is not None and draft.is_tree:
            tree = TreeAttention.for_nodes(self.lm.length, parents, root_position=self.lm.length, with_root=True)
        logits = self.lm.forward(torch.cat([pending, draft_ids]), keep=len(parents) + 1, tree=tree)
        draft_ids = draft_ids.to(logits.device)
        row_noise = None if noise is None else noise.ahead([1] + [depth + 1 for depth in depths(parents)])
        n, end, token = accept(draft_ids, parents, choose(logits, sampling, row_noise))
        # the verify's one device -> host transfer (a model drafter under k: auto or building a
        # tree also reads its own probabilities while drafting)
        values = torch.cat([n.view(1), end.view(1), token.view(1), draft_ids]).tolist()
        return values[0], values[1], values[2], values[3:]

    @staticmethod
    def step_event(
        draft: Draft | None, drafted: list[int], path: list[int], token: int, emitted: list[int],
        **timings: float,
    ) -> Verified:
        """The step's event: the accepted path, then, as the rejected part, the drafter's first
        choice from where the path ends down its first children (a chain: the rest of it).

        Judged: the children of the root and of every accepted node (each was compared with the
        target's choice at its parent)."""
        if draft is None:
            return Verified(None, (), 0, token, tuple(emitted), **timings)
        parents = draft.shape
        first_child: dict[int, int] = {}
        for node, parent in enumerate(parents):
            first_child.setdefault(parent, node)
        line, node = list(path), (path[-1] if path else -1)
        while node in first_child:
            node = first_child[node]
            line.append(node)
        on_path = set(path)
        confidences = draft.confidences or (None,) * len(parents)
        depth = {-1: 0}
        judged: dict[int, JudgedNode] = {}
        for node, parent in enumerate(parents):
            depth[node] = depth[parent] + 1
            if parent == -1 or parent in on_path:
                judged[node] = JudgedNode(confidences[node], depth[node] - 1, node in on_path, first_child[parent] == node)
        parts = tuple(judged_part(part, judged, depth) for part in draft.parts)
        return Verified(
            draft.drafter, tuple(drafted[i] for i in line), len(path), token, tuple(emitted),
            nodes=len(parents), tree=draft.is_tree, judged=tuple(judged.values()),
            levels=max(depth.values()), parts=parts, **timings,
        )


def judged_part(part: DraftPart, judged: dict[int, JudgedNode], depth: dict[int, int]) -> JudgedPart:
    """A merged tree's judged nodes that are this drafter's, with its own confidence of each."""
    own_confidences = part.confidences or (None,) * len(part.nodes)
    mine = tuple(
        judged[node]._replace(confidence=own_confidences[own]) for own, node in enumerate(part.nodes) if node in judged
    )
    levels = len({depth[node] for node in part.nodes})
    return JudgedPart(part.drafter, len(part.nodes), part.seconds, mine, levels)


def run(decoder: SpeculativeDecoder, prompt_ids: Sequence[int], **kwargs) -> Finished:
    """Drain the stream; the Finished event."""
    finished = None
    for event in decoder.stream(prompt_ids, **kwargs):
        if isinstance(event, Finished):
            finished = event
    return finished
