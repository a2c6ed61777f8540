"""The Rich live view: a pure consumer of engine events.

Accepted drafts, the target's corrections and its bonus tokens each get a colour; rejected drafts
flash struck through where they were guessed until the next step (or stay, with show_rejected).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..decoding.events import Event, Finished, Prefilled, Verified
from ..decoding.stats import DecodeStats
from ..decoding.stop_texts import safe_length, text_before_stop

STYLES = {
    "accepted": "green",
    "corrected": "bold yellow",
    "bonus": "bold cyan",
    "target": "magenta",  # a step with nothing drafted: the target's own token
    "rejected": "red strike dim",
}


LEGEND = (
    ("accepted", "accepted"),
    ("corrected", "corrected"),
    ("bonus", "bonus"),
    ("target", "undrafted"),
    ("rejected", "rejected"),
)


class TokenTexts:
    """Incremental detokenisation: the text each generated token adds, at a cost per token that does
    not grow with the output (the prefix-window method of TGI and vLLM: decode a few tokens before
    the new ones and keep what the new ones add).

    A token whose bytes end in an incomplete character (an emoji split over tokens) adds no text;
    the token that completes the character carries it, so earlier pieces never change.
    With stop texts, the pieces end before the first one, and new_text holds back what may still
    become one.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stops: Sequence[str] = ()):
        self.decode = decode
        self.stops = tuple(stops)
        self.ids: list[int] = []
        self.pieces: list[str] = []
        self.prefix = 0  # ids[prefix:read] were decoded last time; their text is already out
        self.read = 0
        self.given = 0  # characters new_text has handed out
        self.final = False

    def extend(self, ids: Sequence[int]) -> None:
        for token in ids:
            self.ids.append(token)
            self.pieces.append(self.next_piece(final=False))

    def next_piece(self, final: bool) -> str:
        before = self.decode(self.ids[self.prefix : self.read])
        after = self.decode(self.ids[self.prefix :])
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]

    def flush(self) -> None:
        """At the end: a trailing incomplete character too (as U+FFFD), so the pieces join to decode(ids)."""
        if self.ids and self.read < len(self.ids):
            self.pieces[-1] += self.next_piece(final=True)
        self.end_before_stop()
        self.final = True

    def end_before_stop(self) -> None:
        """Cut the pieces where the first stop text begins (the tokens after it keep no text)."""
        if not self.stops:
            return
        before = text_before_stop("".join(self.pieces), self.stops)
        if before is None:
            return
        room = len(before)
        for i, piece in enumerate(self.pieces):
            self.pieces[i], room = piece[:room], max(0, room - len(piece))

    def new_text(self) -> str:
        """The text added since the last call (for a stream that writes as it goes)."""
        text = "".join(self.pieces)
        end = len(text) if self.final or not self.stops else safe_length(text, self.stops)
        new, self.given = text[self.given : end], max(self.given, end)
        return new


def status_line(stats: DecodeStats, k_label: str) -> Text:
    last = stats.steps[-1] if stats.steps else None
    if last is not None and last.depth is not None:  # the latest step verified a tree
        parts = [f"tree {last.drafted} nodes · path {last.accepted}"]
    else:
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
    for name, label in LEGEND:
        text.append(f" {label} ", style=STYLES[name])
    return text


def summary_line(stats: DecodeStats, finish_reason: str) -> str:
    pieces = [f"{stats.new_tokens} tokens in {stats.decode_seconds:.2f} s"]
    if stats.tokens_per_second:
        pieces[0] += f" ({stats.tokens_per_second:.1f} tok/s)"
    if stats.drafted:
        pieces.append(f"acceptance {stats.acceptance_rate:.1%} of {stats.drafted} drafted")
    if stats.target_forwards:
        pieces.append(f"tau {stats.mean_accepted_length:.2f} tokens per target forward ({stats.target_forwards} forwards)")
    if (constraint := stats.constraint_summary()) is not None:
        pieces.append(f"{constraint['forced_kept']} tokens forced by the constraint"
                      + ("" if constraint["complete"] else " (incomplete)"))
    pieces.append(f"finish: {finish_reason}")
    return " · ".join(pieces)


def drafters_table(stats: DecodeStats) -> Table:
    """What each drafter did (-v): steps it drafted, tokens drafted and kept, its drafting time;
    and the steps that drafted nothing."""
    table = Table(title="drafters", show_edge=False)
    for name in ("drafter", "steps", "drafted", "accepted", "acceptance", "drafting s"):
        table.add_column(name, justify="left" if name == "drafter" else "right")
    for name, row in stats.per_drafter.items():
        rate = row["acceptance_rate"]
        table.add_row(name, str(row["calls"]), str(row["drafted"]), str(row["accepted"]),
                      "-" if rate is None else f"{rate:.0%}", f"{row['draft_seconds']:.2f}")
    table.add_row("(no draft)", str(stats.plain_steps), "", "", "", "")
    return table


def histogram_table(stats: DecodeStats) -> Table:
    table = Table(title="accepted drafts per target forward (a tree: its path depth)", show_edge=False)
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
    """Consumes events and keeps the text so far, coloured by token origin.

    Only the latest step can change how it looks (its rejected drafts flash, then go), so the
    tokens before it are settled into `settled`; a live screen hands settled lines to the
    terminal's scrollback with `commit`, and what remains to draw stays as small as the screen.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], k_label: str, show_rejected: bool = False,
                 stops: Sequence[str] = ()):
        self.texts = TokenTexts(decode, stops)
        self.decode = decode
        self.k_label = k_label
        self.show_rejected = show_rejected
        self.kinds: list[str] = []
        self.step_start = 0  # the latest step's first token
        self.step_rejected = ""  # its rejected drafts' text, shown before its first non-accepted token
        self.step_rejected_at: int | None = None
        self.settled = Text()  # the tokens before the latest step, less what was committed
        self.stats = DecodeStats(k=k_label, k_limit=1)
        self.finished: Finished | None = None

    def update(self, event: Event) -> None:
        if isinstance(event, Prefilled):
            self.stats.observe(event)
        elif isinstance(event, Verified):
            self.stats.observe(event)
            self.settle(keep_rejected=self.show_rejected)
            self.texts.extend(event.emitted)
            self.end_before_stop()  # before any redraw: a stop text is never shown
            self.kinds.extend(self.kind_of(event, i) for i in range(len(event.emitted)))
            if event.rejected and len(event.emitted) > event.n_accepted:
                self.step_rejected = self.decode(list(event.rejected))
                self.step_rejected_at = self.step_start + event.n_accepted
        elif isinstance(event, Finished):
            self.texts.flush()
            self.end_before_stop()
            self.settle(keep_rejected=self.show_rejected)
            self.finished = event
            self.stats = event.stats

    def end_before_stop(self) -> None:
        """The text cut before a stop text, in the settled part too (its first characters may have
        come in an earlier step)."""
        settled_before = sum(len(piece) for piece in self.texts.pieces[: self.step_start])
        self.texts.end_before_stop()
        cut = settled_before - sum(len(piece) for piece in self.texts.pieces[: self.step_start])
        if cut:
            self.settled = self.settled[: max(0, len(self.settled) - cut)]

    def settle(self, keep_rejected: bool) -> None:
        """The latest step joins the settled text; its rejected drafts stay only when asked to."""
        if not keep_rejected:
            self.step_rejected_at = None
        self.settled.append_text(self.step_text())
        self.step_start = len(self.kinds)
        self.step_rejected_at = None

    def step_text(self) -> Text:
        text = Text()
        for i in range(self.step_start, len(self.kinds)):
            if i == self.step_rejected_at:
                text.append(printable(self.step_rejected), style=STYLES["rejected"])
            text.append(printable(self.texts.pieces[i]), style=STYLES[self.kinds[i]])
        return text

    @staticmethod
    def kind_of(event: Verified, i: int) -> str:
        if i < event.n_accepted:
            return "accepted"
        if event.drafter is None:
            return "target"
        return "corrected" if event.corrected is not None else "bonus"

    def body(self) -> Text:
        """The text not yet committed: settled tokens, then the latest step."""
        text = self.settled.copy()
        text.append_text(self.step_text())
        return text

    def commit(self, chars: int) -> None:
        """Drop the first `chars` characters of the settled text (they were printed for good)."""
        self.settled = self.settled[chars:]

    def __rich__(self) -> Group:
        return Group(self.body(), Text(), status_line(self.stats, self.k_label), legend())


# What a model writes must not drive the terminal: control characters are drawn as their Unicode
# pictures (ESC as U+241B), and tabs as spaces, so that wrapping counts every cell the screen shows.
SCREEN_SAFE = {c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A)}
SCREEN_SAFE |= {0x7F: 0x2421, 0x09: "    "} | {c: 0xFFFD for c in range(0x80, 0xA0)}


def printable(text: str) -> str:
    return text.translate(SCREEN_SAFE)


STATUS_LINES = 3  # below the answer: a blank line, the status line, the legend


class LiveScreen:
    """The live region: the answer's last lines, status and legend, never taller than the terminal.

    Lines that no longer fit are printed above the region once, into the terminal's scrollback, as
    any streaming chat does; what a live run leaves on the screen equals the --no-live output.
    """

    def __init__(self, view: GenerationView, console: Console):
        self.view = view
        self.console = console

    def overflow(self) -> list[Text]:
        """Settled lines beyond the screen's height: removed from the view, to be printed above."""
        width = self.console.width
        room = max(1, self.console.height - STATUS_LINES - 1)  # one row for the cursor below
        body = self.view.body()
        spans = wrapped_spans(body.plain, width)
        excess = len(spans) - room
        settled = len(self.view.settled)
        lines: list[Text] = []
        end = 0
        for start, stop, newline in spans[: max(0, excess)]:
            if stop + newline > settled:  # never commit the latest step: its look may still change
                break
            line = body[start:stop]
            line.rstrip_end(width)  # as Rich draws a wrapped line: no trailing space past the edge
            lines.append(line)
            end = stop + newline
        if end:
            self.view.commit(end)
        return lines

    def __rich__(self) -> GenerationView:
        return self.view


def wrapped_spans(text: str, width: int) -> list[tuple[int, int, int]]:
    """(start, stop, 1 if a newline follows) of each screen line, word-wrapped as Rich draws Text."""
    from rich._wrap import divide_line

    spans = []
    position = 0
    paragraphs = text.split("\n")
    for number, paragraph in enumerate(paragraphs):
        breaks = [0, *divide_line(paragraph, width, fold=True), len(paragraph)]
        for start, stop in zip(breaks, breaks[1:]):
            last = stop == len(paragraph)
            spans.append((position + start, position + stop, int(last and number < len(paragraphs) - 1)))
        position += len(paragraph) + 1
    return spans


def show_live(events, view: GenerationView, console: Console, live: bool = True):
    """Feed events to the view, redrawing in place at Rich Live's rate when `live`; the Finished event.

    The redraw happens on this thread, between steps: no second thread reads the view while it changes.
    """
    if not live:
        for event in events:
            view.update(event)
        # the status line and legend belong to a screen; through a pipe, the text alone
        console.print(view if console.is_terminal else view.body())
        return view.finished
    screen = LiveScreen(view, console)
    interval = 1 / REFRESH_PER_SECOND
    with Live(screen, console=console, auto_refresh=False, transient=False) as region:
        drawn = 0.0
        for event in events:
            view.update(event)
            now = time.monotonic()
            if now - drawn >= interval or isinstance(event, Finished):
                for line in screen.overflow():
                    region.console.print(line)
                region.refresh()
                drawn = now
    return view.finished


REFRESH_PER_SECOND = 12
