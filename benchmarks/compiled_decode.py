"""End to end, compile off vs on: plain decoding and specdec with a draft model, same prompt.

    python benchmarks/compiled_decode.py [TARGET_FOLDER DRAFT_FOLDER] [--dtype bfloat16|float32]
                                         [--k 4] [--new 96] [--reps 3] [--prompt TEXT]

Defaults: the local Qwen2.5-Coder pair (~/.cache/specdec-bench/qwen2.5-coder-{1.5b,0.5b}-instruct).
Prints tokens/s (medians of runs taken in rotation, so that a neighbour's load hits every method
alike) of transformers' own greedy generate (hf-plain), of specdec's plain decoding and of
specdec at k, each with compile off and on (the draft model compiled too, as drafters/model.py
will once it builds its LM with make_lm), the compile time apart, and whether the compiled runs
emitted the same tokens as the uncompiled ones (in bf16 a near-tie may flip: the first differing
position is shown with the target's top-2 logit margin there).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

HOME = Path("~/.cache/specdec-bench").expanduser()
PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and tests."


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", nargs="?", default=str(HOME / "qwen2.5-coder-1.5b-instruct"))
    parser.add_argument("draft", nargs="?", default=str(HOME / "qwen2.5-coder-0.5b-instruct"))
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--new", type=int, default=96, help="new tokens per run")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--reps", type=int, default=3)
    return parser.parse_args()


def top2_margin(model, ids: list[int]) -> float:
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def main() -> None:
    args = parse_args()
    from compile_costs import cpu_line
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec_cli.decoding.engine import SpeculativeDecoder, run
    from specdec_cli.drafters.base import DraftContext
    from specdec_cli.drafters.model import ModelDrafter
    from specdec_cli.runtime.lm import make_lm

    print(cpu_line())
    dtype = getattr(torch, args.dtype)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    text = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    vocab = len(tokenizer)
    print(f"target {Path(args.target).name}, draft {Path(args.draft).name}, {args.dtype}, prompt {len(ids)} tokens, {args.new} new")

    def hf_plain() -> list[int]:
        with torch.inference_mode():
            out = target.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=args.new,
                do_sample=False, eos_token_id=None, pad_token_id=tokenizer.eos_token_id,
            )
        return out[0, len(ids):].tolist()

    def drafter(compile: str) -> ModelDrafter:
        context = DraftContext(target=target, tokenizer=tokenizer, vocab=vocab, device=torch.device("cpu"),
                               load_model=None, load_tokenizer=None, target_name="target")
        made = ModelDrafter(draft, context)
        made.lm = make_lm(draft, vocab, compile)  # the one-line wiring drafters/model.py needs
        made.reserve = made.lm.reserve
        made.warmup = lambda: made.lm.warmup([(1, 1), (2, 1)])
        return made

    # every method built (and compiled) first, then timed in rotation: a neighbour's load hits all alike
    methods = {"hf-plain": hf_plain}
    compile_seconds = {}
    for compile in ("off", "on"):
        for k in (0, args.k):
            name = f"specdec {'plain' if not k else f'k={k}'} compile {compile}"
            decoder = SpeculativeDecoder(target, drafter(compile) if k else None, vocab=vocab, eos_ids=frozenset(),
                                         k=max(k, 1), compile=compile, on_compile=lambda line: print("  " + line, flush=True))
            decoder.reserve(len(ids) + args.new)
            compile_seconds[name] = decoder.warmup()
            run(decoder, ids, max_new_tokens=4)  # untimed: first-touch effects
            methods[name] = lambda decoder=decoder: run(decoder, ids, max_new_tokens=args.new)
    times = {name: [] for name in methods}
    outputs = {}
    for _ in range(args.reps):
        for name, method in methods.items():
            started = time.perf_counter()
            outputs[name] = method()
            times[name].append(time.perf_counter() - started)
    print(f"tokens/s, median of {args.reps} runs in rotation (compile time apart)")
    for name, seconds in times.items():
        result = outputs[name]
        tau = ""
        if not isinstance(result, list) and "k=" in name:
            tau = f", tau {result.stats.mean_accepted_length:.2f}"
        print(f"  {name:<24} {args.new / statistics.median(seconds):6.2f}  (compile {compile_seconds.get(name, 0.0):.1f} s{tau})")
    tokens = {name: (r if isinstance(r, list) else list(r.token_ids)) for name, r in outputs.items()}
    for k in (0, args.k):
        label = "plain" if not k else f"k={k}"
        off, on = tokens[f"specdec {label} compile off"], tokens[f"specdec {label} compile on"]
        if off == on:
            print(f"{label}: compiled tokens identical to uncompiled ({len(on)} tokens)")
        else:
            i = next(i for i, (a, b) in enumerate(zip(off, on)) if a != b)
            print(f"{label}: first difference at token {i}; target top-2 margin there {top2_margin(target, ids + off[:i]):.3f}")
    print(f"hf-plain tokens identical to specdec plain compiled: {tokens['hf-plain'] == tokens['specdec plain compile on']}")


if __name__ == "__main__":
    main()
