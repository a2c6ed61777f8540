"""Per-step costs of the decode loop, compile off and on: target and draft forwards, the verify,
and the engine's own overhead. Models from configs with random weights: nothing is downloaded.

    python benchmarks/gpu_step_costs.py [--device cuda] [--tiny] [--k 4] [--runs 7]
                                        [--context 256] [--new 48] [--compile off,on]

Pairs (target / draft):
- `8B/1B`: Llama-3.1-8B-shaped / Llama-3.2-1B-shaped, bfloat16 (about 19 GB of weights; a GPU);
- `8B/1B int4`: the same, both quantized as `quantize: int4` does it (group 128; on CUDA torchao's
  int4 weight-only kernel);
- `tiny`: the test suite's 4-layer Llama and its noisy copy (tests/tiny_models.py), float32, and
  `tiny int8`: both quantized as `quantize: int8` does it (torchao's int8 weight-only).
`--tiny` runs the tiny pairs only (a quick check on a CPU: `--tiny --device cpu`). Rows come out
as they are measured: the tiny pairs off and on (on CUDA a quick check that compiling and CUDA
graphs work, quantized too), then the 8B/1B pairs off and on. A row that fails prints FAILED with
the error (the traceback on stderr) and the next row runs.

Each pair runs with the project's own SpeculativeDecoder (a ModelDrafter drafting k tokens a
step, greedy), built as generate builds it (make_lm: compile off = DynamicCache, eager; on =
static cache and compiled steps, CUDA graphs on CUDA); compiling happens in the decoder's warmup,
timed apart. Costs, each the median of `--runs` (every read of the clock follows a device sync,
devices.device_clock), at a context of `--context` tokens:
- target 1: one target forward of 1 token (a plain decoding step);
- draft 1: one draft forward of 1 token;
- verify: one target forward of k+1 tokens (what a speculative step verifies);
- step: a whole speculative step at k (draft k, verify, accept, roll back), from the time between
  the engine's consecutive Verified events over `--new` new tokens, steps that drafted k only;
- overhead = step - (k * draft 1 + verify): the engine's own cost, shown also as a share of a
  target step (aim on a GPU: <= 5%);
- compiled: whether the target's and the draft's steps really ran compiled (a failed compile falls
  back to eager and says so here), and on CUDA how many graphs inductor declined to record as CUDA
  graphs ("cudagraph skips", which then run as plain kernels);
- same tokens: whether the greedy tokens of the first timed generation equal compile off's (the
  tiny pair is float32; the 8B/1B pair's random bf16 weights are full of near-ties, so a "no"
  there is expected and says nothing).
Compiled on CUDA, a forward of n tokens runs at the next CUDA bucket's width (compiled.CUDA_BUCKETS:
a verify of 5 tokens runs 8 wide, a 1-token forward 2 wide); the costs are those of what the engine runs.
Random weights make draft and target disagree (each step emits about one token); the forwards a
step makes are the same whatever is accepted, so the costs are those of a real pair.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's specdec_cli, even where another is installed
sys.path.insert(1, str(ROOT / "tests"))  # tiny_models: the test suite's models

from specdec_cli.models.devices import device_clock, device_description, resolve_device  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the tiny test pair only (fast; for a CPU check)")
    parser.add_argument("--k", type=int, default=4, help="tokens drafted per step")
    parser.add_argument("--runs", type=int, default=7, help="timed runs per forward cost (medians)")
    parser.add_argument("--context", type=int, default=256, help="tokens in the cache when a forward is timed")
    parser.add_argument("--new", type=int, default=48, help="new tokens per generation when timing steps")
    parser.add_argument("--compile", default="off,on", help="compile modes to run, comma-separated")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- models


def llama_3_1_8b_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001,
    )


def llama_3_2_1b_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=8192,
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001,
    )


def random_model(config, dtype: torch.dtype, device: torch.device, seed: int) -> torch.nn.Module:
    """The model's shapes, random weights (transformers' own init, N(0, 0.02)), made on the device."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


class TinyVocab:
    """What tiny_models.llama_config reads of a tokenizer: the suite's 320-token vocabulary."""

    bos_token_id, eos_token_id, pad_token_id = 0, 1, 2

    def __len__(self) -> int:
        return 320


def tiny_pair(device: torch.device) -> tuple[torch.nn.Module, torch.nn.Module]:
    from tiny_models import build_model, llama_config, noisy_copy

    target = build_model(llama_config(TinyVocab(), layers=4), seed=0)
    return target.to(device), noisy_copy(target, 0.01, seed=1).to(device)


def real_pair(device: torch.device) -> tuple[torch.nn.Module, torch.nn.Module]:
    dtype = torch.bfloat16
    return random_model(llama_3_1_8b_config(), dtype, device, 0), random_model(llama_3_2_1b_config(), dtype, device, 1)


def quantized(build, method: str):
    """`build`'s pair with both models quantized as a profile's `quantize: <method>` does it (int4:
    the profile's default group size)."""
    from specdec_cli.kernels.quantize import quantize_model
    from specdec_cli.profile import group_size_for

    def build_quantized(device: torch.device) -> tuple[torch.nn.Module, torch.nn.Module]:
        target, draft = build(device)
        group_size = group_size_for(method, None)
        return quantize_model(target, method, group_size), quantize_model(draft, method, group_size)

    return build_quantized


# --------------------------------------------------------------------------- measuring


def decoder_for(target, draft, vocab: int, k: int, compile: str):
    """SpeculativeDecoder with a ModelDrafter, built the way Pipeline builds them."""
    from specdec_cli.decoding.engine import SpeculativeDecoder
    from specdec_cli.drafters.base import DraftContext
    from specdec_cli.drafters.model import ModelDrafter

    device = target.get_input_embeddings().weight.device
    context = DraftContext(target=target, tokenizer=None, vocab=vocab, device=device, load_model=None,
                           load_tokenizer=None, target_name="target", compile=compile)
    drafter = ModelDrafter(draft, context)
    return SpeculativeDecoder(target, drafter, vocab=vocab, eos_ids=frozenset(), k=k, compile=compile,
                              on_compile=lambda line: print(f"  {line}", file=sys.stderr, flush=True))


def forward_ms(lm, context: torch.Tensor, n: int, runs: int, device: torch.device) -> float:
    """Median ms of one forward of n tokens after `context`, rolled back after each."""
    lm.reset()
    lm.prefill(context)
    length = lm.length
    ids = context[:n]
    times = []
    for i in range(runs + 2):  # two untimed: first-touch effects
        started = device_clock(device)
        lm.forward(ids, keep=n)
        ended = device_clock(device)
        lm.truncate(length)
        if i >= 2:
            times.append(ended - started)
    return 1e3 * statistics.median(times)


def step_ms(decoder, prompt: torch.Tensor, new: int, k: int, runs: int, device: torch.device) -> tuple[float, int, list[int]]:
    """Median ms of a whole speculative step that drafted k tokens, how many steps were timed, and
    the tokens of the first timed generation."""
    from specdec_cli.decoding.events import Verified

    steps, tokens = [], []
    for run in range(runs):
        last = None
        for event in decoder.stream(prompt, max_new_tokens=new):
            if not isinstance(event, Verified):
                continue
            now = device_clock(device)
            drafted = getattr(event, "nodes", 0) or len(event.drafted)
            if last is not None and drafted == k and run > 0:  # run 0: untimed
                steps.append(now - last)
            if run == 1:
                tokens += event.emitted
            last = now
    return 1e3 * statistics.median(steps), len(steps), tokens


def compiled_state(decoder) -> str:
    """Whether the target's and the draft's steps run compiled (None: an LM that never compiles)."""
    def state(lm) -> str:
        settings = getattr(lm, "settings", None)
        return "yes" if settings is not None and settings.enabled else "no"

    return f"target {state(decoder.lm)}, draft {state(decoder.drafter.lm)}"


def measure(name: str, target, draft, args, device: torch.device, compile: str) -> dict:
    from torch._dynamo.utils import counters  # inductor counts the graphs it declined to record

    vocab = target.config.vocab_size
    k = args.k
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(3, vocab, (args.context,), generator=generator).to(device)
    skips_before = counters["inductor"]["cudagraph_skips"]
    decoder = decoder_for(target, draft, vocab, k, compile)
    decoder.reserve(args.context + args.new + k + 1)
    decoder.warmup()  # compiles (compile on); a no-op with compile off
    target_1 = forward_ms(decoder.lm, context, 1, args.runs, device)
    draft_1 = forward_ms(decoder.drafter.lm, context, 1, args.runs, device)
    verify = forward_ms(decoder.lm, context, k + 1, args.runs, device)
    step, steps, tokens = step_ms(decoder, context, args.new, k, max(2, args.runs // 2), device)
    overhead = step - (k * draft_1 + verify)
    skips = counters["inductor"]["cudagraph_skips"] - skips_before
    compiled = compiled_state(decoder) + (f", {skips} cudagraph skips" if device.type == "cuda" and compile == "on" else "")
    return {
        "pair": name, "compile": compile, "target_1": target_1, "draft_1": draft_1, "verify": verify,
        "step": step, "steps": steps, "overhead": overhead, "compile_seconds": decoder.compile_seconds,
        "compiled": compiled, "tokens": tokens,
    }


# --------------------------------------------------------------------------- report


def header(k: int) -> str:
    columns = ["pair", "compile", "target 1 tok ms", "draft 1 tok ms", f"verify {k + 1} tok ms", f"step k={k} ms",
               "overhead ms", "overhead / target step", "draft / target", "verify / target", "compile s",
               "compiled", "same tokens as off"]
    return "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns)


def row(r: dict, reference: list[int] | None) -> str:
    same = "-" if reference is None else ("yes" if r["tokens"] == reference else "no")
    cells = [
        r["pair"], r["compile"], f"{r['target_1']:.2f}", f"{r['draft_1']:.2f}", f"{r['verify']:.2f}",
        f"{r['step']:.2f} ({r['steps']} steps)", f"{r['overhead']:.2f}", f"{r['overhead'] / r['target_1']:.1%}",
        f"{r['draft_1'] / r['target_1']:.2f}", f"{r['verify'] / r['target_1']:.2f}", f"{r['compile_seconds']:.1f}",
        r["compiled"], same,
    ]
    return "| " + " | ".join(cells) + " |"


def failed_row(name: str, compile: str, error: Exception) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"| {name} | {compile} | FAILED: {type(error).__name__}: {first[:200]} |"


def main(argv=None) -> int:
    args = parse_args(argv)
    device = resolve_device(args.device)
    modes = [m.strip() for m in args.compile.split(",") if m.strip()]
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 as the tests run it
    print(f"{device_description(device)} · torch {torch.__version__} · k={args.k} · context {args.context} · "
          f"medians of {args.runs} forwards; steps over {args.new} new tokens")
    pairs = {"tiny": tiny_pair, "tiny int8": quantized(tiny_pair, "int8")}
    if not args.tiny:
        pairs |= {"8B/1B bf16": real_pair, "8B/1B int4": quantized(real_pair, "int4")}
    print(header(args.k), flush=True)
    failures = 0
    for name, build in pairs.items():  # the tiny pairs first: a quick check that compiling works here
        started = time.perf_counter()
        try:
            target, draft = build(device)
        except Exception as error:  # noqa: BLE001 - report it and go on to the next pair
            traceback.print_exc()
            print(failed_row(name, "build", error), flush=True)
            failures += 1
            continue
        print(f"  {name}: built in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        reference = None  # the first mode's tokens
        for compile in modes:
            try:
                result = measure(name, target, draft, args, device, compile)
            except Exception as error:  # noqa: BLE001 - a failed row must not lose the rows after it
                traceback.print_exc()
                print(failed_row(name, compile, error), flush=True)
                failures += 1
                continue
            print(row(result, reference), flush=True)
            reference = result["tokens"] if reference is None else reference
        del target, draft
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print("overhead = step - (k x draft 1 tok + verify): the engine's own time in a step")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
