"""Prompt sets for bench and tune-k: a text file, Spec-Bench JSONL, or a small built-in mix."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .errors import UsageError


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


def read_jsonl(path: Path) -> list[BenchPrompt]:
    """Spec-Bench format: one object a line with `turns` (the first is the prompt) and `category`."""
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            turns = row["turns"]
            text = turns[0] if isinstance(turns, list) else turns
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise UsageError(f'{path}:{number}: not a Spec-Bench row (a JSON object whose "turns" list starts with the prompt)') from None
        if not isinstance(text, str) or not text.strip():
            raise UsageError(f"{path}:{number}: turns[0] is not a prompt text")
        prompts.append(BenchPrompt(str(row.get("question_id", number)), text, row.get("category")))
    return prompts


def read_text_lines(path: Path) -> list[BenchPrompt]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [BenchPrompt(f"line-{i}", line, None) for i, line in enumerate(lines, start=1) if line.strip()]


def load_prompts(path: Path | None, categories: Sequence[str] = (), limit: int | None = None) -> list[BenchPrompt]:
    """The prompts to run: filtered to `categories`, and at most `limit` per category (or in all,
    when the prompts have no categories)."""
    if path is None:
        prompts = list(BUILTIN_PROMPTS)
    else:
        if not path.is_file():
            raise UsageError(f"--prompts: '{path}' is not a file")
        try:
            prompts = read_jsonl(path) if path.suffix in (".jsonl", ".json") else read_text_lines(path)
        except UnicodeDecodeError:
            raise UsageError(f"--prompts: '{path}' is not UTF-8 text") from None
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
