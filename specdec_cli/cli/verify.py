"""`specdec verify`: specdec's text against plain decoding's and transformers', and its samples
against the target's distribution, on this pair and machine."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..bench.workload import load_prompts
from ..constraints.grammars import from_options
from ..errors import EXIT_FAILURE
from .options import (
    AnyJsonOpt,
    BenchSeedOpt,
    CompileOpt,
    DeviceOpt,
    DrafterOpt,
    DraftOpt,
    DtypeOpt,
    GrammarOpt,
    JsonSchemaOpt,
    KOpt,
    LimitOpt,
    ProfileOpt,
    PromptsOpt,
    QuantizeOpt,
    RegexOpt,
    SummaryFormat,
    TargetOpt,
    TopKOpt,
    TopPOpt,
    TreeOpt,
    VerboseOpt,
)
from .setup import load_pipeline, resolved_profile, start


def verify(
    profile: ProfileOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    drafter: DrafterOpt = None,
    prompts: PromptsOpt = None,
    limit: LimitOpt = 3,
    samples: Annotated[int, typer.Option("--samples", min=0, metavar="N", help="samples per method for the distribution check (0: skip it)")] = 100,
    distribution_prompts: Annotated[int, typer.Option("--distribution-prompts", min=1, metavar="N", help="prompts used for the distribution check")] = 1,
    temperature: Annotated[Optional[float], typer.Option("--temperature", "-t", help="for the distribution check [default: the profile's, or 1.0 if it is greedy]")] = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    k: KOpt = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1, metavar="N", help="tokens compared per prompt in the greedy check")] = 32,
    seed: BenchSeedOpt = 0,
    output_format: Annotated[SummaryFormat, typer.Option("--format", "-f", help="human or json")] = SummaryFormat.human,
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
    """Check that specdec gives the target's own output on this pair and machine. Exit 0: all passed."""
    out = start(verbose)
    chosen = resolved_profile(profile, target=target, draft=draft, drafter=drafter, k=k, temperature=temperature,
                              top_k=top_k, top_p=top_p, device=device, dtype=dtype, quantize=quantize,
                              compile=compile_mode, tree=tree,
                              constraint=from_options(json_schema=json_schema, any_json=any_json, regex=regex, grammar=grammar))
    given_prompts = load_prompts(prompts, (), limit) if prompts else None
    from ..bench.selfcheck import DEFAULT_PROMPTS, SelfCheck, selfcheck_workload
    from .bench import progress_bar
    from .tables import verify_report

    chosen_prompts = given_prompts if given_prompts is not None else list(DEFAULT_PROMPTS)[:limit]
    pipeline = load_pipeline(chosen, out, selfcheck_workload(len(chosen_prompts), samples, max_new_tokens,
                                                             distribution_prompts))
    check = SelfCheck(pipeline, chosen_prompts, samples=samples, max_new_tokens=max_new_tokens,
                      distribution_prompts=distribution_prompts, seed=seed,
                      sampling=chosen.sampling if temperature is not None else None)
    with progress_bar(out, check.steps) as advance:
        report = check.run(advance)
    if output_format == SummaryFormat.json:
        out.json_document(report)
    else:
        out.data.print(verify_report(report))
    raise typer.Exit(0 if report["passed"] else EXIT_FAILURE)

