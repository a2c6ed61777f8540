"""The commit phase's pieces, the same at every batch size: what a step may emit (cut at EOS, the
token limit and stop texts) and the event that tells what the step drafted, judged and kept."""

from __future__ import annotations

from typing import Callable, Sequence

from ..drafters.base import Draft, DraftPart
from ..errors import ContextLengthError
from .events import JudgedNode, JudgedPart, Verified

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


def step_event(
    draft: Draft | None, drafted: list[int], path: list[int], token: int, emitted: list[int],
    forced: int = 0, cut: int = 0, **timings: float,
) -> Verified:
    """The step's event: the accepted path, then, as the rejected part, the drafter's first
    choice from where the path ends down its first children (a chain: the rest of it).

    Judged: the children of the root and of every accepted node (each was compared with the
    target's choice at its parent), but the last `forced` nodes: a constraint's, not the drafter's
    (`cut`: the drafter's nodes the constraint removed)."""
    if draft is None:
        return Verified(None, (), 0, token, tuple(emitted), cut=cut, **timings)
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
    own = len(parents) - forced
    for node, parent in enumerate(parents):
        depth[node] = depth[parent] + 1
        if node < own and (parent == -1 or parent in on_path):
            judged[node] = JudgedNode(confidences[node], depth[node] - 1, node in on_path, first_child[parent] == node)
    parts = tuple(judged_part(part, judged, depth) for part in draft.parts)
    return Verified(
        draft.drafter, tuple(drafted[i] for i in line), len(path), token, tuple(emitted),
        nodes=len(parents), tree=draft.is_tree, judged=tuple(judged.values()),
        levels=max(depth.values()), parts=parts, forced=forced, cut=cut, **timings,
    )


def judged_part(part: DraftPart, judged: dict[int, JudgedNode], depth: dict[int, int]) -> JudgedPart:
    """A merged tree's judged nodes that are this drafter's, with its own confidence of each."""
    own_confidences = part.confidences or (None,) * len(part.nodes)
    mine = tuple(
        judged[node]._replace(confidence=own_confidences[own]) for own, node in enumerate(part.nodes) if node in judged
    )
    levels = len({depth[node] for node in part.nodes})
    return JudgedPart(part.drafter, len(part.nodes), part.seconds, mine, levels)
