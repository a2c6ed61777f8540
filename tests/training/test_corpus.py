"""The built-in training prompts of `train-draft --data`: made offline, the same on
every machine, of many kinds, and sharing no text with the benchmark's built-in prompts."""

from __future__ import annotations

from specdec_cli.training.corpus import BUILTINS, read_prompts
from specdec_cli.bench.workload import BUILTIN_PROMPTS


def word_runs(text: str, n: int = 8) -> set[tuple[str, ...]]:
    words = text.lower().split()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def test_built_in_sets_are_fixed_and_mixed_holds_both():
    for name in BUILTINS:
        prompts = read_prompts(name)
        assert prompts == read_prompts(name)  # no unseeded randomness
        assert len(set(prompts)) == len(prompts)  # a repeat could sit on both sides of the held-out split
    everyday, docs, mixed = read_prompts("everyday"), read_prompts("python-docs"), read_prompts("mixed")
    assert len(everyday) > 1000 and len(docs) > 1000
    assert sorted(mixed) == sorted(everyday + docs)
    assert mixed != everyday + docs  # shuffled together, so any prefix (--limit) has both kinds


def test_everyday_covers_many_kinds_of_request():
    everyday = read_prompts("everyday")
    kinds = {
        "writing": "Write a short poem", "role play": "Pretend you are", "explanation": "in simple terms",
        "arithmetic": "Show your work", "coding": "Write a Python function", "translation": "Translate into",
        "extraction": "Extract every name", "question over a text": "Read the text and answer",
        "summary of a passage": "Summarize the following passage", "character": "Stay in character",
        "logic puzzle": "finished a race", "concepts": "model answer", "short question": "In one or two sentences",
    }
    for kind, marker in kinds.items():
        assert sum(marker in p for p in everyday) >= 20, kind


def test_no_built_in_prompt_shares_eight_words_in_a_row_with_a_benchmark_prompt():
    bench = set().union(*(word_runs(p.text) for p in BUILTIN_PROMPTS))
    assert bench
    for name in BUILTINS:
        assert not [p for p in read_prompts(name) if word_runs(p) & bench], name
