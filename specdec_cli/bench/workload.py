"""Prompt sets for bench, tune-k and verify: a prompt file (prompt_files.py) or a small built-in mix."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import UsageError
from ..prompt_files import read_prompt_file


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    text: str
    category: str | None = None


# A small mixed set when no file is given: code (where drafting pays), extraction from a given
# text, summarising, open writing (where it pays least), arithmetic reasoning.
BUILTIN_PROMPTS: tuple[BenchPrompt, ...] = (
    BenchPrompt("code-1", "Write a Python function that reverses a singly linked list, with a docstring.", "coding"),
    BenchPrompt("code-2", "Write a Python function `is_palindrome(s)` that ignores case and punctuation, and three asserts that test it.", "coding"),
    BenchPrompt(
        "code-edit-1",
        "Rename the variable `x` to `total` and add type hints:\n\n"
        "def add_all(items):\n    x = 0\n    for item in items:\n        x = x + item\n    return x\n",
        "coding",
    ),
    BenchPrompt(
        "extract-1",
        "From the text below, list every person and the city they live in, one per line as `name: city`.\n\n"
        "Maria moved from Porto to Lyon in 2019. Her brother Tiago still lives in Porto, while their cousin "
        "Ana works in Berlin. Ana's partner, Jonas, commutes to Berlin from Potsdam.",
        "extraction",
    ),
    BenchPrompt(
        "summary-1",
        "Summarise in two sentences:\n\nSpeculative decoding speeds up inference of large language models. A small "
        "draft model proposes several tokens, and the large target model checks all of them in one forward pass. "
        "Tokens that the target agrees with are kept; the first disagreement is replaced by the target's own "
        "choice. Because the check follows a rejection-sampling rule, the output has exactly the distribution "
        "the target alone would produce, only faster.",
        "summarization",
    ),
    BenchPrompt("writing-1", "Write a short poem about the sea at night.", "writing"),
    BenchPrompt("math-1", "A train leaves at 9:40 and arrives at 13:05. How long is the journey? Explain step by step.", "math"),
)


def load_prompts(path: Path | None, categories: Sequence[str] = (), limit: int | None = None) -> list[BenchPrompt]:
    """The prompts to run: filtered to `categories`, and at most `limit` per category (or in all,
    when the prompts have no categories)."""
    if path is None:
        prompts = list(BUILTIN_PROMPTS)
    else:
        prompts = [BenchPrompt(row.id, row.text, row.category) for row in read_prompt_file(path, "--prompts")]
    if categories:
        known = sorted({p.category for p in prompts if p.category})
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise UsageError(f"--category: '{unknown[0]}' is not in the prompts (they have: {', '.join(known) or 'none'})")
        prompts = [p for p in prompts if p.category in categories]
    if limit is not None:
        if limit < 1:
            raise UsageError("--limit: must be at least 1")
        taken: dict[str | None, int] = {}
        kept = []
        for prompt in prompts:
            if taken.get(prompt.category, 0) < limit:
                taken[prompt.category] = taken.get(prompt.category, 0) + 1
                kept.append(prompt)
        prompts = kept
    if not prompts:
        raise UsageError("no prompts to run")
    return prompts
