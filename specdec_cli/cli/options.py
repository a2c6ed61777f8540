"""The command line's options and choices, shared by the commands that take them."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

DEFAULT_PROFILE = "smollm2-demo"  # the offline demo: runs with no network and no GPU


class Format(str, Enum):
    human = "human"
    text = "text"
    json = "json"
    jsonl = "jsonl"


class ReportFormat(str, Enum):
    human = "human"
    json = "json"
    csv = "csv"


class SummaryFormat(str, Enum):
    human = "human"
    json = "json"


# --------------------------------------------------------------------------- shared options
ProfileOpt = Annotated[
    Optional[str],
    typer.Option("--profile", "-p", help=f"profile name (see `specdec profiles`) or path to a .yaml file [default: $SPECDEC_PROFILE or {DEFAULT_PROFILE}]"),
]
TargetOpt = Annotated[Optional[str], typer.Option("--target", metavar="MODEL", help="the target model, a hub id or a local folder, in place of the profile's (without -p: with the demo profile's other settings)")]
DraftOpt = Annotated[Optional[str], typer.Option("--draft", metavar="MODEL", help="a draft model, with the target's tokenizer or another (implies --drafter model; vocab: auto); with --drafter medusa or eagle, the head folder")]
DrafterOpt = Annotated[Optional[str], typer.Option("--drafter", metavar="KIND", help="how drafts are made: model, ngram (prompt lookup), early-exit (the target's first layers), medusa, eagle, chain, or auto (each step lookup, the profile's drafter or none, whichever commits most a second)")]
KOpt = Annotated[Optional[str], typer.Option("--k", "-k", help="tokens drafted per step (1-64), or 'auto'")]
MaxNewOpt = Annotated[Optional[int], typer.Option("--max-new-tokens", "-n", help="stop after this many new tokens")]
TemperatureOpt = Annotated[Optional[float], typer.Option("--temperature", "-t", help="0 is greedy; > 0 samples")]
TopKOpt = Annotated[Optional[int], typer.Option("--top-k", help="keep the k most likely tokens (0: off)")]
TopPOpt = Annotated[Optional[float], typer.Option("--top-p", help="keep the smallest set with this mass, in (0, 1]")]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", "-s", help="seed for sampling: the same seed gives the same text for any k, tree or drafter on the same machine and dtype (float32; bf16 near-ties may differ)")]
ChatOpt = Annotated[Optional[bool], typer.Option("--chat/--no-chat", help="apply the tokenizer's chat template [default: the profile's, auto]")]
DeviceOpt = Annotated[Optional[str], typer.Option("--device", help="auto, cpu, cuda, cuda:N or mps")]
DtypeOpt = Annotated[Optional[str], typer.Option("--dtype", help="auto, float32, bfloat16, float16 or float64")]
QuantizeOpt = Annotated[Optional[str], typer.Option("--quantize", help="the target's weights: none, int8 (torchao, weight-only) or int4 (specdec's kernel on AVX512-VNNI and AVX2 CPUs, else torchao's; group size and quantize_head are the profile's) [default: the profile's, none]")]
TreeOpt = Annotated[Optional[str], typer.Option("--tree", help="token trees: auto, off (a chain of k), NODES or NODES/WIDTH/DEPTH, e.g. 16/4/6 [default: the profile's, off]")]
CompileOpt = Annotated[Optional[str], typer.Option("--compile", help="static caches and compiled steps: off, auto (on where the work expected pays back the compile; -v says why) or on [default: the profile's, auto]")]
JsonSchemaOpt = Annotated[Optional[str], typer.Option("--json-schema", metavar="FILE|JSON", help="the text is JSON that follows this schema (a file, or the schema itself)")]
AnyJsonOpt = Annotated[bool, typer.Option("--json", help="the text is a JSON object")]
RegexOpt = Annotated[Optional[str], typer.Option("--regex", metavar="RE", help="the whole text matches this regular expression (Rust syntax: \\d is any Unicode digit, [0-9] the ASCII ones)")]
GrammarOpt = Annotated[Optional[Path], typer.Option("--grammar", metavar="FILE", help="the text follows this grammar (Lark, or llama.cpp's GBNF)")]
VerboseOpt = Annotated[int, typer.Option("--verbose", "-v", count=True, help="more detail on stderr (-vv: library logs too)")]


PromptsOpt = Annotated[Optional[Path], typer.Option("--prompts", help="a text file (one prompt a line) or JSONL (.jsonl, or every line a JSON object: prompt, text, instruction, question, input or turns[0] as in Spec-Bench; category); '-': stdin [default: a built-in mix]")]
CategoryOpt = Annotated[Optional[list[str]], typer.Option("--category", metavar="NAME", help="only prompts of this category (repeatable)")]
LimitOpt = Annotated[Optional[int], typer.Option("--limit", help="at most N prompts per category (in all, when uncategorised)")]
BenchNewOpt = Annotated[Optional[int], typer.Option("--max-new-tokens", "-n", help="new tokens per run [default: 128]")]
RepeatsOpt = Annotated[int, typer.Option("--repeats", help="timed runs per prompt and method (the median counts)")]
BatchSizesOpt = Annotated[Optional[str], typer.Option("--batch-sizes", metavar="N,N,...", help="measure plain decoding and specdec at each batch size, e.g. 1,2,4,8,16 (chains of k; batch size 1 runs the usual decoder)")]
WarmupOpt = Annotated[int, typer.Option("--warmup", help="untimed warm-up runs of each method before timing (a short untimed first run of each always happens: first-call costs are never timed)")]
BenchSeedOpt = Annotated[int, typer.Option("--seed", "-s", help="seed for sampled runs (repeat r uses seed + r)")]
OutputOpt = Annotated[Optional[Path], typer.Option("--output", "-o", help="also write the report here (JSON, or CSV with --format csv), atomically")]


class HeadKind(str, Enum):
    medusa = "medusa"
    eagle = "eagle"
