"""The Rich live view: a pure consumer of engine events.

Accepted drafts, the target's corrections and its bonus tokens each get a colour; rejected drafts
flash struck through where they were guessed until the next step (or stay, with show_rejected).
"""

from __future__ import annotations

from typing import Callable, Sequence

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .events import Event, Finished, Prefilled, Verified
from .stats import DecodeStats

STYLES = {
    "accepted": "green",
    "corrected": "bold yellow",
    "bonus": "bold cyan",
    "target": "default",  # a step with no draft: the target's own token
    "rejected": "red strike dim",
}


class TokenTexts:
    """Incremental detokenisation: where each generated token's text ends in the decoded output.

    A token whose bytes are an incomplete character (an emoji split over tokens) gets no text of
    its own; the token that completes the character carries it, so the spans never shift.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self.decode = decode
        self.ids: list[int] = []
        self.ends: list[int] = []
        self.text = ""

    def extend(self, ids: Sequence[int]) -> None:
        for token in ids:
            self.ids.append(token)
            decoded = self.decode(self.ids)
            stable = not decoded.endswith("\ufffd")
            if stable:
                self.text = decoded
            self.ends.append(len(self.text) if stable else (self.ends[-1] if self.ends else 0))

    def flush(self) -> None:
        """At the end: a trailing incomplete character too (as U+FFFD), so the text equals decode(ids)."""
        if self.ids:
            self.text = self.decode(self.ids)
            self.ends[-1] = len(self.text)

    def piece(self, index: int) -> str:
        start = self.ends[index - 1] if index else 0
        return self.text[start : self.ends[index]]

    def new_text_since(self, length: int) -> str:
        return self.text[length:]


def status_line(stats: DecodeStats, k_label: str) -> Text:
    parts = [f"k={k_label}"]
    if stats.drafted:
        rate = stats.acceptance_rate or 0.0
        parts += [f"drafted {stats.drafted}", f"accepted {stats.accepted}", f"acceptance {rate:.0%}"]
    if stats.target_forwards:
        parts.append(f"tau {stats.mean_accepted_length:.2f} tokens/forward")
    if stats.tokens_per_second:
        parts.append(f"{stats.tokens_per_second:.1f} tok/s")
    return Text(" · ".join(parts), style="dim")


def legend() -> Text:
    text = Text()
    for name in ("accepted", "corrected", "bonus", "rejected"):
        text.append(f" {name} ", style=STYLES[name])
    return text


def summary_line(stats: DecodeStats, finish_reason: str) -> str:
    pieces = [f"{stats.new_tokens} tokens in {stats.decode_seconds:.2f} s"]
    if stats.tokens_per_second:
        pieces[0] += f" ({stats.tokens_per_second:.1f} tok/s)"
    if stats.drafted:
        pieces.append(f"acceptance {stats.acceptance_rate:.1%} of {stats.drafted} drafted")
    if stats.target_forwards:
        pieces.append(f"tau {stats.mean_accepted_length:.2f} tokens per target forward ({stats.target_forwards} forwards)")
    pieces.append(f"finish: {finish_reason}")
    return " · ".join(pieces)


def histogram_table(stats: DecodeStats) -> Table:
    table = Table(title="accepted drafts per target forward", show_edge=False)
    table.add_column("accepted", justify="right")
    table.add_column("forwards", justify="right")
    table.add_column("")
    table.add_column("acceptance at position", justify="right")
    histogram = stats.accept_length_histogram
    peak = max(histogram) or 1
    positions = stats.per_position_acceptance
    for n, count in enumerate(histogram):
        at = positions[n] if n < len(positions) else None
        table.add_row(str(n), str(count), "█" * round(24 * count / peak), "" if at is None else f"{at:.0%}")
    return table


class GenerationView:
    """Consumes events and keeps a renderable of the text so far, coloured by token origin."""

    def __init__(self, decode: Callable[[Sequence[int]], str], k_label: str, show_rejected: bool = False):
        self.texts = TokenTexts(decode)
        self.decode = decode
        self.k_label = k_label
        self.show_rejected = show_rejected
        self.kinds: list[str] = []
        self.rejected_before: dict[int, str] = {}  # token index -> rejected draft text shown before it
        self.latest_rejection: int | None = None
        self.stats = DecodeStats(k=k_label, k_limit=1)
        self.finished: Finished | None = None

    def update(self, event: Event) -> None:
        if isinstance(event, Prefilled):
            self.stats.observe(event)
        elif isinstance(event, Verified):
            self.stats.observe(event)
            start = len(self.kinds)
            self.texts.extend(event.emitted)
            for i in range(len(event.emitted)):
                self.kinds.append(self.kind_of(event, i))
            self.latest_rejection = None
            if event.rejected and len(event.emitted) > event.n_accepted:
                index = start + event.n_accepted
                self.rejected_before[index] = self.decode(list(event.rejected))
                self.latest_rejection = index
        elif isinstance(event, Finished):
            self.texts.flush()
            self.finished = event
            self.stats = event.stats
            self.latest_rejection = None

    @staticmethod
    def kind_of(event: Verified, i: int) -> str:
        if i < event.n_accepted:
            return "accepted"
        if event.drafter is None:
            return "target"
        return "corrected" if event.corrected is not None else "bonus"

    def body(self) -> Text:
        text = Text()
        for i, kind in enumerate(self.kinds):
            rejected = self.rejected_before.get(i)
            if rejected and (self.show_rejected or i == self.latest_rejection):
                text.append(rejected, style=STYLES["rejected"])
            text.append(self.texts.piece(i), style=STYLES[kind])
        return text

    def __rich__(self) -> Group:
        return Group(self.body(), Text(), status_line(self.stats, self.k_label), legend())


def show_live(events, view: GenerationView, console: Console, live: bool = True):
    """Feed events to the view, redrawing in place when `live`; returns the Finished event."""
    if not live:
        for event in events:
            view.update(event)
        console.print(view)
        return view.finished
    with Live(view, console=console, refresh_per_second=12, transient=False):
        for event in events:
            view.update(event)
    return view.finished
