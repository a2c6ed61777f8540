"""Logits -> probabilities: one function, used for the target's p and the draft's q alike; and the
seeded choice of a token from them, the same for the target and every drafter.

The warps are transformers' own (temperature, then top-k, then top-p, as in generate), so that
"the target's distribution" means the same thing here as in `generate(do_sample=True)`.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Sequence

import torch

from ..specs import SamplingSpec
from . import device_calls


@lru_cache(maxsize=32)
def logits_warpers(sampling: SamplingSpec):
    """transformers' own warpers for this temperature / top-k / top-p, in generate()'s order."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    warpers = LogitsProcessorList([TemperatureLogitsWarper(sampling.temperature)])
    if sampling.top_k > 0:
        warpers.append(TopKLogitsWarper(sampling.top_k))
    if sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(sampling.top_p))
    return warpers


def warp_logits(logits: torch.Tensor, sampling: SamplingSpec) -> torch.Tensor:
    """Apply temperature, top-k and top-p to the last dimension (float32); removed tokens get -inf."""
    rows = logits.float().reshape(-1, logits.shape[-1])
    return logits_warpers(sampling)(None, rows).reshape(logits.shape)


def first_max(scores: torch.Tensor) -> torch.Tensor:
    """argmax over the last dimension (the first of equal maxima, as argmax). On CPU, argmax over
    bfloat16 ran 4x slower than max (552 against 132 us over a 151,936-token vocabulary), a cost paid
    at every target step and every draft token."""
    return scores.max(dim=-1).indices


def probabilities(logits: torch.Tensor, sampling: SamplingSpec) -> torch.Tensor:
    """The sampling distribution (float32) for `logits`; at temperature 0 a one-hot of the argmax."""
    if sampling.greedy:
        return torch.nn.functional.one_hot(first_max(logits), logits.shape[-1]).float()
    return warp_logits(logits, sampling).softmax(dim=-1)


def fit_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Cut or pad the last dimension of `logits` to `vocab` ids, so that p and q index the same tokens.

    Models pad their embedding matrices (Qwen: 151936 rows for 151665 tokens); the padded rows are
    not tokens and are cut before the softmax. A draft with a narrower head gets -inf (no mass) there.
    """
    width = logits.shape[-1]
    if width == vocab:
        return logits
    if width > vocab:
        return logits[..., :vocab]
    return torch.nn.functional.pad(logits, (0, vocab - width), value=float("-inf"))


# --------------------------------------------------------------------------- the seeded choice
#
# Token t of a generation (t counted from 0 after the prompt) is argmax(p_t / e_t): p_t the target's
# warped distribution, e_t a vector of i.i.d. Exp(1) noise drawn from a generator seeded by (seed, t)
# alone. That is a draw from p_t (an exponential race: the first of independent clocks with rates p(x)
# to ring is x with probability p(x)), and e_t is independent of e_0..e_{t-1}, which decided the
# prefix, so every token follows p given the tokens before it: the text is a sample of the target.
# No token's noise depends on k, the tree, the drafter or which step verified it, so one seed gives
# one text under all of them. Drafters read the same e_t and propose argmax(q_t / e_t), which agrees
# with the target's choice where q is close to p: what they propose changes how many tokens a
# verification keeps, never which tokens come out.


def position_seed(seed: int, index: int) -> int:
    """A 63-bit generator seed for token `index` of a generation with this seed: a hash, so that
    (seed + 1, t) and (seed, t + 1) (--samples uses seed + i) share no noise."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class PositionNoise:
    """The Exp(1) noise of one generation, one row [V] per generated position, made on `device` when
    first asked for and kept until the generation moves past it, so the target and the drafter read
    the same row. No host sync: seeding a generator and drawing on the device need none."""

    def __init__(self, seed: int, vocab: int, device: torch.device):
        self.seed, self.vocab, self.device = seed, vocab, torch.device(device)
        self.generator = device_calls.generator(self.device)
        self.rows: dict[int, torch.Tensor] = {}
        self.next_index = 0  # the position of the token after the last committed one

    def move_to(self, index: int) -> None:
        """`index` tokens are committed: depth 1 is now position `index`; older rows are dropped."""
        self.next_index = index
        for old in [t for t in self.rows if t < index]:
            del self.rows[old]

    def row(self, index: int) -> torch.Tensor:
        if index not in self.rows:
            seed = position_seed(self.seed, index)
            self.rows[index] = device_calls.exponential(self.generator, seed, self.vocab, self.device)
        return self.rows[index]

    def ahead(self, depths: Sequence[int]) -> torch.Tensor:
        """The rows [len(depths), V] of the tokens `depth` places after the last committed one
        (1: the next token)."""
        distinct = sorted(set(depths))
        rows = torch.stack([self.row(self.next_index + depth - 1) for depth in distinct])
        if list(depths) == distinct:
            return rows
        where = torch.tensor([distinct.index(depth) for depth in depths])
        return rows.index_select(0, where.to(self.device, non_blocking=True))


def race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """p / e: its argmax is a draw from p (the first clock to ring); its order ranks a drafter's guesses.
    (exponential_ may return 0 on some devices: that token wins, as a clock that rings at once would.)"""
    return probs / noise.to(probs.device).clamp_min(torch.finfo(noise.dtype).tiny)


def choose(logits: torch.Tensor, sampling: SamplingSpec, noise: torch.Tensor | None) -> torch.Tensor:
    """Each row's token: the argmax at temperature 0, else argmax(p / e) with that row's noise."""
    if sampling.greedy:
        return first_max(logits)
    return first_max(race(probabilities(logits, sampling), noise))


def choose_rows(logits: torch.Tensor, samplings: Sequence[SamplingSpec],
                noises: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """choose() for a batch's rows [B, T, V] -> [B, T], each row with its own sampling and noise
    [T, V] (None when greedy): one call per distinct sampling (usually one for the whole batch)."""
    groups: dict[SamplingSpec, list[int]] = {}
    for b, sampling in enumerate(samplings):
        groups.setdefault(sampling, []).append(b)
    if len(groups) == 1:
        sampling = samplings[0]
        return choose(logits, sampling, None if sampling.greedy else torch.stack(list(noises)))
    choices = torch.empty(logits.shape[:2], dtype=torch.long, device=logits.device)
    for sampling, members in groups.items():
        where = torch.tensor(members, device=logits.device)
        noise = None if sampling.greedy else torch.stack([noises[b] for b in members])
        choices[where] = choose(logits.index_select(0, where), sampling, noise)
    return choices
