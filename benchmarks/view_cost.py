"""What the live view costs per token, early and late in a long answer (no model: recorded-like events).

    python benchmarks/view_cost.py [--tokens 4000] [--tokenizer FOLDER]

Feeds Verified events of 4 tokens each (the demo model's tokenizer by default, on text from the
Python standard library's own docs) through GenerationView and the live screen, drawing to an
in-memory terminal of 160x45 at Rich Live's rate, and prints the mean milliseconds per token (screen
refreshes included) over the first 400 tokens and over the last 400. A view whose cost grows with the output shows a larger late figure.
"""

from __future__ import annotations

import argparse
import io
import pydoc
import statistics
import time

from rich.console import Console
from rich.live import Live

from specdec_cli.cli.view import GenerationView, LiveScreen
from specdec_cli.decoding.events import Finished, Prefilled, Verified
from specdec_cli.decoding.stats import DecodeStats


def demo_tokenizer(folder: str | None):
    """The tokenizer of the folder given, or the demo profile's, loaded the way specdec loads it."""
    import torch

    from specdec_cli.models.loading import LoadOptions, load_tokenizer
    from specdec_cli.profile import load_profile
    from specdec_cli.specs import ModelSpec

    spec = ModelSpec(model=folder) if folder else load_profile("smollm2-demo").target
    return load_tokenizer(spec, LoadOptions(device=torch.device("cpu")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--tokenizer", help="a tokenizer folder [default: the demo model's]")
    args = parser.parse_args()
    tokenizer = demo_tokenizer(args.tokenizer)
    text = " ".join(pydoc.render_doc(obj, renderer=pydoc.plaintext) for obj in (str, dict, list, io))
    ids = tokenizer(text)["input_ids"][: args.tokens]
    decode = lambda t: tokenizer.decode(list(t), skip_special_tokens=True)  # noqa: E731
    console = Console(file=io.StringIO(), force_terminal=True, width=160, height=45, soft_wrap=False)
    view = GenerationView(decode, "4")
    screen = LiveScreen(view, console)
    per_token: list[float] = []
    with Live(screen, console=console, auto_refresh=False) as region:
        view.update(Prefilled(10, 0.0))
        drawn = 0.0
        for start in range(0, len(ids), 4):
            chunk = tuple(ids[start : start + 4])
            event = Verified("model", chunk[:-1] + (chunk[-1] + 1,), len(chunk) - 1, chunk[-1], chunk, 0.01)
            began = time.perf_counter()
            view.update(event)
            now = time.monotonic()
            if now - drawn >= 1 / 12:
                for line in screen.overflow():
                    region.console.print(line)
                region.refresh()
                drawn = now
            per_token.append((time.perf_counter() - began) / len(chunk))
            time.sleep(0.02)  # a decode step's time: the screen refreshes at Live's rate, not per event
        view.update(Finished(tuple(ids), "length", DecodeStats(k=4, k_limit=4)))
    window = 100  # events: the mean includes the screen refreshes among them
    early = statistics.fmean(per_token[:window]) * 1e3
    late = statistics.fmean(per_token[-window:]) * 1e3
    print(f"{len(ids)} tokens, 160x45 terminal: view cost per token {early:.3f} ms over the first 400 tokens, "
          f"{late:.3f} ms over the last 400 (ratio {late / early:.2f})")


if __name__ == "__main__":
    main()
