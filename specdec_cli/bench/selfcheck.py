"""`specdec verify`: check "same output" on the user's own pair, on their own machine.

1. Greedy identity: specdec at temperature 0 against plain decoding (ours) and against
   transformers' generate; a divergence is located and classed as a near-tie or a bug.
2. Distribution: N samples of the first two tokens from specdec and from the target alone;
   the first token against the target's exact next-token distribution (chi-square, and the
   total-variation distance with a confidence bound), the first two as a two-sample test.

No scipy at run time: chi-square tail probabilities come from torch's incomplete gamma.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..api import Pipeline
from ..constraints.matcher import mask_logits
from ..decoding.transformers_generate import transformers_generate
from ..models.properties import input_device
from ..primitives.sampling import probabilities
from ..specs import SamplingSpec, Workload
from .divergence import describe_divergence
from .workload import BenchPrompt

ALPHA = 1e-3  # a check fails below this p-value: a wrong sampler lands far below it
CONFIDENCE = 0.95
MIN_EXPECTED = 5.0  # chi-square needs about five expected counts per cell; rarer cells are pooled

DEFAULT_PROMPTS = (
    BenchPrompt("code", "Write a Python function that returns the n-th Fibonacci number."),
    BenchPrompt("edit", "Rename x to total:\n\ndef add_all(items):\n    x = 0\n    for i in items:\n        x += i\n    return x"),
    BenchPrompt("prose", "Describe a lighthouse in two sentences."),
)


def chi2_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square(dof)."""
    if dof <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         torch.tensor(statistic / 2.0, dtype=torch.float64)))


def pooled_cells(expected: torch.Tensor) -> torch.Tensor:
    """A cell index per token: its own cell where the expected count is high enough, else one pool."""
    big = expected >= MIN_EXPECTED
    cells = torch.full(expected.shape, int(big.sum()), dtype=torch.long)
    cells[big] = torch.arange(int(big.sum()))
    return cells


def goodness_of_fit(counts: torch.Tensor, probs: torch.Tensor) -> dict[str, float]:
    """Samples against an exact distribution: chi-square p-value and TV distance with an upper bound.

    TV is measured over the pooled cells (the likely tokens, and the rest as one). Its bound uses
    the Bretagnolle-Huber-Carol inequality: with probability CONFIDENCE, the empirical distribution
    over m cells is within L1 distance sqrt(2 (m ln 2 + ln(1/delta)) / n) of the true one.
    """
    n = float(counts.sum())
    expected = probs.double() * n
    cells = pooled_cells(expected)
    m = int(cells.max()) + 1
    observed = torch.zeros(m, dtype=torch.float64).index_add_(0, cells, counts.double())
    pooled = torch.zeros(m, dtype=torch.float64).index_add_(0, cells, expected)
    keep = pooled > 0
    statistic = float(((observed[keep] - pooled[keep]) ** 2 / pooled[keep]).sum())
    tv = 0.5 * float((observed / n - pooled / n).abs().sum())
    slack = math.sqrt(2 * (m * math.log(2) + math.log(1 / (1 - CONFIDENCE))) / n)
    return {"p_value": chi2_sf(statistic, int(keep.sum()) - 1), "tv": tv, "tv_upper": tv + slack / 2, "cells": m}


def two_sample_test(first: Sequence[tuple], second: Sequence[tuple]) -> dict[str, float]:
    """Chi-square test of homogeneity: do two samples of outcomes come from one distribution?"""
    outcomes = sorted(set(first) | set(second))
    a = torch.tensor([sum(1 for x in first if x == o) for o in outcomes], dtype=torch.float64)
    b = torch.tensor([sum(1 for x in second if x == o) for o in outcomes], dtype=torch.float64)
    total = a + b
    share = a.sum() / (a.sum() + b.sum())
    cells = pooled_cells(torch.minimum(total * share, total * (1 - share)))
    m = int(cells.max()) + 1
    a_cells = torch.zeros(m, dtype=torch.float64).index_add_(0, cells, a)
    b_cells = torch.zeros(m, dtype=torch.float64).index_add_(0, cells, b)
    t_cells = a_cells + b_cells
    keep = t_cells > 0
    ea, eb = t_cells[keep] * share, t_cells[keep] * (1 - share)
    statistic = float(((a_cells[keep] - ea) ** 2 / ea + (b_cells[keep] - eb) ** 2 / eb).sum())
    return {"p_value": chi2_sf(statistic, int(keep.sum()) - 1), "cells": m}


def selfcheck_workload(prompts: int, samples: int, max_new_tokens: int, distribution_prompts: int) -> Workload:
    """The generations SelfCheck runs, which `compile: auto` weighs: greedy, specdec and plain per
    prompt; distribution, `samples` of 2 tokens per method and checked prompt."""
    checked = min(distribution_prompts, prompts) if samples else 0
    return Workload.of(2 * prompts, max_new_tokens) + Workload.of(2 * samples * checked, 2)


@dataclass
class SelfCheck:
    pipeline: Pipeline
    prompts: Sequence[BenchPrompt]
    samples: int = 100
    sampling: SamplingSpec | None = None
    max_new_tokens: int = 32
    distribution_prompts: int = 1
    seed: int = 0

    def greedy_checks(self, on_progress: Callable[[str], None] | None,
                      plain_texts: list[tuple[list[int], tuple[int, ...]]]) -> list[dict[str, Any]]:
        """Rows per prompt and reference; each prompt's ids and plain decoding's tokens go to `plain_texts`."""
        pipe = self.pipeline
        rows = []
        for prompt in self.prompts:
            ids = pipe.encode(prompt.text)
            greedy = SamplingSpec()
            spec = pipe.generate(ids, sampling=greedy, max_new_tokens=self.max_new_tokens, seed=self.seed)
            references = {
                "plain": pipe.generate(ids, decoder=pipe.decoder(drafter=None), sampling=greedy,
                                       max_new_tokens=self.max_new_tokens).token_ids,
            }
            if pipe.profile.constraint is None:  # transformers' generate cannot follow a constraint
                references["transformers"] = transformers_generate(pipe, ids, self.max_new_tokens)
            plain_texts.append((ids, references["plain"]))
            for name, reference in references.items():
                divergence = describe_divergence(pipe.target, ids, reference, spec.token_ids)
                rows.append({
                    "prompt": prompt.id,
                    "against": name,
                    "tokens": len(reference),
                    "identical": divergence is None,
                    "divergence": divergence.to_dict() if divergence else None,
                    "passed": divergence is None or divergence.near_tie,
                    "acceptance_rate": spec.stats.acceptance_rate,
                })
            if on_progress:
                on_progress(f"greedy · {prompt.id}")
        return rows

    def check_sampling(self) -> SamplingSpec:
        s = self.sampling or self.pipeline.profile.sampling
        return s if not s.greedy else SamplingSpec(temperature=1.0, top_k=s.top_k, top_p=s.top_p)

    def distribution_checks(self, on_progress: Callable[[str], None] | None) -> list[dict[str, Any]]:
        pipe = self.pipeline
        sampling = self.check_sampling()
        rows = []
        for prompt in list(self.prompts)[: self.distribution_prompts]:
            ids = pipe.encode(prompt.text)
            with torch.inference_mode():
                logits = pipe.target(input_ids=torch.tensor([ids], device=input_device(pipe.target)),
                                     logits_to_keep=1).logits[0, -1]
            logits = logits[: pipe.vocab]
            matcher = pipe.matcher()
            if matcher is not None:  # the target's distribution restricted to what the constraint allows first
                logits = mask_logits(logits, matcher.mask())
            exact = probabilities(logits, sampling).cpu()
            spec_pairs, plain_pairs = [], []
            decoders = {"specdec": (pipe.decoder(), spec_pairs, 0), "plain": (pipe.decoder(drafter=None), plain_pairs, 10**6)}
            for i in range(self.samples):
                for decoder, pairs, offset in decoders.values():
                    ids_out = pipe.generate(ids, decoder=decoder, sampling=sampling, max_new_tokens=2,
                                            seed=self.seed + offset + i).token_ids
                    pairs.append(tuple(ids_out[:2]))
                if on_progress:
                    on_progress(f"sampling · {prompt.id}")
            counts = torch.zeros(exact.shape[0], dtype=torch.float64)
            for pair in spec_pairs:
                counts[pair[0]] += 1
            first = goodness_of_fit(counts, exact)
            pairs = two_sample_test(spec_pairs, plain_pairs)
            rows.append({
                "prompt": prompt.id,
                "samples": self.samples,
                "temperature": sampling.temperature,
                "top_k": sampling.top_k,
                "top_p": sampling.top_p,
                "first_token_p_value": first["p_value"],
                "first_token_tv": first["tv"],
                "first_token_tv_upper": first["tv_upper"],
                "two_token_p_value": pairs["p_value"],
                "passed": first["p_value"] >= ALPHA and pairs["p_value"] >= ALPHA,
            })
        return rows

    def run(self, on_progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        plain_texts: list[tuple[list[int], tuple[int, ...]]] = []
        greedy = self.greedy_checks(on_progress, plain_texts)
        distribution = self.distribution_checks(on_progress) if self.samples else []
        from ..models.devices import dtype_name
        from .local import machine_info
        from .quant_drift import quantization_drift

        # a quantized target: what quantization (not speculation) changed, beside the checks
        drift = quantization_drift(self.pipeline, [ids for ids, _ in plain_texts], [t for _, t in plain_texts],
                                   self.max_new_tokens)

        return {
            "profile": self.pipeline.profile.name,
            "machine": machine_info(self.pipeline),
            "dtype": dtype_name(next(self.pipeline.target.parameters()).dtype),
            "drafter": self.pipeline.profile.drafter.describe(),
            "k": self.pipeline.profile.k,
            "alpha": ALPHA,
            "greedy": greedy,
            "distribution": distribution,
            "quantization_drift": drift,
            "passed": all(r["passed"] for r in greedy + distribution),
        }

    @property
    def steps(self) -> int:
        return len(self.prompts) + self.samples * min(self.distribution_prompts, len(self.prompts))
