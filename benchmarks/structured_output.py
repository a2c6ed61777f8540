"""Structured output on a real pair: the fifty schema-constrained prompts of structured_prompts.py,
each decoded four ways in one process (plain and the profile's drafter, with and without its
schema; greedy), after an untimed warm-up of each decoder.

Reports: how many constrained texts parse and validate against their schema (jsonschema), whether
the drafted text equals plain decoding's under the schema (it must), tokens/s of each way (all
tokens over all decode seconds) and the speedup of the drafter over plain with and without the
schema, the tokens the schema forced (drafted free) and the drafts it cut, and the share of each
constrained step its matcher took.

    pip install 'jsonschema>=4,<5'   # the validator, for this script only
    python benchmarks/structured_output.py -p qwen-coder-local-int4 -n 160 [--limit 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jsonschema

sys.path.insert(0, str(Path(__file__).parent))
from structured_prompts import rows  # noqa: E402

from specdec_cli import Pipeline  # noqa: E402
from specdec_cli.specs import ConstraintSpec  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", "--profile", default="qwen-coder-local-int4")
    parser.add_argument("-n", "--max-new-tokens", type=int, default=160)
    parser.add_argument("--limit", type=int, default=None, help="the first N prompts")
    parser.add_argument("--drafter", default=None, help="e.g. ngram: a drafter in place of the profile's")
    parser.add_argument("--compile", default="on", help="off, auto or on (default on: a long run)")
    parser.add_argument("--valid-only", action="store_true",
                        help="only the drafted run with each schema: validity, no speed comparison")
    parser.add_argument("--json", type=Path, default=None, help="also write every run's figures here")
    args = parser.parse_args()
    pipe = Pipeline.from_profile(args.profile, compile=args.compile)
    if args.drafter:
        from specdec_cli.profile_models import with_models

        pipe = Pipeline(with_models(pipe.profile, drafter=args.drafter))
    prompts = rows()[: args.limit]
    decoders = {"plain": pipe.decoder(drafter=None), "specdec": pipe.decoder()}
    for decoder in decoders.values():  # compiles and first calls, untimed
        decoder.warmup()
        pipe.generate(prompts[0]["prompt"], decoder=decoder, max_new_tokens=8, seed=0, constraint=None)
        pipe.generate(prompts[0]["prompt"], decoder=decoder, max_new_tokens=8, seed=0,
                      constraint=ConstraintSpec("json_schema", json.dumps(prompts[0]["json_schema"])))
    runs = []
    started = time.perf_counter()
    for row in prompts:
        spec = ConstraintSpec("json_schema", json.dumps(row["json_schema"]))
        results = {}
        ways = (("schema", spec),) if args.valid_only else (("schema", spec), ("free", None))
        for way, constraint in ways:
            for name, decoder in decoders.items():
                if args.valid_only and name == "plain":
                    continue
                result = pipe.generate(row["prompt"], decoder=decoder, max_new_tokens=args.max_new_tokens, seed=0,
                                       constraint=constraint)
                results[(way, name)] = result
        constrained = results[("schema", "specdec")]
        valid, problem = True, None
        try:
            jsonschema.validate(json.loads(constrained.text), row["json_schema"])
        except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
            valid, problem = False, str(exc).splitlines()[0]
        summary = constrained.stats.constraint_summary()
        runs.append({
            "id": row["id"], "valid": valid, "problem": problem, "finish": constrained.finish_reason,
            "same_as_plain": args.valid_only or constrained.token_ids == results[("schema", "plain")].token_ids,
            "free_same_as_plain": args.valid_only or results[("free", "specdec")].token_ids == results[("free", "plain")].token_ids,
            **{f"{way}_{name}_tokens": r.stats.new_tokens for (way, name), r in results.items()},
            **{f"{way}_{name}_seconds": r.stats.decode_seconds for (way, name), r in results.items()},
            "forced_kept": summary["forced_kept"], "cut_drafts": summary["cut_drafts"],
            "mask_seconds": summary["mask_seconds"], "tau": constrained.stats.mean_accepted_length,
            "free_tau": None if args.valid_only else results[("free", "specdec")].stats.mean_accepted_length,
        })
        print(f"{row['id']:>5} valid={valid} same={runs[-1]['same_as_plain']}/{runs[-1]['free_same_as_plain']} "
              f"finish={constrained.finish_reason} "
              f"tau={runs[-1]['tau']:.2f} free_tau={runs[-1]['free_tau']}", file=sys.stderr, flush=True)
    report(runs, pipe, args, time.perf_counter() - started)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


def rate(runs: list[dict], key: str) -> float:
    return sum(r[f"{key}_tokens"] for r in runs) / sum(r[f"{key}_seconds"] for r in runs)


def report(runs: list[dict], pipe: Pipeline, args, seconds: float) -> None:
    print(f"profile {pipe.profile.name}, drafter {pipe.profile.drafter.describe()}, compile {pipe.compile}, "
          f"{len(runs)} prompts, -n {args.max_new_tokens}, greedy ({seconds:.0f} s)")
    print(f"valid JSON for its schema: {sum(r['valid'] for r in runs)} of {len(runs)}; "
          f"finished (eos): {sum(r['finish'] == 'eos' for r in runs)}; "
          f"drafted text = plain's under the schema: {sum(r['same_as_plain'] for r in runs)} of {len(runs)}, "
          f"without it: {sum(r['free_same_as_plain'] for r in runs)}")
    for problem in [r for r in runs if not r["valid"]][:5]:
        print(f"  {problem['id']}: {problem['finish']}: {problem['problem']}")
    if args.valid_only:
        print(f"tau with the schema: {statistics.mean(r['tau'] for r in runs):.2f}")
        return
    print("| | plain tok/s | specdec tok/s | speedup | median per-prompt speedup | tau |")
    print("|---|---|---|---|---|---|")
    for way in ("schema", "free"):
        plain, spec = rate(runs, f"{way}_plain"), rate(runs, f"{way}_specdec")
        per_prompt = statistics.median(
            (r[f"{way}_specdec_tokens"] / r[f"{way}_specdec_seconds"]) / (r[f"{way}_plain_tokens"] / r[f"{way}_plain_seconds"])
            for r in runs)
        tau = statistics.mean(r["tau" if way == "schema" else "free_tau"] for r in runs)
        print(f"| {'with the schema' if way == 'schema' else 'without'} | {plain:.1f} | {spec:.1f} | "
              f"{spec / plain:.2f}x | {per_prompt:.2f}x | {tau:.2f} |")
    tokens = sum(r["schema_specdec_tokens"] for r in runs)
    mask = sum(r["mask_seconds"] for r in runs) / sum(r["schema_specdec_seconds"] for r in runs)
    print(f"forced tokens kept: {sum(r['forced_kept'] for r in runs)} of {tokens} "
          f"({sum(r['forced_kept'] for r in runs) / tokens:.0%}); drafts cut by the schema: "
          f"{sum(r['cut_drafts'] for r in runs)}; matcher time: {mask:.1%} of the constrained specdec decode time")


if __name__ == "__main__":
    raise SystemExit(main())
