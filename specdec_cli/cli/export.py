"""`specdec export`: a serving engine's command line for a profile, written from its settings (no model loads)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import UsageError
from ..serving.registry import ENGINES as SERVING_ENGINES
from .options import DrafterOpt, DraftOpt, ProfileOpt, TargetOpt, VerboseOpt
from .setup import resolved_profile, start


def export(
    to: Annotated[str, typer.Option("--to", help=f"{', '.join(SERVING_ENGINES)}, or all")],
    profile: ProfileOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    drafter: DrafterOpt = None,
    from_report: Annotated[Optional[Path], typer.Option("--from-report", help="a bench or tune-k JSON report (-f json -o FILE): the k it chose replaces k: auto")] = None,
    gpus: Annotated[Optional[int], typer.Option("--gpus", help="GPUs to split the target over (tensor parallel) [default: 1]")] = None,
    output_format: Annotated[str, typer.Option("--format", "-f", help="text (commented command lines) or json")] = "text",
    verbose: VerboseOpt = 0,
) -> None:
    """Write a serving engine's command line for a profile (vLLM, SGLang, llama.cpp, TensorRT-LLM, transformers)."""
    from ..serving.export import check_gpus, export_engines, export_warnings, parse_engine, render_json, render_text
    from ..serving.k_choice import choose_k, read_report

    out = start(verbose)
    if output_format not in ("text", "json"):
        raise UsageError(f"--format: '{output_format}' is not one of text, json")
    engines = parse_engine(to)
    chosen = resolved_profile(profile, target=target, draft=draft, drafter=drafter)
    report = read_report(from_report) if from_report is not None else None
    k_choice = choose_k(chosen, report, str(from_report))
    exports = export_engines(chosen, engines, k_choice, check_gpus(gpus))
    for warning in export_warnings(chosen, k_choice, gpus):
        logging.getLogger("specdec").warning(warning)
    if output_format == "json":
        out.json_document(render_json(exports, single=len(engines) == 1))
    else:
        out.write(render_text(exports))
