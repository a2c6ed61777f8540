"""The exact distribution of two sampled tokens, the chi-square check against it, and one seed's
text under every k and tree: shared by the sampling and the draft-head tests."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats as scistats

from specdec_cli import Pipeline, SamplingSpec
from specdec_cli.specs import AUTO_TREE, TreeSpec

PROMPT_WORDS = "alpha beta gamma alpha beta"
SHAPES = {  # (k, tree) of each decoder compared with plain decoding
    "k=1": (1, None), "k=2": (2, None), "k=4": (4, None), "k=auto": ("auto", None),
    "tree 8x3x3": (None, TreeSpec(8, 3, 3)), "tree=auto": (None, AUTO_TREE),
}


def exact_two_token_distribution(pipe: Pipeline, ids: list[int], sampling: SamplingSpec) -> np.ndarray:
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    warpers = LogitsProcessorList([TemperatureLogitsWarper(sampling.temperature)])
    if sampling.top_k:
        warpers.append(TopKLogitsWarper(sampling.top_k))
    if sampling.top_p < 1:
        warpers.append(TopPLogitsWarper(sampling.top_p))

    def next_distribution(sequence: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            logits = pipe.target(torch.tensor([sequence], device=pipe.target.device)).logits[0, -1].float()
        return warpers(None, logits[None])[0].softmax(-1).double().cpu()

    vocab = pipe.vocab
    first = next_distribution(ids)
    joint = np.zeros((vocab, vocab))
    for t1 in range(vocab):
        if first[t1] > 0:
            joint[t1] = (first[t1] * next_distribution(ids + [t1])).numpy()
    return joint


def chi_square_pvalue(counts: np.ndarray, joint: np.ndarray) -> float:
    expected = joint.ravel() * counts.sum()
    observed = counts.ravel()
    assert observed[expected == 0].sum() == 0, "a sample fell where the target puts no mass"
    big = expected >= 5  # pool sparse cells into one, as chi-square needs
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    exp = exp * obs.sum() / exp.sum()  # float rounding of the exact probabilities
    return float(scistats.chisquare(obs, exp).pvalue)


def texts_by_shape(pipe: Pipeline, prompt: str, sampling: SamplingSpec, seed: int, tokens: int = 24) -> dict[str, tuple]:
    """The ids each decoder emits for one seed: plain decoding's, then every k and tree's."""
    ids = pipe.encode(prompt)
    out = {"plain": pipe.generate(ids, decoder=pipe.decoder(drafter=None), sampling=sampling, seed=seed, max_new_tokens=tokens)}
    accepted = 0
    for name, (k, tree) in SHAPES.items():
        out[name] = pipe.generate(ids, decoder=pipe.decoder(k=k, tree=tree), sampling=sampling, seed=seed, max_new_tokens=tokens)
        accepted += out[name].stats.accepted
    assert accepted > 0, "no draft was ever kept: the comparison would not exercise acceptance"
    return {name: result.token_ids for name, result in out.items()}
