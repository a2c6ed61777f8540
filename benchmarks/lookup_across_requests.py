"""Prompt lookup across requests against lookup within each prompt alone, paired in one process:
templated prompts (one instruction, different names and numbers), as a batch job sends them.

    python benchmarks/lookup_across_requests.py [-p qwen-coder-local-int4] [--prompts 32] [-n 128]
        [--rounds 2] [--batch-size 1] [--write-prompts FILE]

One pipeline, two decoders over it: prompt lookup searching the run's earlier and concurrent
sequences (the pool, `pool_tokens` default) and lookup alone (`pool_tokens: 0`). A round runs every
prompt once with each, the order flipped every round (A B, B A) so that a drift of the machine's
speed falls on both; the pool is emptied before each pass, so each pass reads only its own answers.
Prints each pass's tok/s (new tokens over the pass's wall), the median ratio, and how many prompts'
texts differ (none in float32; a bf16 or quantized target's verify of another width can flip a
near-tie, as any drafter's can). --write-prompts writes the prompts as JSONL for `specdec generate --prompts`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "niaj",
         "olivia", "peggy", "rupert", "sybil", "trent", "victor", "walter", "xavier", "yolanda", "zoe", "arthur",
         "beatrice", "cedric", "delia", "edgar", "fiona", "gustav", "hilda", "igor", "jasmine"]
FIELDS = ["price", "weight", "age", "score", "height", "rating", "distance", "speed"]
TEMPLATE = ("Write a Python function `top_{field}_{name}(items)` that takes a list of dicts, each with a "
            "'{field}' key, and returns the {n} items with the largest '{field}', largest first, skipping "
            "items whose '{field}' is missing or below {floor}. Add a docstring and type hints.")


def templated_prompts(count: int) -> list[str]:
    return [TEMPLATE.format(name=NAMES[i % len(NAMES)], field=FIELDS[i % len(FIELDS)], n=2 + i % 5, floor=10 * (i % 7))
            for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-p", "--profile", default="qwen-coder-local-int4")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("-n", "--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--compile", default=None)
    parser.add_argument("--write-prompts", default=None)
    args = parser.parse_args()
    prompts = templated_prompts(args.prompts)
    if args.write_prompts:
        with open(args.write_prompts, "w") as out:
            out.writelines(json.dumps({"prompt": p}) + "\n" for p in prompts)
        return

    from specdec_cli import Pipeline
    from specdec_cli.profile import load_profile
    from specdec_cli.profile_models import with_models

    overrides = {"max_new_tokens": args.max_new_tokens, **({"compile": args.compile} if args.compile else {})}
    pipe = Pipeline.from_profile(with_models(load_profile(args.profile), drafter="ngram"), **overrides)
    pooled_spec = pipe.profile.drafter
    alone_spec = replace(pooled_spec, options={**pooled_spec.options, "pool_tokens": 0})
    specs = {"pool": pooled_spec, "alone": alone_spec}
    batch_ks: dict[str, dict] = {"pool": {}, "alone": {}}  # what k: auto learns in a batch, each its own
    encoded = [pipe.encode(p) for p in prompts]

    def one_pass(name: str) -> tuple[float, int, list[tuple[int, ...]]]:
        pipe.lookup_pool.clear()
        if args.batch_size == 1:
            decoder = pipe.decoder(drafter=pipe.make_drafter(specs[name]))
            started = time.perf_counter()
            results = [pipe.generate(ids, decoder=decoder) for ids in encoded]
        else:
            pipe.profile = replace(pipe.profile, drafter=specs[name])
            pipe._batch_k = batch_ks[name]
            started = time.perf_counter()
            results = list(pipe.generate_many(encoded, batch_size=args.batch_size))
        seconds = time.perf_counter() - started
        return seconds, sum(len(r.token_ids) for r in results), [tuple(r.token_ids) for r in results]

    one_pass("pool")  # warm-up: the kernels' first calls, the tokenizer's caches
    rates: dict[str, list[float]] = {"pool": [], "alone": []}
    texts: dict[str, list] = {}
    for round_ in range(args.rounds):
        for name in ("pool", "alone") if round_ % 2 == 0 else ("alone", "pool"):
            seconds, tokens, texts[name] = one_pass(name)
            rates[name].append(tokens / seconds)
            print(f"round {round_ + 1} {name:5s} {tokens} tokens in {seconds:.1f} s: {tokens / seconds:.2f} tok/s", flush=True)
    ratio = statistics.median(p / a for p, a in zip(rates["pool"], rates["alone"]))
    print(json.dumps({"profile": args.profile, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                      "batch_size": args.batch_size, "compile": pipe.compile,
                      "pool_tok_s": rates["pool"], "alone_tok_s": rates["alone"], "median_ratio": ratio,
                      # a quantized or bf16 target's verify of another width can flip a near-tie
                      "prompts_whose_text_differs": sum(a != b for a, b in zip(texts["pool"], texts["alone"]))}))


if __name__ == "__main__":
    main()
