"""Batched decoding, plain and speculative, at several batch sizes: where does drafting stop paying?

    python benchmarks/batched_decode.py [--profile qwen-coder-local] [--batch-sizes 1,2,4,8]
                                        [--prompts FILE] [--count 16] [--new 128] [--k 4]

For each batch size, the same prompts (a prompt file, or bench's built-in mix repeated up to
--count) run through BatchedDecoder with no drafter (plain) and with the profile's drafter at k:
total tokens/s (every row's new tokens over the run's wall time, prefills included), per-row
decode speed (the mean of each row's tokens over the steps it was in), the acceptance rate
(accepted / drafted) and tau (tokens per target forward), and at temperature 0 how many rows'
ids differ between plain and specdec (in float32 none may; in bf16 a near-tie can flip).
Each configuration runs once after one short warm-up run; the CPU's model and flags come first.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="qwen-coder-local")
    parser.add_argument("--batch-sizes", default="1,2,4,8")
    parser.add_argument("--prompts", type=Path, default=None, help="a prompt file as bench reads it")
    parser.add_argument("--count", type=int, default=16, help="prompts per run")
    parser.add_argument("--new", type=int, default=128, help="max new tokens per prompt")
    parser.add_argument("--k", type=int, default=4)
    return parser.parse_args()


def run_once(pipe, prompts: list[list[int]], batch_size: int, k: int, new: int, speculative: bool) -> dict:
    """One pass over every prompt; totals and per-row figures."""
    from specdec_cli.decoding.batched import BatchedDecoder, Request

    make = (lambda: pipe.make_drafter(pipe.profile.drafter)) if speculative else None
    decoder = BatchedDecoder(pipe.target, make, vocab=pipe.vocab, eos_ids=pipe.eos_ids, k=k,
                             batch_size=batch_size, context_length=pipe.context_length)
    started = time.perf_counter()
    finished = dict(decoder.run(Request(i, ids, new) for i, ids in enumerate(prompts)))
    seconds = time.perf_counter() - started
    stats = [finished[i].stats for i in range(len(prompts))]
    drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
    return {
        "ids": [finished[i].token_ids for i in range(len(prompts))],
        "tokens_per_s": sum(s.new_tokens for s in stats) / seconds,
        "row_tokens_per_s": statistics.mean(s.tokens_per_second or 0.0 for s in stats),
        "acceptance": accepted / drafted if drafted else None,
        "tau": sum(s.new_tokens for s in stats) / sum(s.target_forwards for s in stats),
    }


def main() -> None:
    args = parse_args()
    from compile_costs import cpu_line

    from specdec_cli import Pipeline
    from specdec_cli.bench.workload import load_prompts

    print(cpu_line())
    pipe = Pipeline.from_profile(args.profile, compile="off")
    texts = [p.text for p in load_prompts(args.prompts)]
    prompts = [pipe.encode(texts[i % len(texts)]) for i in range(args.count)]
    dtype = next(pipe.target.parameters()).dtype
    print(f"profile {args.profile}, {dtype}, {len(prompts)} prompts, {args.new} new tokens each, k {args.k}")
    run_once(pipe, prompts[:2], 2, args.k, 8, speculative=True)  # warm-up: allocator, kernels, drafter load

    print(f"{'batch':>5} {'plain tok/s':>11} {'spec tok/s':>10} {'speedup':>7} {'plain row':>9} {'spec row':>8} "
          f"{'accept':>6} {'tau':>5} {'differ':>6}")
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        plain = run_once(pipe, prompts, batch_size, 0, args.new, speculative=False)
        spec = run_once(pipe, prompts, batch_size, args.k, args.new, speculative=True)
        differ = sum(a != b for a, b in zip(plain["ids"], spec["ids"]))
        acceptance = f"{spec['acceptance']:.2f}" if spec["acceptance"] is not None else "-"
        print(f"{batch_size:>5} {plain['tokens_per_s']:>11.1f} {spec['tokens_per_s']:>10.1f} "
              f"{spec['tokens_per_s'] / plain['tokens_per_s']:>6.2f}x {plain['row_tokens_per_s']:>9.1f} "
              f"{spec['row_tokens_per_s']:>8.1f} {acceptance:>6} {spec['tau']:>5.2f} {differ:>6}")
    print(f"threads {torch.get_num_threads()}; acceptance = accepted / drafted; tau = tokens per target forward")


if __name__ == "__main__":
    main()
