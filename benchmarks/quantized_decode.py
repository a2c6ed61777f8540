"""Plain decoding of a profile's target unquantized, int8, int4 and int4 with its head, compiled.

    python benchmarks/quantized_decode.py [-p PROFILE] [--methods none,int8,int4,int4+head]
                                          [--group-size 128] [--new 64] [--reps 5] [--prompt TEXT]
                                          [--compile on|off]

int4 runs specdec's kernel where the CPU has AVX512-VNNI or AVX2 (SPECDEC_CPU_KERNELS=avx2 takes its
AVX2 build on an AVX512 CPU); SPECDEC_INT4_KERNEL=torchao runs torchao's instead (run the script
twice to set them side by side).

Default profile: qwen-coder-local (the local Qwen2.5-Coder pair; only its target is used). Prints the
CPU (model, flags, torch's capability: which int4 kernel runs) and the memory's speed beside the
figures (a `sum` over 2 GB of bf16: a 1-token step streams every weight once, so tokens/s follow
bytes per token / this speed), then per method: tokens/s of specdec's compiled plain decoding
(median of --reps runs taken in rotation, so a neighbour's load hits every method alike), the
compile time apart, the weights' size, and how many of its greedy tokens equal the unquantized
target's (the first difference's position: quantization changes the target, speculation does not).

Every method's model stays loaded until the end (the rotation needs them all). Where dtype auto is
float32 (a CPU without native bf16), `none` is the 1.5B target in float32: 7.1 GB, about twice that
once compiled, and with `int4` beside it the process outgrew a 24 GB AVX2 machine and was killed.
There, measure `--methods none` in a run of its own.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # compile_costs.cpu_line

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and tests."


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-p", "--profile", default="qwen-coder-local")
    parser.add_argument("--methods", default="none,int8,int4,int4+head",
                        help="none, int8, int4, int4+head (quantize_head: true)")
    parser.add_argument("--group-size", type=int, default=128, help="int4's group size (32, 64 or 128)")
    parser.add_argument("--new", type=int, default=64, help="new tokens per run")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--compile", default="on", choices=["on", "off"], help="the compiled loop (on) or eager")
    return parser.parse_args()


def memory_speed(gigabytes: float = 2.0, reps: int = 3) -> float:
    """GB/s of a `sum` over `gigabytes` of bf16 (median of `reps`)."""
    data = torch.ones(int(gigabytes * 1e9 / 2), dtype=torch.bfloat16)
    data.sum()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - started)
    return gigabytes / statistics.median(times)


def same_tokens(reference: tuple[int, ...], tokens: tuple[int, ...]) -> str:
    equal = sum(a == b for a, b in zip(reference, tokens))
    first = next((i for i, (a, b) in enumerate(zip(reference, tokens)) if a != b), None)
    where = "identical" if first is None and len(reference) == len(tokens) else f"first difference at token {first}"
    return f"{equal}/{len(reference)} tokens equal to unquantized ({where})"


def main() -> None:
    args = parse_args()
    from compile_costs import cpu_line

    from specdec_cli import Pipeline
    from specdec_cli.cli.output import configure_logging
    from specdec_cli.kernels.quantize import stored_bytes
    from specdec_cli.profile import load_profile, with_overrides
    from specdec_cli.specs import DrafterSpec

    configure_logging(0)  # specdec's warnings only: torchao's import-time noise off, as in the CLI
    print(cpu_line())
    print(f"memory: a sum over 2 GB of bf16 at {memory_speed():.1f} GB/s")
    base = load_profile(args.profile)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    pipes, decoders, compile_seconds = {}, {}, {}
    for method in methods:
        quantize, _, head = method.partition("+")  # int4+head: the output head in int4 too
        profile = with_overrides(base, quantize=quantize, compile=args.compile)
        if quantize == "int4":
            profile = replace(profile, target=replace(profile.target, group_size=args.group_size,
                                                      quantize_head=head == "head"))
        # plain decoding only: a drafter that loads nothing
        profile = replace(profile, drafter=DrafterSpec(kind="ngram", options={"max_ngram": 3, "min_ngram": 1}))
        started = time.perf_counter()
        pipe = Pipeline(profile)
        load_s = time.perf_counter() - started
        pipe.eos_ids = frozenset()  # every run decodes exactly --new tokens
        decoder = pipe.decoder(drafter=None)
        ids = pipe.encode(args.prompt)
        started = time.perf_counter()
        pipe.generate(ids, decoder=decoder, max_new_tokens=4)  # compiles; untimed
        compile_seconds[method] = time.perf_counter() - started
        pipes[method], decoders[method] = pipe, decoder
        print(f"{method}: loaded in {load_s:.1f} s (quantizing included), {pipe.target.dtype}, "
              f"weights {stored_bytes(pipe.target) / 1e9:.3f} GB; compiled in {compile_seconds[method]:.0f} s", flush=True)
    times = {m: [] for m in methods}
    tokens = {}
    for _ in range(args.reps):
        for method in methods:
            pipe = pipes[method]
            started = time.perf_counter()
            result = pipe.generate(pipe.encode(args.prompt), decoder=decoders[method], max_new_tokens=args.new)
            times[method].append(time.perf_counter() - started)
            tokens[method] = result.token_ids
    print(f"{'compiled' if args.compile == 'on' else 'eager'} plain decoding, {args.new} new tokens, tokens/s (median of {args.reps} runs in rotation):")
    reference = tokens.get("none")
    for method in methods:
        line = f"  {method:<5} {args.new / statistics.median(times[method]):7.2f}"
        if reference is not None and method != "none":
            line += "   " + same_tokens(reference, tokens[method])
        print(line)


if __name__ == "__main__":
    main()
