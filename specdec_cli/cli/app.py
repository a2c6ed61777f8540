"""The `specdec` command: the Typer app and every command's options, checked before any model
loads, each run handed to its command's module (export and profiles, which load no model, are
their own modules).

Exit codes: 0 ok, 1 runtime failure, 2 bad usage or profile, 130 interrupted.
Errors are one line on stderr; SPECDEC_DEBUG=1 shows the traceback as well.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..bench.options import parse_ks, parse_trees, require_plotting
from ..bench.workload import load_prompts
from ..constraints.grammars import from_options
from ..errors import UsageError
from ..prompt_runs import AUTO_BATCH, MAX_BATCH, check_prompt
from ..run_clock import restart
from ..specs import Workload
from .bench_options import (
    batch_setup,
    bench_settings,
    check_batch_methods,
    check_write_options,
    parse_methods,
    refuse_beside_batch_sizes,
)
from .cache import cache_app
from .exit_codes import exit_code_of
from .export import export
from .options import (
    AnyJsonOpt,
    BatchSizesOpt,
    BenchNewOpt,
    BenchSeedOpt,
    CategoryOpt,
    ChatOpt,
    CompileOpt,
    DeviceOpt,
    DrafterOpt,
    DraftOpt,
    DtypeOpt,
    Format,
    GrammarOpt,
    HeadKind,
    JsonSchemaOpt,
    KOpt,
    LimitOpt,
    MaxNewOpt,
    OutputOpt,
    ProfileOpt,
    PromptsOpt,
    QuantizeOpt,
    RegexOpt,
    RepeatsOpt,
    ReportFormat,
    SeedOpt,
    TargetOpt,
    TemperatureOpt,
    TopKOpt,
    TopPOpt,
    TreeOpt,
    VerboseOpt,
    WarmupOpt,
)
from .profiles import profiles_app
from .serve import serve
from .setup import check_stops, load_pipeline, profile_name, read_prompt, resolved_profile, start
from .verify import verify

app = typer.Typer(
    name="specdec",
    help="Exact speculative decoding: the target model's own output, with fewer target forward passes.",
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def show_version(value: bool) -> None:
    if value:
        from .. import __version__

        sys.stdout.write(f"specdec {__version__}\n")
        raise typer.Exit(0)


@app.callback(invoke_without_command=True)
def common(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", callback=show_version, is_eager=True, help="print the version and exit")] = False,
) -> None:
    """Exact speculative decoding: the target model's own output, with fewer target forward passes."""
    if ctx.invoked_subcommand is None:  # `specdec` alone: the help, which is what was asked for
        sys.stdout.write(ctx.get_help() + "\n")
        raise typer.Exit(0)


# --------------------------------------------------------------------------- generate


@app.command()
def generate(
    prompt: Annotated[Optional[str], typer.Argument(help="the prompt; '-' or nothing (with stdin piped) reads stdin")] = None,
    profile: ProfileOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    drafter: DrafterOpt = None,
    k: KOpt = None,
    max_new_tokens: MaxNewOpt = None,
    temperature: TemperatureOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    seed: SeedOpt = None,
    chat: ChatOpt = None,
    output_format: Annotated[Optional[Format], typer.Option("--format", "-f", help="human (live view) when stdout is a terminal, else text; with --prompts, jsonl only")] = None,
    samples: Annotated[int, typer.Option("--samples", min=1, metavar="N", help="independent samples of the prompt (models load once)")] = 1,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", metavar="TEXT", help="end where the text first contains TEXT, which is left out (finish reason 'stop'); \\n is a newline; repeatable")] = None,
    live: Annotated[bool, typer.Option("--live/--no-live", help="redraw the human view as tokens arrive")] = True,
    show_rejected: Annotated[bool, typer.Option("--show-rejected", help="keep rejected drafts in the view (struck through)")] = False,
    prompt_file: Annotated[Optional[Path], typer.Option("--prompt-file", help="read the prompt from this file")] = None,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", metavar="FILE", help="run every prompt of FILE ('-': stdin) with one load: JSONL rows {\"prompt\": ...} (optional \"id\") or Spec-Bench's {\"question_id\", \"turns\"} (the first turn only), else text, one prompt a line; writes one JSON object a prompt, in input order (see above)")] = None,
    batch_size: Annotated[Optional[str], typer.Option("--batch-size", metavar="N|auto", help=f"with --prompts: prompts decoded at once (up to {MAX_BATCH}), or auto: {AUTO_BATCH} where the profile runs in a batch, else 1 (a rule; bench --batch-sizes measures) [default: 1]")] = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    quantize: QuantizeOpt = None,
    compile_mode: CompileOpt = None,
    tree: TreeOpt = None,
    json_schema: JsonSchemaOpt = None,
    any_json: AnyJsonOpt = False,
    regex: RegexOpt = None,
    grammar: GrammarOpt = None,
    verbose: VerboseOpt = 0,
) -> None:
    """Generate a continuation of PROMPT with speculative decoding.

    With -f json: stats.acceptance_rate = kept drafts / drafted tokens; stats.alpha = the chance a
    draft is kept when the drafts before it were (the per-token acceptance of the papers);
    stats.mean_accepted_length (tau) = tokens emitted per target forward.

    With --prompts FILE: JSONL on stdout, one object a prompt in input order, each written as soon
    as it and all before it are done: id (the row's id or question_id, else its line number),
    index (0-based), text, token_ids, prompt_tokens, new_tokens, finish_reason, seed, stats. A
    prompt that cannot run (empty, too long for the context) is {id, index, error} and the rest
    still run. --seed S gives prompt i the seed S + i. Exit 0: every row ran; 1: some rows are
    error rows (every other row is written; as with xargs, a script notices); 130: Ctrl-C, every
    finished row written (the prompts in progress left out). --batch-size N decodes N prompts at
    once, each row as it is alone, with any drafter, chain of drafters or tree; k: auto on chains
    picks each step's k by measured tokens/s, 0 included."""
    out = start(verbose)
    if prompts is not None:
        from .generate_prompts import read_rows

        rows, size, row_constraints = read_rows(prompts, prompt=prompt, prompt_file=prompt_file, samples=samples,
                                                fmt=output_format and output_format.value, batch_size=batch_size)
    elif batch_size is not None:
        raise UsageError("--batch-size goes with --prompts (one prompt runs alone)")
    else:
        fmt = output_format or (Format.human if out.stdout_is_tty else Format.text)
        if samples > 1 and fmt == Format.json:
            raise UsageError("--samples N writes one object per sample: use --format jsonl")
        text = read_prompt(prompt, prompt_file)
        check_prompt(text, "pass it as an argument, with --prompt-file, or on stdin")  # the library's check (Pipeline.encode's), here before the models take their time to load
    stops = check_stops(stop or ())
    chosen = resolved_profile(
        profile, target=target, draft=draft, drafter=drafter, k=k, max_new_tokens=max_new_tokens,
        temperature=temperature, top_k=top_k, top_p=top_p, chat=chat, device=device, dtype=dtype,
        quantize=quantize, compile=compile_mode, tree=tree,
        constraint=from_options(json_schema=json_schema, any_json=any_json, regex=regex, grammar=grammar),
    )
    if prompts is not None:
        from .generate_prompts import run_prompts

        if not rows:  # nothing to do: no models to load (as xargs -r runs nothing)
            logging.getLogger("specdec").warning("--prompts: no prompts in %s", "stdin" if str(prompts) == "-" else prompts)
            raise typer.Exit(0)
        pipeline = load_pipeline(chosen, out, Workload.of(len(rows), chosen.max_new_tokens))
        raise typer.Exit(run_prompts(pipeline, rows, out, seed=seed, stops=stops, batch_size=size,
                                     constraints=row_constraints))
    pipeline = load_pipeline(chosen, out, Workload.of(samples, chosen.max_new_tokens))
    from .generate import run_generate

    code = run_generate(
        pipeline, text, out, fmt=fmt.value, samples=samples, seed=seed, live=live,
        show_rejected=show_rejected, verbose=verbose, stops=stops,
    )
    raise typer.Exit(code)


# --------------------------------------------------------------------------- bench and tune-k


@app.command()
def bench(
    profile: ProfileOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    drafter: DrafterOpt = None,
    prompts: PromptsOpt = None,
    category: CategoryOpt = None,
    limit: LimitOpt = None,
    max_new_tokens: BenchNewOpt = None,
    repeats: RepeatsOpt = 3,
    warmup: WarmupOpt = 1,
    k: KOpt = None,
    temperature: TemperatureOpt = None,
    seed: BenchSeedOpt = 0,
    methods: Annotated[Optional[str], typer.Option("--methods", help="comma-separated: plain, specdec (a chain of k), specdec-tree (a token tree), hf-plain, hf-assisted [default: plain,specdec,hf-plain,hf-assisted]")] = None,
    hf_ks: Annotated[Optional[str], typer.Option("--hf-ks", help="constant k values for transformers' assisted generation, e.g. 3,5,8 [default: --k]")] = None,
    output_format: Annotated[ReportFormat, typer.Option("--format", "-f", help="human, json or csv")] = ReportFormat.human,
    output: OutputOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    quantize: QuantizeOpt = None,
    compile_mode: CompileOpt = None,
    tree: Annotated[Optional[str], typer.Option("--tree", help="the tree of the specdec-tree method: auto, NODES or NODES/WIDTH/DEPTH, e.g. 16/4/6 [default: the profile's, else auto]")] = None,
    endpoint: Annotated[Optional[str], typer.Option("--endpoint", metavar="URL", help="measure a running OpenAI-compatible server (specdec serve, vLLM, SGLang, llama.cpp) instead of loading models; $OPENAI_API_KEY, if set, is sent as its key")] = None,
    baseline_endpoint: Annotated[Optional[str], typer.Option("--baseline-endpoint", metavar="URL", help="the same model served without speculation: speedups paired per prompt")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="model name to request from --endpoint [default: the one it serves]")] = None,
    concurrency: Annotated[Optional[int], typer.Option("--concurrency", help="requests in flight at once, with --endpoint [default: 1]")] = None,
    timeout: Annotated[Optional[float], typer.Option("--timeout", help="seconds to wait for a server's answer, with --endpoint [default: 60]")] = None,
    api: Annotated[Optional[str], typer.Option("--api", help="chat (/v1/chat/completions) or completions (/v1/completions), with --endpoint [default: chat]")] = None,
    batch_sizes: BatchSizesOpt = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="with --batch-sizes: save total tokens/s against batch size, plain and specdec, as a PNG (needs matplotlib)")] = None,
    drift: Annotated[bool, typer.Option("--drift/--no-drift", help="a quantized target at temperature 0: after the timed runs, compare its greedy text with the unquantized model's (loads that model once more)")] = True,
    json_schema: JsonSchemaOpt = None,
    any_json: AnyJsonOpt = False,
    regex: RegexOpt = None,
    grammar: GrammarOpt = None,
    verbose: VerboseOpt = 0,
) -> None:
    """Plain decoding vs specdec vs transformers' generate (alone and assisted), same prompts, same run."""
    out = start(verbose)
    constraint = from_options(json_schema=json_schema, any_json=any_json, regex=regex, grammar=grammar)
    if any(v is not None for v in (endpoint, baseline_endpoint, model, concurrency, timeout, api)):
        from .endpoint import run_endpoint_bench  # a running server instead of local models

        raise typer.Exit(run_endpoint_bench(
            out, endpoint=endpoint, baseline_endpoint=baseline_endpoint, model=model, concurrency=concurrency,
            timeout=timeout, api=api, profile=profile_name(profile), prompts=prompts, category=category or (),
            limit=limit, max_new_tokens=max_new_tokens, repeats=repeats, warmup=warmup, temperature=temperature,
            seed=seed, fmt_name=output_format.value, output=output,
            local_only={"--k": k, "--methods": methods, "--hf-ks": hf_ks, "--device": device, "--dtype": dtype,
                        "--quantize": quantize, "--compile": compile_mode, "--tree": tree, "--target": target, "--draft": draft,
                        "--drafter": drafter, "--batch-sizes": batch_sizes, "--plot": plot, "--json-schema": json_schema,
                        "--json": any_json or None, "--regex": regex, "--grammar": grammar},
        ))
    if batch_sizes is not None:
        refuse_beside_batch_sizes({"--hf-ks": hf_ks, "--tree": tree}, output_format.value)
        if methods is not None:
            check_batch_methods(methods)
        chosen, sizes, chosen_prompts, settings = batch_setup(
            batch_sizes, plot, profile, target=target, draft=draft, drafter=drafter, k=k, temperature=temperature,
            device=device, dtype=dtype, quantize=quantize, compile=compile_mode, prompts=prompts, category=category, limit=limit,
            max_new_tokens=max_new_tokens, repeats=repeats, warmup=warmup, seed=seed, constraint=constraint)
        from .bench import batch_ks, run_batch_command

        pipeline = load_pipeline(chosen, out)
        raise typer.Exit(run_batch_command(
            pipeline, out, prompts=chosen_prompts, settings=settings, batch_sizes=sizes, ks=batch_ks(chosen.k),
            fmt=output_format.value, output=output, plot=plot, auto=chosen.k == "auto",
        ))
    if plot is not None:
        raise UsageError("--plot goes with --batch-sizes (bench draws throughput against batch size)")
    # every option is checked before the models load: a typo costs no minutes
    chosen = resolved_profile(profile, target=target, draft=draft, drafter=drafter, k=k, temperature=temperature,
                              device=device, dtype=dtype, quantize=quantize, compile=compile_mode, tree=tree,
                              constraint=constraint)
    chosen_prompts = load_prompts(prompts, category or (), limit)
    settings = bench_settings(chosen, max_new_tokens, repeats, warmup, seed)
    method_names = parse_methods(methods, constrained=chosen.constraint is not None)
    hf_k_values = parse_ks(hf_ks, None, "--hf-ks") if hf_ks else []
    from ..bench.local import bench_workload
    from .bench import run_bench_command

    pipeline = load_pipeline(chosen, out, bench_workload(len(chosen_prompts), settings, method_names))
    raise typer.Exit(run_bench_command(
        pipeline, out, prompts=chosen_prompts, methods=method_names, hf_ks=hf_k_values,
        settings=settings, fmt=output_format.value, output=output, drift=drift,
    ))


@app.command("tune-k")
def tune_k(
    profile: ProfileOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    drafter: DrafterOpt = None,
    ks: Annotated[Optional[str], typer.Option("--ks", help="the k values to try, comma-separated [default: 1,2,3,4,6,8]")] = None,
    k_max: Annotated[Optional[int], typer.Option("--k-max", help="try every k from 1 to this")] = None,
    auto: Annotated[Optional[bool], typer.Option("--auto/--no-auto", help="also run k: auto as one more row (not with --batch-sizes) [default: --auto]")] = None,
    trees: Annotated[Optional[str], typer.Option("--trees", help="token trees to try beside the chains, comma-separated, each auto, NODES or NODES/WIDTH/DEPTH as --tree takes it, e.g. 8,16/4/6,auto")] = None,
    prompts: PromptsOpt = None,
    category: CategoryOpt = None,
    limit: LimitOpt = None,
    max_new_tokens: BenchNewOpt = None,
    repeats: RepeatsOpt = 3,
    warmup: WarmupOpt = 1,
    temperature: TemperatureOpt = None,
    seed: BenchSeedOpt = 0,
    write: Annotated[bool, typer.Option("--write", help="put the recommended k into the profile (a shipped one is copied to your config dir); refused when the winner is within noise")] = False,
    force: Annotated[bool, typer.Option("--force", help="with --write: write the fastest k even when it is within noise of the next")] = False,
    output_format: Annotated[ReportFormat, typer.Option("--format", "-f", help="human, json or csv")] = ReportFormat.human,
    output: OutputOpt = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="save measured and predicted speedup per k as a PNG (with --batch-sizes: tokens/s against batch size; needs matplotlib)")] = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    quantize: QuantizeOpt = None,
    compile_mode: CompileOpt = None,
    batch_sizes: BatchSizesOpt = None,
    verbose: VerboseOpt = 0,
) -> None:
    """Sweep k (and token trees), show measured speedup beside the analytic prediction, and recommend the fastest."""
    out = start(verbose)
    if batch_sizes is not None:  # the best k (0: plain) per batch size, and --write's table
        refuse_beside_batch_sizes({"--trees": trees, "--auto": auto or None}, output_format.value)
        chosen, sizes, chosen_prompts, settings = batch_setup(
            batch_sizes, plot, profile, target=target, draft=draft, drafter=drafter, temperature=temperature,
            device=device, dtype=dtype, quantize=quantize, compile=compile_mode, prompts=prompts, category=category, limit=limit,
            max_new_tokens=max_new_tokens, repeats=repeats, warmup=warmup, seed=seed)
        k_values = parse_ks(ks, k_max)
        check_write_options(write, force, chosen)
        from .bench import run_batch_command

        pipeline = load_pipeline(chosen, out)
        raise typer.Exit(run_batch_command(
            pipeline, out, prompts=chosen_prompts, settings=settings, batch_sizes=sizes, ks=k_values,
            fmt=output_format.value, output=output, plot=plot, write=write, force=force,
        ))
    auto = True if auto is None else auto
    # every option (and --plot's matplotlib, --write's file) is checked before the sweep starts
    chosen = resolved_profile(profile, target=target, draft=draft, drafter=drafter, temperature=temperature,
                              device=device, dtype=dtype, quantize=quantize, compile=compile_mode)
    k_values = parse_ks(ks, k_max)
    tree_values = parse_trees(trees)
    chosen_prompts = load_prompts(prompts, category or (), limit)
    settings = bench_settings(chosen, max_new_tokens, repeats, warmup, seed)
    if plot is not None:
        require_plotting()
    check_write_options(write, force, chosen)
    from ..bench.tune import tune_workload
    from .bench import run_tune_command

    pipeline = load_pipeline(chosen, out, tune_workload(len(chosen_prompts), settings, k_values, auto, tree_values))
    raise typer.Exit(run_tune_command(
        pipeline, out, prompts=chosen_prompts, ks=k_values, auto=auto, settings=settings,
        fmt=output_format.value, output=output, write=write, force=force, plot=plot, trees=tree_values,
    ))


# --------------------------------------------------------------------------- train-draft


@app.command("train-draft")
def train_draft(
    kind: Annotated[HeadKind, typer.Option("--kind", help="medusa (heads over the last state) or eagle (an EAGLE-3 layer)")],
    out_dir: Annotated[Path, typer.Option("--out", help="folder to write the head to (e.g. ~/.cache/specdec/heads/NAME)")],
    profile: ProfileOpt = None,
    target: TargetOpt = None,
    data: Annotated[str, typer.Option("--data", help="prompts: a .txt (one per line) or .jsonl file, or a built-in set: mixed, everyday, python-docs (offline)")] = "mixed",
    heads: Annotated[int, typer.Option("--heads", min=1, metavar="N", max=16, help="draft depth trained: Medusa heads, or EAGLE-3 training-time-test steps")] = 4,
    epochs: Annotated[int, typer.Option("--epochs", min=1, metavar="N", help="passes over the training data")] = 3,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, metavar="N", help="length of each answer the target writes")] = 128,
    limit: Annotated[Optional[int], typer.Option("--limit", min=2, metavar="N", help="use the first N prompts")] = None,
    texts: Annotated[bool, typer.Option("--texts", help="learn the given texts as they are, not the target's answers to them")] = False,
    held_out: Annotated[float, typer.Option("--held-out", min=0.01, max=0.5, metavar="FRACTION", help="share of prompts kept out of training to measure acceptance")] = 0.1,
    lr: Annotated[float, typer.Option("--lr", min=1e-7, metavar="RATE", help="learning rate (AdamW)")] = 1e-3,
    batch: Annotated[int, typer.Option("--batch", min=0, metavar="N", help="Medusa: positions per step (0: 256); EAGLE: sequences per step (0: 4)")] = 0,
    seed: Annotated[int, typer.Option("--seed", help="seed for initialisation, order and the held-out split")] = 0,
    draft_vocab: Annotated[int, typer.Option("--draft-vocab", min=0, metavar="N", help="tokens the head can draft: the answers' most frequent, then the lowest ids (0: the whole vocabulary)")] = 8192,
    save_every: Annotated[int, typer.Option("--save-every", min=1, metavar="N", help="write a checkpoint every N steps (and at each epoch's end)")] = 50,
    resume: Annotated[bool, typer.Option("--resume", help="continue the checkpoint in --out")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="start over even if --out holds a head")] = False,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    verbose: VerboseOpt = 0,
) -> None:
    """Train Medusa heads or an EAGLE-3 layer on the frozen target (self-distilled answers by default)."""
    from dataclasses import replace

    from ..specs import DrafterSpec
    from ..training.api import TrainRequest
    from ..training.trainer import TrainSettings
    from .train import run_train_command

    out = start(verbose)
    chosen = resolved_profile(profile, target=target, device=device, dtype=dtype, temperature=0.0)
    # the target answers alone (transformers' generate, batched): no draft model to load, and the
    # profile's head may not exist yet
    chosen = replace(chosen, drafter=DrafterSpec(kind="ngram", options={"max_ngram": 3, "min_ngram": 1}))
    settings = TrainSettings(kind=kind.value, depth=heads, epochs=epochs, lr=lr, batch=batch, seed=seed,
                             draft_vocab=draft_vocab, save_every=save_every)
    folder = out_dir.expanduser()
    pipeline = load_pipeline(chosen, out)
    raise typer.Exit(run_train_command(pipeline, out, TrainRequest(
        settings, data=data, folder=folder, texts=texts, max_tokens=max_tokens, limit=limit,
        held_out=held_out, resume=resume, overwrite=overwrite,
    )))


app.command()(export)  # the commands that load no model: their own modules
app.command()(serve)  # the server: its own module, its options checked before torch loads
app.command()(verify)
app.add_typer(profiles_app, name="profiles")
app.add_typer(cache_app, name="cache")


def main(argv: list[str] | None = None) -> int:
    """Console entry point: run the app and turn every failure into a message and an exit code."""
    restart()
    return exit_code_of(lambda: app(args=argv, standalone_mode=False, prog_name="specdec"))

