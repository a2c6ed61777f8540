"""What the batched-decoding tests share: prompts of different lengths and limits, a decoder over a
pipeline's models, each prompt decoded alone at batch size 1, and the checks of a row's cache."""

from __future__ import annotations

from cache_checks import fresh_cache
from specdec_cli import Pipeline, SamplingSpec
from specdec_cli.decoding.batch_k import GoodputK
from specdec_cli.decoding.batched import BatchedDecoder, Request

PROMPTS = [
    "def add(a, b):",
    "The quick brown fox",
    "for i in range(10):\n    print(i * i)\n",
    "x",
    "class Node:\n    def __init__(self, value, next=None):\n        self.value = value\n",
    "Write a Python function that reverses a linked list.",
    "import os\nimport sys\n",
    "Summarise the following text in one sentence. The quick brown fox jumps over the lazy dog.",
]
LIMITS = [24, 9, 30, 17, 1, 26, 12, 20]  # different max_new_tokens, so rows finish apart
SAMPLED = SamplingSpec(temperature=0.8)
# the two batch caches: "off" the eager one (a DynamicCache, holes masked, compaction), "static" the
# static cache of rows that `compile: on` compiles, here with eager steps (its logic without the compiler)
CACHES = ["off", "static"]


def prompt_ids(pipe: Pipeline) -> list[list[int]]:
    return [pipe.encode(p, chat=False) for p in PROMPTS]


def batched(pipe: Pipeline, drafter: str, **options) -> BatchedDecoder:
    """A batched decoder over the pipeline's models; drafter "none": plain decoding."""
    make = None if drafter == "none" else (lambda: pipe.make_drafter(pipe.profile.drafter))
    settings = {"k": 4, "batch_size": 8, **options}
    return BatchedDecoder(pipe.target, make, vocab=pipe.vocab, eos_ids=pipe.eos_ids,
                          context_length=pipe.context_length, **settings)


def alone(pipe: Pipeline, ids: list[int], limit: int, sampling: SamplingSpec = SamplingSpec(), seed: int = 0):
    """The prompt decoded at batch size 1 by plain decoding: (ids, finish reason)."""
    result = pipe.generate(ids, decoder=pipe.decoder(drafter=None), max_new_tokens=limit, sampling=sampling, seed=seed)
    return result.token_ids, result.finish_reason


def run_all(decoder: BatchedDecoder, requests: list[Request]) -> dict:
    """key -> Finished, checking that each key comes back once."""
    finished = {}
    for key, event in decoder.run(requests):
        assert key not in finished
        finished[key] = event
    assert set(finished) == {r.key for r in requests}
    return finished


def assert_row_holds(lm, row: int, ids: list[int]) -> None:
    """Row `row` of a BatchedLM holds exactly a fresh prefill of `ids`."""
    ours = lm.row_cache(row)
    assert lm.lengths()[row] == len(ids)
    if not ids:
        return
    for (keys, values), theirs in zip(ours, fresh_cache(lm.model, ids).layers):
        assert keys.shape == theirs.keys[0].shape
        assert (keys - theirs.keys[0]).abs().max() < 1e-4
        assert (values - theirs.values[0]).abs().max() < 1e-4


class ScheduledK(GoodputK):
    """Each step's k from a fixed schedule of (k, steps) runs; the last k after it."""

    def __init__(self, schedule: list[tuple[int, int]]):
        super().__init__()
        self.ks = [k for k, steps in schedule for _ in range(steps)]
        self.steps = 0

    def next_k(self, measured: bool = True) -> int:
        super().next_k(measured)
        self.steps += 1
        return self.ks[min(self.steps, len(self.ks)) - 1]


