"""`specdec generate`: drive the engine for one prompt and print in the asked format.

Every format consumes the same event stream through a GenerationView, so an interrupt (Ctrl-C)
leaves the same partial result in each: the text so far and its stats, then exit 130.
"""

from __future__ import annotations

import logging

from ..api import Generation, Pipeline, new_seed
from ..decoding.engine import SpeculativeDecoder
from ..errors import EXIT_INTERRUPTED, EXIT_OK
from ..run_clock import describe
from .output import Output
from .view import GenerationView, drafters_table, histogram_table, show_live, summary_line

log = logging.getLogger("specdec")


def result_object(pipeline: Pipeline, view: GenerationView, seed: int, finish_reason: str,
                  stops: tuple[str, ...] = ()) -> dict:
    """The JSON object of one generation: the API's Generation, finished or interrupted (its seed
    null at temperature 0, where nothing is drawn)."""
    ids = tuple(view.texts.ids)
    generation = Generation(text=pipeline.text_of(ids, stops), token_ids=ids, prompt_tokens=view.stats.prompt_tokens,
                            finish_reason=finish_reason, seed=None if pipeline.profile.sampling.greedy else seed,
                            stats=view.stats)
    return generation.to_dict(pipeline.profile.name)


def report(pipeline: Pipeline, view: GenerationView, out: Output, fmt: str, seed: int, finish: str, verbose: int,
           stops: tuple[str, ...] = ()) -> None:
    if fmt == "text":
        out.end_line()
    if fmt in ("json", "jsonl"):
        obj = result_object(pipeline, view, seed, finish, stops)
        out.json_document(obj) if fmt == "json" else out.json_line(obj)
    if view.stats.constraint_complete is False:
        log.warning("the text stopped (finish: %s) before it was complete under %s: it is cut short%s", finish,
                    pipeline.profile.constraint.describe() if pipeline.profile.constraint else "its constraint",
                    "; raise --max-new-tokens" if finish == "length" else "")
    if fmt in ("human", "text"):
        out.message(summary_line(view.stats, finish), style="dim")
        if verbose and view.stats.drafted:
            out.info.print(histogram_table(view.stats))
            out.info.print(drafters_table(view.stats))


def run_one(pipeline: Pipeline, decoder: SpeculativeDecoder, prompt_ids: list[int], out: Output, fmt: str,
            seed: int, live: bool, show_rejected: bool, verbose: int,
            stops: tuple[str, ...] = ()) -> tuple[GenerationView, str]:
    view = GenerationView(pipeline.decode, str(decoder.k), show_rejected=show_rejected, stops=stops)
    view.stats.k, view.stats.k_limit = decoder.k, decoder.k_limit  # as a finished run's stats have them
    events = pipeline.stream(prompt_ids, seed=seed, decoder=decoder, stop=stops)
    try:
        if fmt == "human":
            show_live(events, view, out.data, live=live and out.stdout_is_tty)
        else:
            for event in events:
                view.update(event)
                if fmt == "text":
                    out.write(view.texts.new_text())
        finish = view.finished.finish_reason
    except KeyboardInterrupt:
        finish = "interrupted"  # what was generated so far is still reported below
    report(pipeline, view, out, fmt, seed, finish, verbose, stops)
    return view, finish


def run_generate(pipeline: Pipeline, prompt: str, out: Output, *, fmt: str, samples: int,
                 seed: int | None, live: bool, show_rejected: bool, verbose: int, stops: tuple[str, ...] = ()) -> int:
    prompt_ids = pipeline.encode(prompt)
    base_seed = new_seed() if seed is None else seed
    decoder = pipeline.decoder()  # one for every sample: what `k: auto` learns carries over
    prefill = decode = 0.0
    for i in range(samples):
        if samples > 1 and fmt == "human":  # a rule above each, where the texts would run together
            out.data.rule(f"sample {i + 1} of {samples}", style="dim")
        elif samples > 1 and fmt == "text" and i:
            out.write("\n")
        view, finish = run_one(pipeline, decoder, prompt_ids, out, fmt, base_seed + i, live, show_rejected, verbose,
                               stops)
        prefill, decode = prefill + view.stats.prefill_seconds, decode + view.stats.decode_seconds
        if finish == "interrupted":
            return EXIT_INTERRUPTED
    if decoder.compile_seconds:
        out.message(f"compiled the decode steps in {decoder.compile_seconds:.1f} s (not in the tok/s above)", style="dim")
    log.info("%s", describe({"compile": decoder.compile_seconds, "prefill": prefill, "decode": decode}))
    return EXIT_OK
