"""Where two greedy outputs part, and whether the target was at a numerical near-tie there.

A batched verification in bf16/fp16 can flip a near-tie that a one-token forward resolves the
other way; that is rounding, not a bug. A divergence is a near-tie when the target's top-2 logit
margin at that position is within the rounding of the dtype.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import torch

# logit margins up to these are within rounding. bf16 keeps 8 bits of mantissa (logits of 16-32
# are 0.125 apart, above 32 0.25): measured on SmolLM2-135M over 1,018 positions of 12 Spec-Bench
# answers, the top-2 margin read by a 6-token forward differs from a one-token step's by up to
# 0.5 (median 0.0625, 99th percentile 0.25). fp16 keeps 3 bits more (0.5 / 8); fp32/fp64 differ
# only in the last bits of a sum.
NEAR_TIE_MARGIN = {
    torch.float64: 1e-9,
    torch.float32: 1e-3,
    torch.float16: 0.0625,
    torch.bfloat16: 0.5,
}


@dataclass(frozen=True)
class Divergence:
    position: int  # index in the generated tokens where they first differ
    expected: int | None  # the reference's token there (None: the reference had ended)
    got: int | None
    top2_margin: float | None  # the target's logit gap between its two best tokens there
    near_tie: bool

    def to_dict(self) -> dict:
        return asdict(self)


def first_difference(reference: Sequence[int], other: Sequence[int]) -> int | None:
    for i, (a, b) in enumerate(zip(reference, other)):
        if a != b:
            return i
    return None if len(reference) == len(other) else min(len(reference), len(other))


def top2_margin(model: torch.nn.Module, ids: Sequence[int]) -> float:
    """The target's gap between its best and second-best logit for the token after `ids`."""
    from ..models.properties import input_device

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([list(ids)], device=input_device(model)), logits_to_keep=1).logits[0, -1]
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def describe_divergence(
    model: torch.nn.Module, prompt_ids: Sequence[int], reference: Sequence[int], other: Sequence[int]
) -> Divergence | None:
    """None when the outputs are identical; otherwise where and how they differ."""
    position = first_difference(reference, other)
    if position is None:
        return None
    expected = reference[position] if position < len(reference) else None
    got = other[position] if position < len(other) else None
    margin = top2_margin(model, list(prompt_ids) + list(reference[:position]))
    dtype = next(model.parameters()).dtype
    return Divergence(position, expected, got, margin, margin <= NEAR_TIE_MARGIN.get(dtype, 1e-3))
