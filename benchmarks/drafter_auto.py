"""`drafter: auto` beside each of its candidates alone and plain decoding, paired in one process:
every prompt runs with each method in turn (the order rotating from prompt to prompt, so that a
drift of the machine's speed falls on all), the lookup pool emptied before each generation.

    python benchmarks/drafter_auto.py [-p qwen-coder-local-int4] [--limit 1] [-n 128] [--rounds 1]
        [--compile off] [--questions ../shared/data/spec_bench/question.jsonl] [--out FILE]

Spec-Bench's first `--limit` prompts of each of its 13 categories. Each method keeps one decoder
for the whole run (what `k: auto` and auto learn carries from prompt to prompt, as in bench). Prints
per category each method's tok/s (new tokens over generation wall, prefill included) and auto
against the best single drafter; --out writes every generation's figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
METHODS = ("plain", "lookup", "model", "auto")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-p", "--profile", default="qwen-coder-local-int4")
    parser.add_argument("--limit", type=int, default=1)
    parser.add_argument("-n", "--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--compile", default=None)
    parser.add_argument("--questions", default=str(HERE.parent / "shared/data/spec_bench/question.jsonl"))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from specdec_cli import Pipeline
    from specdec_cli.profile import load_profile
    from specdec_cli.profile_models import with_models

    questions = [json.loads(line) for line in open(args.questions)]
    taken: dict[str, int] = defaultdict(int)
    prompts = []
    for q in questions:
        if taken[q["category"]] < args.limit:
            taken[q["category"]] += 1
            prompts.append((q["category"], q["turns"][0]))
    overrides = {"max_new_tokens": args.max_new_tokens, **({"compile": args.compile} if args.compile else {})}
    pipe = Pipeline.from_profile(with_models(load_profile(args.profile), drafter="auto"), **overrides)
    auto_spec = pipe.profile.drafter
    lookup_spec, model_spec = auto_spec.drafters[0], auto_spec.drafters[1]
    decoders = {
        "plain": pipe.decoder(drafter=None),
        "lookup": pipe.decoder(drafter=pipe.make_drafter(lookup_spec)),
        "model": pipe.decoder(drafter=pipe.make_drafter(model_spec)),
        "auto": pipe.decoder(drafter=pipe.make_drafter(auto_spec)),
    }
    for decoder in decoders.values():
        decoder.warmup()
    encoded = [(category, pipe.encode(text)) for category, text in prompts]
    runs = []
    turn = 0
    for round_ in range(args.rounds):
        for category, ids in encoded:
            order = METHODS[turn % 4:] + METHODS[: turn % 4]
            turn += 1
            for method in order:
                pipe.lookup_pool.clear()
                started = time.perf_counter()
                result = pipe.generate(ids, decoder=decoders[method])
                seconds = time.perf_counter() - started
                stats = result.stats
                runs.append({"round": round_, "category": category, "method": method, "tokens": len(result.token_ids),
                             "seconds": seconds, "tau": stats.mean_accepted_length, "plain_steps": stats.plain_steps,
                             "per_drafter": {k: {"calls": v["calls"], "accepted": v["accepted"]}
                                             for k, v in stats.per_drafter.items()}})
            print(category, " ".join(f"{r['method']} {r['tokens'] / r['seconds']:.1f}" for r in runs[-4:]), flush=True)
    if args.out:
        report = {"profile": args.profile, "compile": pipe.compile, "runs": runs}
        Path(args.out).write_text(json.dumps(report, indent=1))

    def rate(method: str, category: str | None) -> float:
        chosen = [r for r in runs if r["method"] == method and (category is None or r["category"] == category)]
        return sum(r["tokens"] for r in chosen) / sum(r["seconds"] for r in chosen)

    print(f"\n{args.profile}, compile {pipe.compile}, {args.max_new_tokens} new tokens, {args.rounds} round(s)")
    print("| category | plain | lookup | draft model | auto | auto / best single |")
    print("|---|---|---|---|---|---|")
    near = 0
    categories = list(dict.fromkeys(c for c, _ in prompts))
    for category in [*categories, None]:
        plain, lookup, model, auto = (rate(m, category) for m in METHODS)
        ratio = auto / max(lookup, model)
        near += category is not None and ratio >= 0.95
        print(f"| {category or 'all'} | {plain:.1f} | {lookup:.1f} | {model:.1f} | {auto:.1f} | {ratio:.2f} |")
    print(f"\nauto at least 0.95x the best single drafter in {near} of {len(categories)} categories")


if __name__ == "__main__":
    main()
