"""Bench and tune-k reports as Rich tables (for people) and CSV (for scripts)."""

from __future__ import annotations

import csv
import io
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

FIELDS = ("tokens_per_second", "speedup", "acceptance_rate", "mean_accepted_length", "target_forwards")


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


def compile_lines(summary: dict[str, Any]) -> list[Text]:
    """The compile time (compile: on), which no figure above includes; none when nothing was compiled."""
    seconds = summary.get("compile_seconds") or 0.0
    if seconds <= 0:
        return []
    return [Text(f"compiled the decode steps in {seconds:.1f} s (not in the figures above)", style="dim")]


def speed_table(results: list[dict[str, Any]], title: str, first_column: str = "method") -> Table:
    """One row per method (or server): speed, speedup, acceptance, tau, forwards, time to first token."""
    table = Table(show_edge=False, title=title)
    for column in (first_column, "tok/s", "speedup", "acceptance", "tau", "forwards", "ttft s"):
        table.add_column(column, justify="left" if column == first_column else "right")
    for row in results:
        table.add_row(
            row["method"], fmt(row["tokens_per_second"]), fmt(row["speedup"], ".2f", "x"),
            fmt(row["acceptance_rate"], ".1%"), fmt(row["mean_accepted_length"]),
            fmt(row["target_forwards"], ".1f"), fmt(row["ttft_seconds"]),
        )
    return table


def bench_table(summary: dict[str, Any]) -> Group:
    title = "decode speed (after the first token) · speedup = median over prompts of paired ratios to plain"
    parts: list[Any] = [header(summary), speed_table(summary["results"], title)]
    per_category = [r for r in summary["results"] if r.get("per_category")]
    if per_category:
        cats = Table(show_edge=False, title="speedup over plain per category (tau of specdec)")
        cats.add_column("category")
        methods = [r for r in per_category if r["method"] != "plain"]
        for r in methods:
            cats.add_column(r["method"], justify="right")
        specdec = next((r for r in per_category if r["method"] == "specdec"), None)
        for category in per_category[0]["per_category"]:
            cells = [fmt(r["per_category"][category]["speedup"], ".2f", "x") for r in methods]
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
    parts += [Text(note, style="dim") for note in summary.get("notes", [])]
    parts.append(Text("acceptance = kept drafts / drafted tokens; tau = tokens emitted per target forward", style="dim"))
    return Group(*parts)


def bench_csv(summary: dict[str, Any]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(("category", "method") + FIELDS)
    for row in summary["results"]:
        writer.writerow(("all", row["method"]) + tuple(row[f] for f in FIELDS))
        for category, values in (row.get("per_category") or {}).items():
            writer.writerow((category, row["method"]) + tuple(values[f] for f in FIELDS))
    return buffer.getvalue()


def row_label(k: int | str) -> str:
    """A tune-k row's name: k=4, k=auto, tree=16."""
    return k if isinstance(k, str) and k.startswith("tree=") else f"k={k}"


def tune_table(summary: dict[str, Any]) -> Group:
    table = Table(show_edge=False, title="lookahead sweep: measured speedup beside the analytic model's prediction")
    for column in ("k", "tok/s", "speedup", "predicted", "acceptance", "a", "tau"):
        table.add_column(column, justify="right")
    table.add_column("speedup", no_wrap=True, min_width=24)
    peak = max((r["speedup"] or 0) for r in summary["rows"]) or 1
    for row in summary["rows"]:
        bar = "█" * round(24 * (row["speedup"] or 0) / peak)
        style = "bold green" if row["k"] == summary["best_k"] else None
        table.add_row(
            str(row["k"]), fmt(row["tokens_per_second"]), fmt(row["speedup"], ".2f", "x"),
            fmt(row["predicted_speedup"], ".2f", "x"), fmt(row["acceptance_rate"], ".1%"),
            fmt(row["alpha"], ".2f"), fmt(row["mean_accepted_length"]), bar, style=style,
        )
    notes = Text(
        "a = per-token acceptance given the drafts before it were kept; predicted = (1 - a^(k+1)) / (1 - a) / (k c + v(k))\n"
        f"plain decoding {fmt(summary['plain_tokens_per_second'])} tok/s · c (draft/target forward cost) = "
        f"{fmt(summary['c'], '.3f')} · v(k) (verify cost / target step) = "
        + ", ".join(f"{k}: {fmt(v, '.2f')}" for k, v in summary["v"].items())
        + f"\nrecommended: {summary['best_k']}",
        style="dim",
    )
    swept = ", ".join(str(row["k"]) for row in summary["rows"])
    parts: list[Any] = [header(summary, f"k swept: {swept}"), table, notes]
    if summary["rows"] and summary["rows"][0].get("per_category"):
        cats = Table(show_edge=False, title="speedup over plain per category, by k")
        cats.add_column("category")
        for row in summary["rows"]:
            cats.add_column(row_label(row["k"]), justify="right")
        for category in summary["rows"][0]["per_category"]:
            cats.add_row(category, *(fmt(r["per_category"][category]["speedup"], ".2f", "x") for r in summary["rows"]))
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
    parts.append(verdict)
    return Group(*parts)
