"""`specdec bench --endpoint URL`: check the options, probe the servers, run with a progress bar on
stderr, and report through the bench's own output path (human table, JSON, CSV, --output).

Every option is checked before the first network call. Ctrl-C keeps the prompts that finished
(exit 130, no --output written), as a local bench does. A server that fails mid-run gets the
finished prompts reported, then its one-line error (exit 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..bench.endpoint import BASELINE_NAME, EndpointBench
from ..bench.workload import load_prompts
from ..errors import EXIT_INTERRUPTED, EXIT_OK, UsageError
from ..profile import load_profile, with_overrides
from ..serving.endpoint_client import Client, EndpointError, EndpointSettings, check_settings, normalize_url, probe
from ..specs import SamplingSpec
from .bench import emit_report, progress_bar
from .output import Output
from .tables import bench_csv, count, fmt, mark_notes, noise_line, speed_table, speedup_cell


def check_endpoint_options(endpoint: str | None, given: dict[str, Any], local_only: dict[str, Any]) -> None:
    """--endpoint's own options need it; the options that shape a local run mean nothing with it."""
    if endpoint is None:
        named = next(name for name, value in given.items() if value is not None)
        raise UsageError(f"{named} needs --endpoint URL (the server to measure)")
    for name, value in local_only.items():
        if value:
            raise UsageError(f"{name} has no effect with --endpoint: the server's own model and speculation settings apply")


def run_endpoint_bench(out: Output, *, endpoint: str | None, baseline_endpoint: str | None, model: str | None,
                       concurrency: int | None, timeout: float | None, api: str | None, profile: str,
                       prompts: Path | None, category: Sequence[str], limit: int | None, max_new_tokens: int | None,
                       repeats: int, warmup: int, temperature: float | None, seed: int, fmt_name: str,
                       output: Path | None, local_only: dict[str, Any]) -> int:
    # 1. every option, before any network call
    check_endpoint_options(endpoint, {"--baseline-endpoint": baseline_endpoint, "--model": model,
                                      "--concurrency": concurrency, "--timeout": timeout, "--api": api}, local_only)
    url = normalize_url(endpoint, "--endpoint")
    baseline_url = normalize_url(baseline_endpoint, "--baseline-endpoint") if baseline_endpoint else None
    if baseline_url == url:
        raise UsageError("--baseline-endpoint is the same server as --endpoint; give the one serving without speculation")
    if model is not None and not model.strip():
        raise UsageError("--model: must not be empty")
    api_name, n_concurrent, seconds = check_settings(api, concurrency, timeout)
    if repeats < 1 or warmup < 0:
        raise UsageError("--repeats must be at least 1 and --warmup at least 0")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise UsageError("--max-new-tokens: must be at least 1")
    chosen = with_overrides(load_profile(profile), temperature=temperature)
    # a profile lends a server run its sampling settings only: the report names it when they came from it
    unshaped = SamplingSpec(temperature=chosen.sampling.temperature) if temperature is not None else SamplingSpec()
    sampling_profile = chosen.name if chosen.sampling != unshaped else None
    chosen_prompts = load_prompts(prompts, category or (), limit)
    settings = EndpointSettings(
        max_new_tokens=max_new_tokens or 128, repeats=repeats, warmup=warmup, sampling=chosen.sampling, seed=seed,
        api=api_name, concurrency=n_concurrent, timeout=seconds,
    )

    # 2. the servers: reachable, OpenAI-compatible, which model, which counters
    client = Client(seconds, n_concurrent)
    try:
        with out.info.status(f"probing {url} ...", spinner="dots"):
            server, notes = probe(client, "endpoint", url, model)
            baseline = None
            if baseline_url:
                baseline, more = probe(client, BASELINE_NAME, baseline_url, model)
                notes += more
        bench = EndpointBench(client, server, baseline, chosen_prompts, settings, notes)
        return run_and_report(out, bench, sampling_profile, fmt_name, output)
    finally:
        client.close()


def run_and_report(out: Output, bench: EndpointBench, profile_name: str | None, fmt_name: str,
                   output: Path | None) -> int:
    code, failure = EXIT_OK, None
    try:
        with progress_bar(out, bench.total_runs) as advance:
            bench.run(advance)
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except EndpointError as exc:
        failure = exc
    if code == EXIT_INTERRUPTED or failure is not None:
        finished = bench.complete_prompts()
        if not finished:
            if failure is not None:
                raise failure
            out.message("interrupted before any prompt finished: nothing to report")
            return code
        why = "interrupted" if failure is None else "stopped by a server error"
        out.message(f"{why}: the {len(finished)} prompts that finished (no --output written)")
    summary = bench.summary(profile_name)
    emit_report(out, summary, fmt_name, None if (code or failure) else output, endpoint_table, bench_csv)
    if failure is not None:
        raise failure
    return code


# --------------------------------------------------------------------------- the human report


def sampling_note(summary: dict[str, Any]) -> str:
    """top-k / top-p when set, and the profile they came from (none: greedy or --temperature alone)."""
    s = summary["settings"]
    knobs = ([f"top-k {s['top_k']}"] if s["top_k"] else []) + ([f"top-p {s['top_p']}"] if s["top_p"] < 1.0 else [])
    where = f"sampling from profile {summary['profile']}" if summary.get("profile") else ""
    return "".join(f", {k}" for k in knobs) + (f" ({where})" if where else "")


def endpoint_table(summary: dict[str, Any]) -> Group:
    """The local bench's table (tok/s, speedup, acceptance, tau, forwards, TTFT) for a server."""
    e, s = summary["endpoint"], summary["settings"]
    where = f"{e['url']} ({e['engine']}, model {e['model']})"
    if summary["baseline_endpoint"]:
        b = summary["baseline_endpoint"]
        where += f" vs baseline {b['url']} ({b['engine']})"
    header = Text(
        f"{where}\n{count(s['prompts'], 'prompt')} · {s['max_new_tokens']} new tokens · "
        f"{count(s['repeats'], 'repeat')} after {s['warmup']} warm-up · /v1/{'chat/completions' if s['api'] == 'chat' else 'completions'}"
        f" · concurrency {s['concurrency']} · temperature {s['temperature']}" + sampling_note(summary),
        style="dim",
    )
    title = "decode speed (after the first token)"
    if summary["baseline_endpoint"]:
        title += " · speedup = median over prompts of paired ratios to the baseline (range: lowest-highest of those ratios)"
    table = speed_table(summary["results"], title, first_column="server")
    parts: list[Any] = [header, table, *mark_notes(summary["results"], lambda row: row["method"])]
    if summary["baseline_endpoint"]:
        parts += noise_line(summary)
    endpoint_row = summary["results"][-1]
    per_position = endpoint_row.get("per_position_acceptance")
    if per_position:
        parts.append(Text("per-position acceptance (drafts whose token i was kept / drafts): "
                          + "  ".join(f"{i}: {fmt(a, '.0%')}" for i, a in enumerate(per_position))))
    per_category = [r for r in summary["results"] if r.get("per_category")]
    if per_category and summary["baseline_endpoint"]:
        cats = Table(show_edge=False, title="speedup over the baseline per category (tau of the endpoint)")
        cats.add_column("category")
        cats.add_column("speedup", justify="right")
        for category, values in endpoint_row["per_category"].items():
            cats.add_row(category, speedup_cell(values) + f" ({fmt(values['mean_accepted_length'])})")
        parts.append(cats)
    source = endpoint_row.get("speculation_source")
    parts.append(Text(f"speculation counters: {source}" if source else "acceptance unknown: the server gave no "
                      "speculation counters", style="dim" if source else "yellow"))
    identical = summary["outputs_identical"]
    if identical is True:
        parts.append(Text("the endpoint's text equals the baseline's on every prompt", style="green"))
    elif identical is False:
        diffs = summary["differences"]
        parts.append(Text(f"{len(diffs)} prompts differ from the baseline's text (first at character "
                          f"{diffs[0]['character']} of {diffs[0]['prompt']}): a server verifies drafts with other "
                          "kernels than its one-token step (batched, reduced-precision or quantized), which can "
                          "flip a near-tie", style="yellow"))
    parts += [Text(note, style="dim") for note in summary.get("notes", []) if not note.startswith("acceptance unknown")]
    parts.append(Text("acceptance = kept drafts / drafted tokens; tau = tokens emitted per target forward", style="dim"))
    return Group(*parts)
