"""Before/after of a change to the decoding core: `specdec bench` from two checkouts, run in turn
(A B B A per setting by default, so that a drift of the machine's speed falls on both), on the real pair.

    python benchmarks/core_ab.py OLD_CHECKOUT [--prompts question.jsonl] [--out DIR] [--only NAME] [--order BAAB]

OLD_CHECKOUT: a folder holding the other specdec_cli (e.g. `git worktree add /tmp/old HEAD~1`);
this checkout is B. Each setting is one `specdec bench` process per checkout and round (its own
load and compile; compile time is never in tok/s). Prints, per setting and method, the median
tok/s of each checkout over its rounds and B/A; batch-size settings give total tok/s per size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
COMMON = ["--category", "coding", "--limit", "3", "-n", "64", "--repeats", "2", "--warmup", "1"]
# (name, bench arguments): batch size 1 over both dtypes, compiled and eager, a model draft and lookup
SETTINGS = [
    ("int4 compiled, 0.5B draft", ["-p", "qwen-coder-local-int4", "--compile", "on", "--methods", "plain,specdec"]),
    ("int4 compiled, lookup", ["-p", "qwen-coder-local-int4", "--compile", "on", "--drafter", "ngram",
                               "--methods", "plain,specdec"]),
    ("bf16 eager, 0.5B draft", ["-p", "qwen-coder-local", "--dtype", "bfloat16", "--compile", "off",
                                "--methods", "plain,specdec"]),
    ("bf16 eager, lookup", ["-p", "qwen-coder-local", "--dtype", "bfloat16", "--compile", "off", "--drafter", "ngram",
                            "--methods", "plain,specdec"]),
    ("int4 eager, batch 2-4-8, 0.5B draft", ["-p", "qwen-coder-local-int4", "--compile", "off",
                                             "--batch-sizes", "2,4,8"]),
]


def bench(checkout: Path, arguments: list[str], prompts: str, out: Path) -> dict:
    """One `specdec bench` process with `checkout`'s package first on the path; its JSON report."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [sys.executable, "-m", "specdec_cli", "bench", *arguments, "--prompts", prompts, *COMMON, "-f", "json"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=checkout)
    out.write_text(done.stdout + "\n" + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed in {checkout}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def rates(report: dict) -> dict[str, float]:
    """method (or 'batch N method') -> tok/s from a bench report."""
    if "batch_sizes" in report:
        return {f"batch {size['batch_size']} {method}": size[method]["tokens_per_second"]
                for size in report["batch_sizes"] for method in ("plain", "specdec")}
    return {row["method"]: row["tokens_per_second"] for row in report["results"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("old", type=Path)
    parser.add_argument("--prompts", default=str(HERE.parent / "shared/data/spec_bench/question.jsonl"))
    parser.add_argument("--out", type=Path, default=Path("bench-results/core-ab"))
    parser.add_argument("--only", help="run the settings whose name contains this")
    parser.add_argument("--order", default="ABBA", help="the checkouts' turns per setting (A: OLD_CHECKOUT, B: this one)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    checkouts = {"A": args.old.resolve(), "B": HERE}
    for name, arguments in SETTINGS:
        if args.only and args.only not in name:
            continue
        found: dict[str, dict[str, list[float]]] = {"A": {}, "B": {}}
        for round_, side in enumerate(args.order):
            report = bench(checkouts[side], arguments, args.prompts, args.out / f"{name.replace(' ', '_')}-{side}{round_}.txt")
            for method, rate in rates(report).items():
                found[side].setdefault(method, []).append(rate)
        for method in found["B"]:
            a, b = statistics.median(found["A"][method]), statistics.median(found["B"][method])
            print(f"{name:38s} {method:18s} A {a:7.2f}  B {b:7.2f} tok/s  B/A {b / a:.3f}   "
                  f"(A runs {', '.join(f'{r:.2f}' for r in found['A'][method])}; "
                  f"B runs {', '.join(f'{r:.2f}' for r in found['B'][method])})", flush=True)


if __name__ == "__main__":
    main()
