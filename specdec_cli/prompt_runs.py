"""Many prompts through one pipeline (Pipeline.generate_many): the batch size, each prompt's seed,
a prompt that cannot run as a PromptError in its place, and results put back in input order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, TypeVar

from .errors import UsageError

BATCH_SIZE_AUTO = "auto"
T = TypeVar("T")


@dataclass(frozen=True)
class PromptError:
    """A prompt that could not run (empty, too long for the context, ids outside the embedding):
    its 0-based position in the input and the reason, one line."""

    index: int
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "error": self.message}


def resolve_batch_size(batch_size: int | str) -> int:
    """A batch size (N >= 1, or 'auto') as the size this build runs: 'auto' is 1, the only one it
    has; the batched decoder, once in, takes N > 1 here."""
    if batch_size == BATCH_SIZE_AUTO:
        return 1
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UsageError(f"batch size: {batch_size!r} is not a whole number of at least 1 or 'auto'")
    if batch_size > 1:
        raise UsageError("batched decoding is not in this build yet")
    return batch_size


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
