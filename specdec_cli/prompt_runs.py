"""Prompts through a pipeline (Pipeline.generate_many): whether a prompt can run, the batch size, each
prompt's seed, a prompt that cannot run as a PromptError in its place, and results put back in input order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, TypeVar

from .errors import UsageError

BATCH_SIZE_AUTO = "auto"
# what 'auto' decodes at once: a guess, not a measurement (`specdec bench --batch-sizes` measures
# this machine); a batch pays on a GPU, and on a CPU's cores too, reading each weight once for 8 rows
AUTO_BATCH = 8
MAX_BATCH = 256  # catches a slip of the keyboard: 10000 rows would fill memory before any row ends
T = TypeVar("T")


@dataclass(frozen=True)
class PromptError:
    """A prompt that could not run (empty, too long for the context, ids outside the embedding):
    its 0-based position in the input and the reason, one line."""

    index: int
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "error": self.message}


def parse_batch_size(text: str) -> int | str:
    """--batch-size: N >= 1 or auto (its UsageError names the option)."""
    if text == BATCH_SIZE_AUTO:
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"--batch-size: '{text}' is not a whole number of at least 1, or auto")
    return value


def resolve_batch_size(batch_size: int | str) -> int | str:
    """A batch size as given, checked: N from 1 to MAX_BATCH, or 'auto' (Pipeline.batched_decoder:
    AUTO_BATCH rows where the profile runs in a batch, else one prompt at a time)."""
    if batch_size == BATCH_SIZE_AUTO:
        return batch_size
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UsageError(f"batch size: {batch_size!r} is not a whole number of at least 1 or 'auto'")
    if batch_size > MAX_BATCH:
        raise UsageError(f"batch size {batch_size}: at most {MAX_BATCH} prompts are decoded at once")
    return batch_size


def check_prompt(prompt: str, hint: str = "") -> str:
    """The prompt, or a UsageError saying why it cannot run; `hint`: where a non-empty one goes."""
    if not prompt or not prompt.strip():
        raise UsageError(f"the prompt is empty{'; ' + hint if hint else ''}")
    if "\0" in prompt:
        raise UsageError("the prompt contains NUL bytes; pass text")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:  # argv bytes that are not UTF-8 arrive as surrogate escapes
        raise UsageError(f"the prompt is not valid UTF-8 (character {exc.start}); pass text") from None
    return prompt


def prompt_seed(seed: int, index: int) -> int:
    """Prompt i's seed: seed + i, as --samples gives sample i. A rerun with the same seed draws
    every row again as it was, and no two prompts of one run share draws."""
    return seed + index


def one_line(message: str) -> str:
    return "; ".join(line.strip() for line in message.splitlines() if line.strip())


def in_order(results: Iterable[tuple[int, T]]) -> Iterator[T]:
    """(index, result) pairs that arrive in any order (a batch's rows end when they end) as
    results in index order, each as soon as it and every one before it are in."""
    waiting: dict[int, T] = {}
    following = 0
    for index, result in results:
        waiting[index] = result
        while following in waiting:
            yield waiting.pop(following)
            following += 1
    if waiting:  # a result lost on the way: say so rather than end short
        raise RuntimeError(f"no result for prompt {following} of the {following + len(waiting)} or more given")
