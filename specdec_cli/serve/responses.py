"""The bodies the server sends, as the OpenAI API shapes them: completions, chat completions and
their streamed chunks, each with `usage` and specdec's `speculation` object (on a stream, the last
chunk's), and the text of a growing generation cut where it is safe to show."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..decoding.stats import DecodeStats
from ..decoding.stop_texts import safe_length

# the core's reasons -> the API's: a stop text and EOS both end as "stop"
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}


def speculation(stats: DecodeStats, drafter: str, tree: str | None) -> dict[str, Any]:
    """What speculation did for one request: drafted and accepted tokens, the acceptance rate
    (accepted / drafted), tau (tokens per target forward) and the k or tree it drafted with."""
    return {
        "drafter": drafter,
        "k": stats.k,
        "tree": tree,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "acceptance_rate": stats.acceptance_rate,
        "tau": stats.mean_accepted_length,
        "target_forwards": stats.target_forwards,
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class GrowingText:
    """The text of a generation as its tokens arrive: what can be sent now is what will not
    change (no half of a multi-byte character) and cannot turn out to begin a stop text.

    Each step decodes only the tokens since the last settled point, not the whole answer (as
    vLLM's and TGI's detokenizers do): a long answer's steps cost no more than a short one's."""

    def __init__(self, decode: Callable[[Sequence[int]], str], stops: tuple[str, ...]):
        self.decode = decode
        self.stops = stops
        self.tokens: list[int] = []
        self.text = ""  # the settled text so far
        self.prefix = 0  # tokens[prefix:settled] are decoded again beside the new ones, for context
        self.settled = 0  # tokens whose text is in self.text
        self.sent = 0  # characters sent so far

    def add(self, tokens: Sequence[int]) -> str:
        """The new text that is safe to send after these tokens."""
        self.tokens.extend(tokens)
        before = self.decode(self.tokens[self.prefix : self.settled])
        after = self.decode(self.tokens[self.prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):  # no character left half-written
            self.text += after[len(before) :]
            self.prefix, self.settled = self.settled, len(self.tokens)
        shown = safe_length(self.text, self.stops) if self.stops else len(self.text)
        return self._advance(self.text[:shown])

    def finish(self, final_text: str) -> str:
        """The rest of the generation's final text (Pipeline.text_of: before any stop text)."""
        return self._advance(final_text)

    def _advance(self, text: str) -> str:
        new = text[self.sent :] if len(text) > self.sent else ""
        self.sent = max(self.sent, len(text))
        return new


@dataclass
class Shape:
    """One endpoint's body shapes: chat completions or (text) completions."""

    chat: bool
    model: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def _head(self, object_name: str) -> dict[str, Any]:
        prefix = "chatcmpl-" if self.chat else "cmpl-"
        return {"id": prefix + self.id, "object": object_name, "created": self.created, "model": self.model}

    def whole(self, text: str, finish_reason: str, usage_: dict[str, int], spec: dict[str, Any]) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {**self._head(self.object), "choices": [choice], "usage": usage_, "speculation": spec}

    def chunk(self, text: str | None, *, first: bool = False, finish_reason: str | None = None,
              extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """One streamed chunk; `text` None: a chunk of no choice (the usage chunk)."""
        body = self._head("chat.completion.chunk" if self.chat else "text_completion")
        if text is None:
            body["choices"] = []
        elif self.chat:
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            body["choices"] = [{"index": 0, "delta": delta if text or first else {}, "logprobs": None,
                                "finish_reason": finish_reason}]
        else:
            body["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]
        return {**body, **(extra or {})}
