"""What compiling buys and costs: v(n) = forward of n tokens / forward of 1, eager vs compiled.

    python benchmarks/compile_costs.py [MODEL_FOLDER] [--shape qwen1.5b|smollm2] [--dtype bfloat16|float32]
                                       [--autotune on|off] [--freezing on|off]
                                       [--widths 1,2,4,8,16] [--context 200] [--runs 7] [--cold]
                                       [--quantize none|int8|int4] [--group-size 128] [--quantize-head]

Without a folder, a model of that shape with random weights (same shapes, same costs): Qwen2.5-1.5B
(default) or SmolLM2-135M (the offline demo's target).
Eager is today's path (CachedLM: DynamicCache; a forward of n tokens at a context of `--context`,
then cropped back); compiled is StaticLM (static cache, its one compiled step; a 1-token forward
runs at width 2). The two are measured interleaved in one process, so a neighbour's load hits
both alike: the ratios are what count. Medians (and minima) of `--runs`. Compile time is the
first compiled call (cold: an empty inductor cache dir, `--cold`; warm: a later run with the same
dir, TORCHINDUCTOR_CACHE_DIR), wall and CPU seconds (CPU: this process and its finished children;
set TORCHINDUCTOR_COMPILE_THREADS=1 so that the C++ compiles are among them), with torch's cache
hits, misses and bypasses; the first call of every other width is shown beside it.
`--freezing off` compiles without frozen, prepacked weights: torch then caches the whole graph.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", help="a model folder (default: Qwen2.5-1.5B-shaped, random weights)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--shape", default="qwen1.5b", choices=["qwen1.5b", "smollm2"], help="without a folder")
    parser.add_argument("--autotune", default="off", choices=["on", "off"], help="inductor max-autotune GEMMs")
    parser.add_argument("--freezing", default="on", choices=["on", "off"], help="weights frozen and prepacked (CPU)")
    parser.add_argument("--widths", default="1,2,4,8,16")
    parser.add_argument("--quantize", default="none", choices=["none", "int8", "int4"],
                        help="quantize the model's Linear layers as a profile's `quantize` does")
    parser.add_argument("--group-size", type=int, default=128, help="int4's group size")
    parser.add_argument("--quantize-head", action="store_true", help="int4: the output head too (quantize_head)")
    parser.add_argument("--context", type=int, default=200, help="tokens already in the cache")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--cold", action="store_true", help="compile into a fresh, empty inductor cache dir")
    return parser.parse_args()


def cpu_line() -> str:
    from specdec_cli.models.devices import cpu_model_name

    flags = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile") if f in flags]
    return (
        f"CPU {cpu_model_name()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, "
        f"capability {torch.backends.cpu.get_cpu_capability()}, flags {' '.join(shown) or '?'}; "
        f"torch {torch.__version__}"
    )


def random_model(shape: str, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    if shape == "smollm2":
        config = LlamaConfig(
            vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
            num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
            rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        )
    else:
        config = Qwen2Config(
            vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
            num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
            rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
        )
    torch.manual_seed(0)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.02)
    return model.eval()


SHAPE_NAMES = {"qwen1.5b": "Qwen2.5-1.5B", "smollm2": "SmolLM2-135M"}


def load(folder: str | None, shape: str, dtype: torch.dtype) -> tuple[torch.nn.Module, str]:
    if folder is None:
        return random_model(shape, dtype), f"{SHAPE_NAMES[shape]}-shaped (random weights)"
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval(), Path(folder).name


def peak_rss_gib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the C++ compilers): on a shared machine
    a fairer measure of a compile's work than wall time, which the neighbours' load stretches."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    args = parse_args()
    if args.cold:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="specdec-inductor-cold-")
    from specdec_cli.cache_dirs import inductor_cache_dir
    from specdec_cli.runtime.compiled_step import CompileSettings
    from specdec_cli.runtime.lm import CachedLM
    from specdec_cli.runtime.static import StaticLM

    dtype = getattr(torch, args.dtype)
    widths = [int(w) for w in args.widths.split(",")]
    cache = inductor_cache_dir()
    # warm: kernels (and autotune choices) from an earlier run; inductor never caches the whole
    # graph here (it bypasses its FX graph cache for graphs holding mkldnn-packed weights)
    warm = Path(cache).is_dir() and any(Path(cache).iterdir())
    print(cpu_line())
    started = time.perf_counter()
    model, name = load(args.model, args.shape, dtype)
    if args.quantize != "none":
        from specdec_cli.kernels.quantize import quantization_of, quantize_model

        quantize_model(model, args.quantize, args.group_size if args.quantize == "int4" else None,
                       args.quantize == "int4" and args.quantize_head)
        name += f", quantized {quantization_of(model)}"
    print(f"model {name}, {args.dtype}, loaded in {time.perf_counter() - started:.1f} s; context {args.context}")
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (args.context,), generator=torch.Generator().manual_seed(0))

    eager = CachedLM(model, vocab)
    eager.reset()
    eager.prefill(prompt)
    static = StaticLM(model, vocab, settings=CompileSettings(autotune=args.autotune == "on", freezing=args.freezing == "on"))
    static.reserve(args.context + 64)
    static.reset()
    static.prefill(prompt)

    def step(lm, n: int):
        def go():
            lm.forward(prompt[:n], keep=n)
            lm.truncate(args.context)
        return go

    print(f"compiling (inductor cache {cache}, {'warm' if warm else 'cold'}, max-autotune {args.autotune}) ...", flush=True)
    first_call = {}
    for n in widths:
        cpu = cpu_seconds()
        first_call[n] = timed(step(static, n))
        cpu = cpu_seconds() - cpu
        if n == widths[0]:
            compile_cpu = cpu
        print(f"  first call, {n} tokens: {first_call[n]:.1f} s (CPU {cpu:.1f} s)", flush=True)

    times = {("eager", n): [] for n in widths} | {("compiled", n): [] for n in widths}
    for n in widths:  # one untimed run each, then interleaved timed runs
        step(eager, n)()
        step(static, n)()
    for _ in range(args.runs):
        for n in widths:
            times[("eager", n)].append(timed(step(eager, n)))
            times[("compiled", n)].append(timed(step(static, n)))
    median = {key: statistics.median(values) for key, values in times.items()}
    least = {key: min(values) for key, values in times.items()}

    print()
    print(f"medians of {args.runs} (minima in brackets); v(n) = cost of n tokens / cost of 1 token, same mode")
    print(f"{'n':>3} {'eager ms':>16} {'v eager':>8} {'compiled ms':>16} {'v compiled':>11} {'speedup':>8}")
    for n in widths:
        e, c = median[("eager", n)], median[("compiled", n)]
        print(
            f"{n:>3} {e * 1e3:7.1f} [{least[('eager', n)] * 1e3:6.1f}] {e / median[('eager', 1)]:8.2f} "
            f"{c * 1e3:7.1f} [{least[('compiled', n)] * 1e3:6.1f}] {c / median[('compiled', 1)]:11.2f} {e / c:7.2f}x"
        )
    from torch._dynamo.utils import counters

    hits = {f"{group}.{name}": count for group in ("inductor", "aot_autograd")
            for name, count in counters[group].items() if "cache" in name}
    print(
        f"compile ({'warm' if warm else 'cold'} inductor cache, freezing {args.freezing}): "
        f"{first_call[widths[0]]:.1f} s, CPU {compile_cpu:.1f} s (first compiled call); torch's caches {hits}; peak RSS {peak_rss_gib():.1f} GiB"
    )


if __name__ == "__main__":
    sys.exit(main())
