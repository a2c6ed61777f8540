"""Stop texts (`--stop`): generation ends at the token that completes one, and the text ends
before it. The engine asks `StopTexts.check` after each step; whoever shows text cuts it with
`text_before_stop` and holds back with `safe_length` what may yet begin one."""

from __future__ import annotations

from typing import Callable, Sequence

# tokens decoded before a step's own when looking for a stop text that began earlier: a token is
# at least one byte and a character at most four, so this many cover a stop text's first characters
BYTES_PER_CHARACTER = 4


class StopTexts:
    def __init__(self, texts: Sequence[str], decode: Callable[[Sequence[int]], str]):
        self.texts = tuple(texts)
        self.decode = decode
        self.window = BYTES_PER_CHARACTER * max(len(t) for t in self.texts)

    def check(self, ids: Sequence[int], new: int) -> int | None:
        """How many of `ids` to keep when a stop text appears in the text of the last `new` of
        them (it may begin before them), else None: the first token whose text completes one."""
        start = max(0, len(ids) - new - self.window)
        for end in range(len(ids) - new + 1, len(ids) + 1):
            if text_before_stop(self.decode(ids[start:end]), self.texts) is not None:
                return end
        return None


def text_before_stop(text: str, stops: Sequence[str]) -> str | None:
    """The text before the first stop text in it, or None when it holds none."""
    found = [i for i in (text.find(stop) for stop in stops) if i >= 0]
    return text[: min(found)] if found else None


def safe_length(text: str, stops: Sequence[str]) -> int:
    """How much of a growing text can be shown: up to the first stop text, and short of any end
    that may still become the beginning of one."""
    before = text_before_stop(text, stops)
    if before is not None:
        return len(before)
    held = max((n for stop in stops for n in range(1, len(stop)) if text.endswith(stop[:n])), default=0)
    return len(text) - held
