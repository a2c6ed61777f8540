"""Bench and tune-k reports as Rich tables (for people) and CSV (for scripts)."""

from __future__ import annotations

import csv
import io
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..bench.paired import MIN_PAIRS
from ..bench.tune import row_label

FIELDS = ("tokens_per_second", "speedup", "speedup_min", "speedup_max", "speedup_flags", "acceptance_rate",
          "mean_accepted_length", "target_forwards")
MARKS = {"above_tau_bound": "?", "wide_spread": "~"}  # bench/paired.py's flags, as marks beside the figure


def fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return f"{value:{spec}}{suffix}"


def count(n: int, noun: str) -> str:
    """'1 prompt', '2 prompts'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def header(summary: dict[str, Any], k_label: str | None = None) -> Text:
    """Machine and settings; `k_label` where the k is not the profile's (tune-k sweeps its own)."""
    m, s = summary["machine"], summary["settings"]
    k_label = k_label or f"k={s['k']}"
    return Text(
        f"{summary['profile']} · {m['device_name']} · {summary.get('dtype', '')} · torch {m['torch']} · "
        f"transformers {m['transformers']}\n{count(s['prompts'], 'prompt')} · {s['max_new_tokens']} new tokens · "
        f"{count(s['repeats'], 'repeat')} after {s['warmup']} warm-up · {k_label} · "
        f"temperature {s['temperature']} · drafter {s['drafter']}",
        style="dim",
    )


def identity_line(summary: dict[str, Any]) -> Text:
    identical = summary.get("outputs_identical")
    if identical is None:
        return Text("temperature > 0: outputs are samples, not compared", style="dim")
    if identical:
        return Text("every method produced plain decoding's token ids, token for token", style="green")
    lines = [f"{len(summary['differences'])} runs differ from plain decoding:"]
    for d in summary["differences"]:
        kind = "near-tie (rounding)" if d["near_tie"] else "NOT a tie: a bug"
        lines.append(f"  {d['prompt']} · {d['method']} · token {d['position']} · top-2 margin {fmt(d['top2_margin'], '.4f')} · {kind}")
    return Text("\n".join(lines), style="yellow" if all(d["near_tie"] for d in summary["differences"]) else "bold red")


def drift_lines(summary: dict[str, Any]) -> list[Text]:
    """What quantization changed: the quantized target's greedy text against the unquantized model's."""
    drift = summary.get("quantization_drift")
    if not drift:
        return []
    median = drift["median_first_difference"]
    where = "" if median is None else f"; where they differ, first at token {median:g} (median)"
    return [Text(f"quantization ({drift['quantization']}) against the {drift['reference']} model: "
                 f"{drift['identical_token_share']:.0%} of greedy tokens identical, "
                 f"{drift['identical_prompts']} of {count(drift['prompts'], 'text')} identical{where} "
                 "(speculation changed nothing; quantization did)", style="dim")]


def compile_lines(summary: dict[str, Any]) -> list[Text]:
    """The compile time (compile: on), which no figure above includes; none when nothing was compiled."""
    seconds = summary.get("compile_seconds") or 0.0
    if seconds <= 0:
        return []
    return [Text(f"compiled the decode steps in {seconds:.1f} s (not in the figures above)", style="dim")]


def speedup_cell(row: dict[str, Any]) -> str:
    """'1.42x', or '8.15x ?' where the figure is marked (see mark_notes)."""
    marks = "".join(MARKS[flag] for flag in row.get("speedup_flags") or ())
    return fmt(row["speedup"], ".2f", "x") + (f" {marks}" if marks else "")


def range_cell(row: dict[str, Any]) -> str:
    """The lowest and highest paired ratio behind a speedup ('-' for a single pair, or none)."""
    low, high = row.get("speedup_min"), row.get("speedup_max")
    if low is None or (row.get("speedup_pairs") or 0) < 2:
        return "-"
    return f"{low:.2f}-{high:.2f}"


def mark_notes(rows: list[dict[str, Any]], label) -> list[Text]:
    """One line per marked figure: why it is marked, what it would take to measure it."""
    lines = []
    for row in rows:
        flags = row.get("speedup_flags") or ()
        name, figure = label(row), fmt(row["speedup"], ".2f", "x")
        if "above_tau_bound" in flags:
            lines.append(Text(
                f"? {name} {figure}: above what tau {row['mean_accepted_length']:.2f} allows (at most {row['speedup_bound']:.2f}x): noise or a "
                "one-time cost in the reference's time; not ranked; rerun with --repeats 3", style="yellow"))
        if "wide_spread" in flags:
            lines.append(Text(
                f"~ {name} {figure}: its repeats disagree by up to {row['speedup_repeat_spread']:.2f}x (paired ratios "
                f"{row['speedup_min']:.2f}-{row['speedup_max']:.2f}x over {row['speedup_pairs']} runs): the machine's "
                "speed varied; not ranked; rerun with more --repeats", style="yellow"))
    return lines


def noise_line(summary: dict[str, Any]) -> list[Text]:
    """With one repeat the noise of the machine is not measured: say so once."""
    if summary["settings"].get("repeats") != 1:
        return []
    return [Text("one repeat per prompt: no measure of the noise in these figures (rerun with --repeats 3)", style="dim")]


def speed_table(results: list[dict[str, Any]], title: str, first_column: str = "method") -> Table:
    """One row per method (or server): speed, speedup and the range of its paired ratios,
    acceptance, tau, forwards, time to first token."""
    table = Table(show_edge=False, title=title)
    for column in (first_column, "tok/s", "speedup", "range", "acceptance", "tau", "forwards", "ttft s"):
        table.add_column(column, justify="left" if column == first_column else "right")
    for row in results:
        table.add_row(
            row["method"], fmt(row["tokens_per_second"]), speedup_cell(row), range_cell(row),
            fmt(row["acceptance_rate"], ".1%"), fmt(row["mean_accepted_length"]),
            fmt(row["target_forwards"], ".1f"), fmt(row["ttft_seconds"]),
        )
    return table


def bench_table(summary: dict[str, Any]) -> Group:
    title = ("decode speed (after the first token) · speedup = median over prompts of paired ratios to plain "
             "(range: lowest-highest of those ratios)")
    parts: list[Any] = [header(summary), speed_table(summary["results"], title)]
    parts += mark_notes(summary["results"], lambda row: row["method"])
    parts += noise_line(summary)
    per_category = [r for r in summary["results"] if r.get("per_category")]
    if per_category:
        cats = Table(show_edge=False, title="speedup over plain per category (tau of specdec)")
        cats.add_column("category")
        methods = [r for r in per_category if r["method"] != "plain"]
        for r in methods:
            cats.add_column(r["method"], justify="right")
        specdec = next((r for r in per_category if r["method"] == "specdec"), None)
        for category in per_category[0]["per_category"]:
            cells = [speedup_cell(r["per_category"][category]) for r in methods]
            if specdec:
                tau = specdec["per_category"][category]["mean_accepted_length"]
                cells[methods.index(specdec)] += f" ({fmt(tau)})"
            cats.add_row(category, *cells)
        parts.append(cats)
    for name, c in summary.get("comparisons", {}).items():
        ours = name.split("_vs_")[0]
        against = "its chain" if c["method"] == "specdec" else f"{c['method']} (the fastest transformers assisted setting)"
        parts.append(Text(f"{ours} vs {against}: {fmt(c['speedup'], '.2f', 'x')}"))
    parts += compile_lines(summary)
    parts.append(identity_line(summary))
    parts += drift_lines(summary)
    parts += [Text(note, style="dim") for note in summary.get("notes", [])]
    parts.append(Text("acceptance = kept drafts / drafted tokens; tau = tokens emitted per target forward", style="dim"))
    return Group(*parts)


def csv_value(value: Any) -> Any:
    """A list (the flags) as one cell: 'above_tau_bound;wide_spread'."""
    return ";".join(value) if isinstance(value, list) else value


def bench_csv(summary: dict[str, Any]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(("category", "method") + FIELDS)
    for row in summary["results"]:
        writer.writerow(("all", row["method"]) + tuple(csv_value(row.get(f)) for f in FIELDS))
        for category, values in (row.get("per_category") or {}).items():
            writer.writerow((category, row["method"]) + tuple(csv_value(values.get(f)) for f in FIELDS))
    return buffer.getvalue()


TUNE_FIELDS = ("k", "tokens_per_second", "speedup", "speedup_min", "speedup_max", "speedup_flags",
               "predicted_speedup", "acceptance_rate", "alpha", "mean_accepted_length", "recommended")


def tune_csv(summary: dict[str, Any]) -> str:
    """One line per k (and tree); `recommended` is true on the row the verdict recommends."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(TUNE_FIELDS)
    for row in summary["rows"]:
        values = {**row, "recommended": row["k"] == summary["recommended_k"]}
        writer.writerow(tuple(csv_value(values.get(f)) for f in TUNE_FIELDS))
    return buffer.getvalue()


def verdict_text(summary: dict[str, Any]) -> str:
    """The recommendation, or why there is none: 'recommended: k=3 (...)'."""
    v = summary["verdict"]
    if v["k"] is None:
        return "no recommendation: no row has a figure that can be ranked (see the marks above)"
    best = row_label(v["k"])
    spread = (f"{v['median']:.2f}x median, {v['min']:.2f}-{v['max']:.2f}x over {count(v['pairs'], 'paired run')}, "
              f"faster in {v['wins']}") if v["pairs"] else "no paired runs"
    if v["outside_noise"]:
        return f"recommended: {best} (over {v['against']}: {spread})"
    if v["pairs"] < MIN_PAIRS:
        return (f"no recommendation: {best} was fastest, but {count(v['pairs'], 'paired run')} against {v['against']} "
                "gives no measure of the noise (rerun with --repeats 3 or more prompts)")
    return f"no recommendation: {best} is within noise of {v['against']} ({spread})"


def tune_table(summary: dict[str, Any]) -> Group:
    table = Table(show_edge=False, title="lookahead sweep: measured speedup beside the analytic model's prediction")
    for column in ("k", "tok/s", "speedup", "range", "predicted", "acceptance", "a", "tau"):
        table.add_column(column, justify="right")
    table.add_column("speedup", no_wrap=True, min_width=24)
    peak = max((r["speedup"] or 0) for r in summary["rows"]) or 1
    for row in summary["rows"]:
        bar = "█" * round(24 * (row["speedup"] or 0) / peak)
        style = "bold green" if row["k"] == summary["recommended_k"] else None
        table.add_row(
            str(row["k"]), fmt(row["tokens_per_second"]), speedup_cell(row), range_cell(row),
            fmt(row["predicted_speedup"], ".2f", "x"), fmt(row["acceptance_rate"], ".1%"),
            fmt(row["alpha"], ".2f"), fmt(row["mean_accepted_length"]), bar, style=style,
        )
    notes = Text(
        "a = per-token acceptance given the drafts before it were kept; predicted = (1 - a^(k+1)) / (1 - a) / (k c + v(k))\n"
        f"plain decoding {fmt(summary['plain_tokens_per_second'])} tok/s · c (draft/target forward cost) = "
        f"{fmt(summary['c'], '.3f')} · v(k) (verify cost / target step) = "
        + ", ".join(f"{k}: {fmt(v, '.2f')}" for k, v in summary["v"].items())
        + f"\n{verdict_text(summary)}",
        style="dim",
    )
    swept = ", ".join(str(row["k"]) for row in summary["rows"])
    parts: list[Any] = [header(summary, f"k swept: {swept}"), table,
                        *mark_notes(summary["rows"], lambda row: row_label(row["k"])), *noise_line(summary), notes]
    if summary["rows"] and summary["rows"][0].get("per_category"):
        cats = Table(show_edge=False, title="speedup over plain per category, by k")
        cats.add_column("category")
        for row in summary["rows"]:
            cats.add_column(row_label(row["k"]), justify="right")
        for category in summary["rows"][0]["per_category"]:
            cats.add_row(category, *(speedup_cell(r["per_category"][category]) for r in summary["rows"]))
        parts.append(cats)
    parts += compile_lines(summary)
    parts.append(identity_line(summary))
    return Group(*parts)


def verify_report(report: dict[str, Any]) -> Group:
    verdict = Text("PASS: same output as the target" if report["passed"] else "FAIL: see the rows marked FAIL",
                   style="bold green" if report["passed"] else "bold red")
    greedy = Table(show_edge=False, title="1. greedy identity (temperature 0)")
    for column in ("prompt", "against", "tokens", "result", "acceptance"):
        greedy.add_column(column)
    for row in report["greedy"]:
        d = row["divergence"]
        if d is None:
            result = "identical"
        else:
            kind = "near-tie, rounding" if d["near_tie"] else "NOT a tie: FAIL"
            result = f"differs at token {d['position']} (top-2 margin {fmt(d['top2_margin'], '.4f')}: {kind})"
        greedy.add_row(row["prompt"], row["against"], str(row["tokens"]), result, fmt(row["acceptance_rate"], ".0%"),
                       style=None if row["passed"] else "red")
    parts: list[Any] = [Text(f"{report['profile']} · {report['dtype']} · drafter {report['drafter']} · k={report['k']}", style="dim"), greedy]
    if report["distribution"]:
        dist = Table(show_edge=False, title=f"2. distribution (fails below p = {report['alpha']})")
        for column in ("prompt", "samples", "sampling", "first token p", "TV (95% bound)", "two tokens p", "result"):
            dist.add_column(column)
        for row in report["distribution"]:
            dist.add_row(
                row["prompt"], str(row["samples"]),
                f"T={row['temperature']} top-k={row['top_k']} top-p={row['top_p']}",
                fmt(row["first_token_p_value"], ".3f"),
                f"{fmt(row['first_token_tv'], '.3f')} (<= {fmt(row['first_token_tv_upper'], '.3f')})",
                fmt(row["two_token_p_value"], ".3f"), "pass" if row["passed"] else "FAIL",
                style=None if row["passed"] else "red",
            )
        parts.append(dist)
    parts += drift_lines(report)
    parts.append(verdict)
    return Group(*parts)


def crossover_text(summary: dict[str, Any]) -> str:
    """Where speculation stops paying, or that it paid at every batch size measured."""
    sizes = [s["batch_size"] for s in summary["batch_sizes"]]
    crossover = summary["crossover_batch_size"]
    unranked = [str(s["batch_size"]) for s in summary["batch_sizes"] if s["k"] is None]
    skipped = f" (not ranked at batch size {', '.join(unranked)}: every figure there is marked)" if unranked else ""
    if crossover is not None:
        return (f"crossover: batch size {crossover}, the smallest where specdec's chosen k is no faster than plain"
                + skipped)
    if len(unranked) == len(sizes):
        return "no crossover named: no batch size has a figure that can be ranked (see the marks above)"
    return f"no crossover in batch sizes {sizes[0]}-{sizes[-1]}: specdec was faster than plain at each" + skipped


def k_table_text(summary: dict[str, Any]) -> str:
    """The best k per batch size (0: plain) as tune-k --write would put it into the profile."""
    table = summary["k_by_batch_size"]
    if summary["settings"]["k_auto"]:
        return "k: auto chose each step's k; `specdec tune-k --batch-sizes` measures each k and writes a table"
    if table is None:
        return "best k per batch size: none (a batch size has no figure that can be ranked)"
    unsure = [s["batch_size"] for s in summary["batch_sizes"] if s["recommended_k"] is None]
    body = "{" + ", ".join(f"{size}: {k}" for size, k in table.items()) + "}"
    return f"best k per batch size (from each up; 0 = plain): {body}" + (
        f"; within noise at batch size {', '.join(map(str, unsure))}" if unsure else "")


def batch_table(summary: dict[str, Any]) -> Group:
    """One row per batch size: plain and specdec (at the k with the best goodput) side by side."""
    table = Table(show_edge=False, title="tokens/s by batch size: total (every row's tokens over the run, prefills "
                  "included) and per row · speedup = median paired ratio to plain")
    for column in ("batch", "plain", "plain/row", "specdec", "spec/row", "speedup", "range", "k", "accept", "tau"):
        table.add_column(column, justify="right")
    for size in summary["batch_sizes"]:
        plain, spec = size["plain"], size["specdec"]
        style = "yellow" if size["batch_size"] == summary["crossover_batch_size"] else None
        table.add_row(
            str(size["batch_size"]), fmt(plain["tokens_per_second"], ".1f"), fmt(plain["row_tokens_per_second"], ".1f"),
            fmt(spec["tokens_per_second"], ".1f"), fmt(spec["row_tokens_per_second"], ".1f"), speedup_cell(spec),
            range_cell(spec), str(spec["k"]) if size["k"] is not None else f"({spec['k']})",
            fmt(spec["acceptance_rate"], ".1%"), fmt(spec["mean_accepted_length"]), style=style,
        )
    s = summary["settings"]
    tried = "k: auto" if s["k_auto"] else f"k tried: {', '.join(map(str, s['ks']))}"
    parts: list[Any] = [header(summary, tried), table]
    rows = [dict(r, batch_size=size["batch_size"]) for size in summary["batch_sizes"] for r in size["ks"]]
    parts += mark_notes(rows, lambda row: f"batch {row['batch_size']} k={row['k']}")
    parts += noise_line(summary)
    parts.append(Text(crossover_text(summary)))
    parts.append(Text(k_table_text(summary), style="dim"))
    parts.append(identity_line(summary))
    parts.append(Text(
        "/row = a row's own tokens over the steps it was in, averaged over rows; k = the k with the best "
        "goodput ('(k)': every figure marked, none ranked); acceptance = kept drafts / drafted tokens; "
        "tau = tokens per target forward (per row)"
        + ("; k auto = the profile's k: auto as generate runs it (in a batch each step's k chosen by goodput, "
           "0 included; its first probe round begins in the warm-up, as in a pipeline that has already run a "
           "batch of that size)" if s["k_auto"] else ""), style="dim"))
    return Group(*parts)
