"""Draft heads against prompt lookup and plain decoding, paired, in one process.

    python benchmarks/heads_bench.py -p smollm2-demo --eagle ~/.cache/specdec/heads/smollm2-eagle \
        --medusa ~/.cache/specdec/heads/smollm2-medusa \
        --prompts spec_bench/question.jsonl --limit 2 --max-new-tokens 128 --repeats 3

Every method decodes every prompt `repeats` times after one warm-up pass, the methods interleaved
per prompt (so a slow patch of the machine hits all of them). Per prompt: the median decode tok/s
of each method; speedup = that over plain's, paired per prompt; per category and overall the
median of those ratios. Also: accepted tokens per target pass, each method's acceptance at each
draft depth, and whether every method's text equals plain's (temperature 0). A profile whose
drafter is a draft model runs it too, as "profile"; --chain adds "ngram+medusa" / "ngram+eagle"
(prompt lookup drafts where it finds a match, the head elsewhere); --merge N adds "ngram~medusa" /
"ngram~eagle" (lookup alone after a match of N or more tokens; after a shorter one its guess and
the head's candidates in one tree); --no-alone leaves out the heads on their own. --eagle and
--medusa repeat: two heads of a kind run side by side, named by their folders (eagle[NAME]).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from specdec_cli import Pipeline
from specdec_cli.bench.workload import load_prompts
from specdec_cli.decoding.events import Finished, Verified
from specdec_cli.profile import load_profile, with_overrides
from specdec_cli.specs import DrafterSpec, TreeSpec


def parse_tree(text: str | None) -> TreeSpec | None:
    from specdec_cli.profile_checks import check_tree

    return None if text in (None, "off") else check_tree(text, "--tree")


NGRAM = DrafterSpec("ngram", {"max_ngram": 3, "min_ngram": 1})


def methods(pipe: Pipeline, args) -> dict[str, object]:
    """name -> decoder; every decoder over the same loaded target."""
    decoders = {"plain": pipe.decoder(drafter=None)}
    if pipe.profile.drafter.kind not in ("ngram", "medusa", "eagle"):  # e.g. a draft model: the profile's own setup
        decoders["profile"] = pipe.decoder()
    decoders["ngram"] = pipe.decoder(drafter=pipe.make_drafter(NGRAM), k="auto", tree=None)
    heads = [("medusa", "medusa", "heads", path, args.medusa_tree) for path in args.medusa]
    heads += [("eagle", "eagle", "head", path, args.eagle_tree) for path in args.eagle]
    for name, kind, key, path, tree in heads:
        if sum(head[0] == name for head in heads) > 1:  # two heads of a kind, side by side: name them by folder
            name = f"{name}[{Path(path).name}]"
        head = DrafterSpec(kind, {key: str(Path(path).expanduser())})
        lookups = {}
        if args.chain:  # prompt lookup where it finds a match, the head elsewhere
            lookups[f"ngram+{name}"] = DrafterSpec("ngram", {**NGRAM.options, "min_ngram": args.chain_min_ngram})
        if args.merge:  # a short match's guess and the head's candidates in one tree
            lookups[f"ngram~{name}"] = DrafterSpec("ngram", {**NGRAM.options, "solo_ngram": args.merge})
        if not args.no_alone:
            decoders[name] = pipe.decoder(drafter=pipe.make_drafter(head), k=args.k, tree=parse_tree(tree))
        for label, lookup in lookups.items():
            chain = DrafterSpec("chain", {}, drafters=(lookup, head))
            decoders[label] = pipe.decoder(drafter=pipe.make_drafter(chain), k=args.k, tree=parse_tree(tree))
    return decoders


def decode(decoder, ids: list[int], max_new_tokens: int) -> dict:
    started = time.perf_counter()
    first_at = None
    depth_hits: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    finished = None
    for event in decoder.stream(ids, max_new_tokens=max_new_tokens):
        if isinstance(event, Verified):
            if first_at is None:
                first_at, first = time.perf_counter(), len(event.emitted)
            for _, depth, kept, _ in event.judged:  # (confidence, depth - 1, kept, first child) of every judged node
                depth_hits[depth][0] += int(kept)
                depth_hits[depth][1] += 1
        elif isinstance(event, Finished):
            finished = event
    ended = time.perf_counter()
    stats = finished.stats
    tokens = len(finished.token_ids) - first
    return {
        "tokens": finished.token_ids,
        "tok_s": tokens / (ended - first_at) if tokens > 0 and ended > first_at else None,
        "forwards": stats.target_forwards,
        "depth_hits": dict(depth_hits),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-p", "--profile", default="smollm2-demo")
    parser.add_argument("--eagle", action="append", default=[], help="an EAGLE head's folder; repeat to compare heads")
    parser.add_argument("--medusa", action="append", default=[], help="a Medusa heads' folder; repeat to compare heads")
    parser.add_argument("--eagle-tree", default="auto")
    parser.add_argument("--medusa-tree", default="auto")
    parser.add_argument("-k", default="auto")
    parser.add_argument("--chain", action="store_true", help="also each head behind prompt lookup (a chain drafter)")
    parser.add_argument("--chain-min-ngram", type=int, default=2, help="the chain's lookup proposes only after a match this long")
    parser.add_argument("--merge", type=int, metavar="N", help="also lookup (min_ngram 1, solo_ngram N) merged with each head")
    parser.add_argument("--no-alone", action="store_true", help="leave out the heads on their own")
    parser.add_argument("--prompts", type=Path)
    parser.add_argument("--category", action="append", default=[])
    parser.add_argument("--limit", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile", default="on")
    parser.add_argument("--dtype", help="the target's (and heads') dtype; default: the profile's")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args()

    profile = with_overrides(load_profile(args.profile), compile=args.compile, temperature=0.0, dtype=args.dtype)
    pipe = Pipeline(profile)
    decoders = methods(pipe, args)
    for decoder in decoders.values():
        decoder.warmup()
    prompts = load_prompts(args.prompts, args.category, args.limit)
    rows = []
    for number, prompt in enumerate(prompts, 1):
        ids = pipe.encode(prompt.text)
        runs = defaultdict(list)
        for repeat in range(args.repeats + 1):  # the first pass warms up and is not counted
            for name, decoder in decoders.items():
                result = decode(decoder, ids, args.max_new_tokens)
                if repeat:
                    runs[name].append(result)
        row = {"prompt": prompt.id, "category": prompt.category or "-"}
        plain_text = runs["plain"][0]["tokens"]
        for name, results in runs.items():
            speeds = [r["tok_s"] for r in results if r["tok_s"]]
            row[name] = {
                "tok_s": statistics.median(speeds) if speeds else None,
                "tokens_per_pass": len(results[0]["tokens"]) / max(1, results[0]["forwards"]),
                "identical": all(r["tokens"] == plain_text for r in results),
                "depth_hits": {d: hits for d, hits in results[0]["depth_hits"].items()},
            }
        rows.append(row)
        summary = "  ".join(f"{n} {row[n]['tok_s'] or 0:.1f}" for n in decoders)
        print(f"[{number}/{len(prompts)}] {row['category']:<14} {summary}", file=sys.stderr, flush=True)
    report(rows, list(decoders), pipe, args)
    return 0


def ratio(row: dict, name: str) -> float | None:
    a, b = row[name]["tok_s"], row["plain"]["tok_s"]
    return a / b if a and b else None


def report(rows: list[dict], names: list[str], pipe: Pipeline, args) -> None:
    import platform

    import torch

    drafted = [n for n in names if n != "plain"]
    categories = sorted({r["category"] for r in rows})
    print(f"# {args.profile}, {len(rows)} prompts, {args.max_new_tokens} new tokens, {args.repeats} repeats, "
          f"compile {pipe.compile}, dtype {pipe.target.dtype}, torch {torch.__version__}, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {platform.processor() or platform.machine()}")
    print("| category | plain tok/s | " + " | ".join(f"{n} speedup" for n in drafted) + " | best |")
    print("|---" * (3 + len(drafted)) + "|")
    wins = defaultdict(int)
    for category in categories + ["all"]:
        chosen = [r for r in rows if category in ("all", r["category"])]
        plain = statistics.median([r["plain"]["tok_s"] for r in chosen if r["plain"]["tok_s"]])
        speedups = {}
        for name in drafted:
            values = [x for x in (ratio(r, name) for r in chosen) if x]
            speedups[name] = statistics.median(values) if values else float("nan")
        best = max(speedups, key=lambda n: speedups[n])
        if category != "all":
            for name in drafted:
                if name != "ngram" and speedups[name] > speedups.get("ngram", 0):
                    wins[name] += 1
        print(f"| {category} | {plain:.1f} | " + " | ".join(f"{speedups[n]:.2f}x" for n in drafted) + f" | {best} |")
    for name in drafted:
        passes = statistics.mean(r[name]["tokens_per_pass"] for r in rows)
        hits = defaultdict(lambda: [0, 0])
        for r in rows:
            for depth, (kept, judged) in r[name]["depth_hits"].items():
                hits[int(depth)][0] += kept
                hits[int(depth)][1] += judged
        per_depth = ", ".join(f"d{d + 1} {k / j:.0%} ({j})" for d, (k, j) in sorted(hits.items()) if j)
        identical = all(r[name]["identical"] for r in rows)
        beat = f"; faster than prompt lookup in {wins[name]} of {len(categories)} categories" if name != "ngram" else ""
        print(f"{name}: tokens per target pass {passes:.2f}; acceptance by depth {per_depth}; "
              f"identical to plain: {'yes' if identical else 'NO'}{beat}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    raise SystemExit(main())
