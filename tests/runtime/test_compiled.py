"""compile: on — a static, position-indexed KV cache and one compiled step per model.

Greedy identity against transformers' generate (float32) with the compiled target and a compiled
draft model, rollbacks across steps, EOS inside a step, max_new_tokens; the static buffers hold
exactly a fresh prefill of the committed tokens after every step; sampling is seeded; and the
static cache's logic (padding, masking, rollback, growth) apart from the compiler.

Compiling costs seconds per model (one graph serves every width), so the compiled decoders are
built once per module, and inductor's kernel cache lives in a folder under the system temp dir
that later runs reuse.
"""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path

import pytest
import torch

# compiled kernels survive between test runs (inductor's own default is also under the temp dir)
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), "specdec-tests-inductor"))

from cache_checks import assert_static_cache_holds  # noqa: E402
from tiny_models import TEST_DEVICE, build_model, llama_config, noisy_copy, on_test_device, qwen2_config  # noqa: E402

from specdec_cli.decoding.engine import SpeculativeDecoder, run  # noqa: E402
from specdec_cli.decoding.events import Verified  # noqa: E402
from specdec_cli.drafters.base import DraftContext  # noqa: E402
from specdec_cli.drafters.model import ModelDrafter  # noqa: E402
from specdec_cli.runtime import static as compiled  # noqa: E402
from specdec_cli.runtime import compiled_step, static_cache  # noqa: E402
from specdec_cli.runtime.compile_choice import PRIOR_COMPILE_SECONDS, costs_for, read_records  # noqa: E402
from specdec_cli.runtime.compiled_step import CompileSettings  # noqa: E402
from specdec_cli.runtime.lm import CachedLM, make_lm, resolve_compile  # noqa: E402
from specdec_cli.runtime.static import StaticLM  # noqa: E402
from specdec_cli.specs import (
    SamplingSpec,  # noqa: E402
    TreeSpec,  # noqa: E402
)

K = 3
DEVICE = torch.device(TEST_DEVICE)  # SPECDEC_TEST_DEVICE=cuda: the compiled steps under CUDA graphs
PROMPTS = ["def add(a, b):", "for i in range(10):\n    print(i * i)\n"]


@pytest.fixture(scope="module")
def models(tokenizer) -> dict[str, torch.nn.Module]:
    llama = on_test_device(build_model(llama_config(tokenizer, layers=2), seed=0))
    built = {
        "llama": llama,
        "llama-draft": noisy_copy(llama, 0.01, seed=1),
        "qwen2": on_test_device(build_model(qwen2_config(tokenizer), seed=5)),
    }
    for name, model in built.items():  # as loaded from a folder: the key of their compile costs
        model.name_or_path = name
    return built


def context_for(target, tokenizer) -> DraftContext:
    return DraftContext(
        target=target, tokenizer=tokenizer, vocab=len(tokenizer), device=DEVICE,
        load_model=None, load_tokenizer=None, target_name="test",
    )


def model_drafter(draft, target, tokenizer, compile: str) -> ModelDrafter:
    """A ModelDrafter whose LM comes from make_lm (the one-line wiring of drafters/model.py)."""
    drafter = ModelDrafter(draft, context_for(target, tokenizer))
    drafter.lm = make_lm(draft, len(tokenizer), compile)
    drafter.reserve = drafter.lm.reserve
    drafter.warmup = lambda: drafter.lm.warmup([(1, 1), (2, 1)])
    return drafter


@pytest.fixture(scope="module")
def first_compile_cache(tmp_path_factory) -> Path:
    """The specdec cache the decoders' first compile (their warmup) recorded its costs in."""
    return tmp_path_factory.mktemp("first-compile-cache")


@pytest.fixture(scope="module")
def decoders(models, tokenizer, first_compile_cache) -> dict[str, SpeculativeDecoder]:
    """Compiled decoders, built and warmed up once: llama with a compiled draft model, qwen2 with an eager one."""
    common = {"vocab": len(tokenizer), "eos_ids": frozenset({tokenizer.eos_token_id}), "k": K, "compile": "on"}
    llama_drafter = model_drafter(models["llama-draft"], models["llama"], tokenizer, "on")
    qwen_drafter = model_drafter(noisy_copy(models["qwen2"], 0.01, seed=6), models["qwen2"], tokenizer, "off")
    built = {
        "llama": SpeculativeDecoder(models["llama"], llama_drafter, **common),
        "qwen2": SpeculativeDecoder(models["qwen2"], qwen_drafter, **common),
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDEC_CACHE_DIR", str(first_compile_cache))
        for decoder in built.values():
            decoder.warmup()
    return built


def hf_greedy(model, ids: list[int], max_new_tokens: int, eos: int, pad: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids], device=model.device), attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=model.device),
            max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=pad,
        )
    return out[0, len(ids):].tolist()


# --------------------------------------------------------------------------- compiled decoding


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_compiled_greedy_identity(decoders, models, tokenizer, name):
    decoder = decoders[name]
    assert isinstance(decoder.lm, StaticLM) and decoder.lm.settings.enabled
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rejections = 0
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        expected = hf_greedy(models[name], ids, 40, eos, pad)
        events = list(decoder.stream(ids, max_new_tokens=40, seed=0))
        rejections += sum(bool(e.rejected) for e in events if isinstance(e, Verified))
        assert list(events[-1].token_ids) == expected, prompt
        # plain decoding runs the same compiled 1-token step
        plain = SpeculativeDecoder(models[name], None, vocab=len(tokenizer), eos_ids=frozenset({eos}), compile="on")
        assert list(run(plain, ids, max_new_tokens=12).token_ids) == expected[:12]
    assert rejections > 0  # rollbacks happened mid-generation
    assert decoder.compile_seconds > 0


def test_compiled_stops_at_eos_inside_a_step_and_at_max_new_tokens(decoders, models, tokenizer):
    decoder = decoders["llama"]
    ids = tokenizer(PROMPTS[0])["input_ids"]
    pad = tokenizer.pad_token_id
    free_run = hf_greedy(models["llama"], ids, 40, tokenizer.eos_token_id, pad)
    eos = free_run[17]
    expected = hf_greedy(models["llama"], ids, 40, eos, pad)
    assert expected[-1] == eos and len(expected) < 40
    saved = decoder.eos_ids
    decoder.eos_ids = frozenset({eos})
    try:
        finished = run(decoder, ids, max_new_tokens=40)
    finally:
        decoder.eos_ids = saved
    assert list(finished.token_ids) == expected and finished.finish_reason == "eos"
    for limit in (1, 2, 23):  # shorter than, and not a multiple of, a step's k+1 tokens
        finished = run(decoder, ids, max_new_tokens=limit)
        assert list(finished.token_ids) == free_run[:limit] and finished.finish_reason == "length"


def test_static_caches_hold_exactly_the_committed_tokens_after_every_step(decoders, tokenizer):
    decoder = decoders["llama"]
    prompt = tokenizer(PROMPTS[1])["input_ids"]
    committed, steps = list(prompt), 0
    for event in decoder.stream(prompt, max_new_tokens=30, seed=0):
        if not isinstance(event, Verified):
            continue
        committed += event.emitted
        steps += 1
        assert_static_cache_holds(decoder.lm, committed[:-1])  # the last waits for the next step
        draft = decoder.drafter
        held = draft.lm.length
        assert_static_cache_holds(draft.lm, committed[:held])
        assert draft.pending.tolist() == committed[held:]
    assert steps >= 8


def test_compiled_sampling_runs_and_is_reproducible(decoders, tokenizer):
    decoder = decoders["llama"]
    ids = tokenizer(PROMPTS[0])["input_ids"]
    sampling = SamplingSpec(temperature=0.9, top_k=50)
    first = run(decoder, ids, max_new_tokens=24, sampling=sampling, seed=3).token_ids
    again = run(decoder, ids, max_new_tokens=24, sampling=sampling, seed=3).token_ids
    other = run(decoder, ids, max_new_tokens=24, sampling=sampling, seed=4).token_ids
    assert first == again and len(first) == 24
    assert first != other


def test_decoders_of_one_model_share_one_compiled_step(decoders, models, tokenizer):
    """bench and tune-k build a decoder per k: a new decoder (a new cache, then a larger one)
    compiles nothing and still decodes the target's greedy tokens."""
    eos = tokenizer.eos_token_id
    again = SpeculativeDecoder(models["llama"], None, vocab=len(tokenizer), eos_ids=frozenset({eos}), compile="on")
    assert again.lm.step is decoders["llama"].lm.step
    ids = tokenizer(PROMPTS[0])["input_ids"]
    expected = hf_greedy(models["llama"], ids, 20, eos, tokenizer.pad_token_id)
    assert list(run(again, ids, max_new_tokens=20).token_ids) == expected
    small = again.lm.capacity
    again.lm.reserve(4 * small)  # a longer generation: new, larger buffers, the same graph
    assert again.lm.capacity > small
    assert list(run(again, ids, max_new_tokens=20).token_ids) == expected
    # that short generation gave the room back (each step attends over the whole capacity)
    assert again.lm.capacity == small
    assert again.lm.compile_seconds == 0.0 and again.compile_seconds < 5


def test_a_compile_records_its_costs_for_compile_auto(decoders, models, first_compile_cache, monkeypatch):
    """Every model that compiled (both llamas; qwen2's draft stayed eager) left its compile seconds
    and, on a CPU, its 1-token step eager and compiled, which `compile: auto` reads next time."""
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(first_compile_cache))
    for name in ("llama", "llama-draft", "qwen2"):
        costs = costs_for(models[name], DEVICE)
        assert costs.compile_cold_s > 0 or costs.compile_warm_s > 0, name
        assert costs.measured == (DEVICE.type == "cpu"), name
        assert costs.compile_cold_s != PRIOR_COMPILE_SECONDS
    assert len(read_records()) == 3


def test_one_token_steps_take_the_path_warmup_measured_and_decode_the_same(decoders, models, tokenizer, monkeypatch):
    """On a CPU, warmup times a 1-token forward eager and compiled (padded to width 2) and keeps the
    cheaper for plain decoding and drafting; either way the tokens are the target's greedy ones."""
    step = decoders["llama"].lm.step
    if DEVICE.type == "cpu":
        assert isinstance(step.one_token_eager, bool)  # measured when the decoder warmed up
    else:
        assert step.one_token_eager is None  # CUDA graphs serve 1-token steps
    eos = tokenizer.eos_token_id
    ids = tokenizer(PROMPTS[1])["input_ids"]
    expected = hf_greedy(models["llama"], ids, 24, eos, tokenizer.pad_token_id)
    calls = []
    monkeypatch.setattr(step, "one_token_eager", True)
    monkeypatch.setattr(step, "call", lambda *args, _call=step.call: calls.append(args[2].shape[1]) or _call(*args))
    plain = SpeculativeDecoder(models["llama"], None, vocab=len(tokenizer), eos_ids=frozenset({eos}), compile="on")
    assert list(run(plain, ids, max_new_tokens=24).token_ids) == expected
    assert calls == []  # every step of plain decoding ran eagerly
    drafter = model_drafter(models["llama-draft"], models["llama"], tokenizer, "on")
    chain = SpeculativeDecoder(models["llama"], drafter, vocab=len(tokenizer), eos_ids=frozenset({eos}), k=K, compile="on")
    assert list(run(chain, ids, max_new_tokens=24).token_ids) == expected
    assert calls and all(width > 1 for width in calls)  # verifies stayed compiled


# --------------------------------------------------------------------------- the static cache, uncompiled


@pytest.mark.parametrize("buckets", [(), (2, 4, 8)])
def test_static_cache_padding_rollback_and_growth_match_a_full_forward(models, tokenizer, monkeypatch, buckets):
    """Exact widths (CPU) and buckets (CUDA), pads, stale slots after rollbacks, forwards past the
    widest step, and a reallocation mid-sequence."""
    monkeypatch.setattr(static_cache, "MIN_CAPACITY", 16)
    monkeypatch.setattr(compiled, "MAX_WIDTH", 8)
    model = models["qwen2"]
    lm = StaticLM(model, len(tokenizer), settings=CompileSettings(enabled=False), buckets=buckets)
    sequence = torch.randint(0, len(tokenizer), (90,), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    with torch.inference_mode():
        reference = model(input_ids=sequence[None]).logits[0]
    lm.reset()
    lm.prefill(sequence[:5])
    assert lm.capacity == 16
    position = 5
    widths = [1, 3, 2, 5, 8, 4, 7, 1, 6, 9, 12]  # 9 and 12: wider than MAX_WIDTH, unpadded
    for step, n in enumerate(widths):
        # a rejected guess first: garbage written into the slots, then rolled back
        lm.forward(torch.zeros(n, dtype=torch.long, device=DEVICE), keep=1)
        lm.truncate(position)
        keep = n if step % 2 else 1
        logits = lm.forward(sequence[position : position + n], keep=keep)
        assert torch.allclose(logits, reference[position + n - keep : position + n], atol=1e-4)
        position += n
    assert lm.capacity == 128  # grew, keeping its contents
    assert_static_cache_holds(lm, sequence[:position].tolist())


def test_static_eager_decoder_equals_transformers_greedy(models, tokenizer):
    """compile "static": the static cache with eager steps, default buckets, k = 1..5."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    ids = tokenizer(PROMPTS[1])["input_ids"]
    expected = hf_greedy(models["llama"], ids, 30, eos, pad)
    for k in (1, 2, 5):
        drafter = model_drafter(models["llama-draft"], models["llama"], tokenizer, "static")
        decoder = SpeculativeDecoder(
            models["llama"], drafter, vocab=len(tokenizer), eos_ids=frozenset({eos}), k=k, compile="static"
        )
        assert list(run(decoder, ids, max_new_tokens=30).token_ids) == expected, k


def test_verifies_up_to_max_k_tokens_are_compiled_and_the_one_wider_runs_eagerly(models, tokenizer):
    """k and a tree's nodes go up to MAX_K: every verify up to MAX_K tokens (k: 63) takes the
    compiled step; the root and MAX_K nodes is one token wider and runs eagerly, as MAX_WIDTH says."""
    from specdec_cli.profile_checks import check_tree
    from specdec_cli.specs import MAX_K

    assert check_tree({"nodes": MAX_K, "width": 4, "depth": 8}, "tree").nodes == MAX_K
    lm = StaticLM(models["llama"], len(tokenizer), settings=CompileSettings(enabled=False))
    assert lm.width_for(MAX_K) == MAX_K
    assert lm.width_for(MAX_K + 1) is None


def test_no_host_sync_inside_a_static_step(models, tokenizer, monkeypatch):
    """A step reads no device value on the host (compiled steps are full graphs, so they cannot)."""
    lm = make_lm(models["llama"], len(tokenizer), "static")
    lm.reset()
    lm.prefill(torch.arange(10, device=DEVICE))

    def sync(*args, **kwargs):
        raise AssertionError("host sync inside a step")

    for method in ("item", "tolist", "__bool__", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, method, sync)
    for n, keep in ((1, 1), (3, 3), (2, 1), (8, 8)):
        lm.forward(torch.arange(n, device=DEVICE), keep=keep)
        lm.truncate(lm.length - 1)


# --------------------------------------------------------------------------- choosing


def test_make_lm_and_resolve_compile(models, tokenizer):
    assert type(make_lm(models["llama"], len(tokenizer), "off")) is CachedLM
    with pytest.raises(ValueError):
        make_lm(models["llama"], len(tokenizer), "auto")
    assert type(make_lm(models["llama"], len(tokenizer), resolve_compile("on", DEVICE))) is StaticLM


def test_unsupported_cache_layout_falls_back_to_the_dynamic_cache(tokenizer, caplog):
    config = qwen2_config(tokenizer)
    config.layer_types = ["sliding_attention", "full_attention"]
    config.sliding_window = 16
    model = build_model(config, seed=9)
    assert type(make_lm(model, len(tokenizer), "on")) is CachedLM
    assert "not available" in caplog.text


def test_a_model_spread_over_devices_decodes_uncompiled(tokenizer, caplog):
    """device_map: auto over several GPUs: the static cache keeps its positions on one device, so
    such a model keeps the dynamic cache (with a warning) rather than failing mid-generation."""
    model = build_model(llama_config(tokenizer, layers=2), seed=3)
    model.hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "lm_head": 1}
    assert type(make_lm(model, len(tokenizer), "on")) is CachedLM
    assert "spread over 2 devices" in caplog.text
    model.hf_device_map = {"": 0}
    assert type(make_lm(model, len(tokenizer), "static")) is StaticLM


def test_a_step_that_fails_to_compile_or_record_falls_back_to_eager(models, tokenizer, caplog, monkeypatch):
    """Not every compile failure is a dynamo exception (some are re-raised unwrapped, a CUDA graph
    recording fails with a RuntimeError): the first call of a step falls back and decodes the same."""
    monkeypatch.setattr(compiled_step, "_failure", [])  # this process's record of it goes with the test
    model = copy.deepcopy(models["llama-draft"])  # a step of its own: the shared ones stay compiled
    lm = make_lm(model, len(tokenizer), "on")
    reference = make_lm(model, len(tokenizer), "off")

    def fails(*args):
        raise RuntimeError("recording a CUDA graph failed")

    lm.step.call = fails
    ids = torch.arange(12, device=DEVICE)
    for each in (lm, reference):
        each.reset()
        each.prefill(ids[:10])
    assert torch.allclose(lm.forward(ids[10:12], keep=2), reference.forward(ids[10:12], keep=2), atol=1e-4)
    assert not lm.settings.enabled and "compile failed" in caplog.text and "RuntimeError" in caplog.text
    assert compiled_step.compile_failed()  # later steps of the process run uncompiled at once


def test_compiled_tree_decoding_is_greedy_identical_and_keeps_exact_caches(decoders, models, tokenizer):
    """Token trees on the compiled steps: the same graph takes the tree's mask (no new compile),
    and after every step both static caches hold exactly the committed tokens."""
    chain = decoders["llama"]
    drafter = chain.drafter
    tree = SpeculativeDecoder(models["llama"], drafter, vocab=len(tokenizer), eos_ids=frozenset({tokenizer.eos_token_id}),
                              tree=TreeSpec(12, 3, 4), compile="on")
    from torch._dynamo.utils import counters

    graphs_before = counters["stats"]["unique_graphs"]
    branched = 0
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        expected = hf_greedy(models["llama"], ids, 40, tokenizer.eos_token_id, tokenizer.pad_token_id)
        committed = list(ids)
        for event in tree.stream(ids, max_new_tokens=40, seed=0):
            if isinstance(event, Verified):
                committed += event.emitted
                branched += event.tree
                assert_static_cache_holds(tree.lm, committed[:-1])
                assert_static_cache_holds(drafter.lm, committed[: drafter.lm.length])
        assert committed[len(ids):] == expected, prompt
    assert branched > 0
    assert counters["stats"]["unique_graphs"] == graphs_before  # the chain's graphs served the tree
