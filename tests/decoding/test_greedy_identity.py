"""Temperature 0: the emitted ids equal the target's own greedy decoding, for every drafter and k."""

from __future__ import annotations

import pytest

from profile_helpers import model_profile
from specdec_cli import Pipeline
from specdec_cli.decoding.transformers_generate import transformers_generate

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):\n    print(i * i)\n"]

DRAFTERS = {
    "model": lambda pair: {"kind": "model", "model": str(pair["draft"])},
    "stranger": lambda pair: {"kind": "model", "model": str(pair["stranger"])},
    "ngram": lambda pair: {"kind": "ngram", "max_ngram": 3},
    "early-exit": lambda pair: {"kind": "early-exit", "layers": 2},
    "chain": lambda pair: {"kind": "chain", "drafters": [{"kind": "ngram"}, {"kind": "model", "model": str(pair["draft"])}]},
    "auto": lambda pair: {"kind": "auto", "candidates": [{"kind": "ngram"}, {"kind": "model", "model": str(pair["draft"])}]},
}


def pipeline_for(tmp_path, pair, drafter_name: str, **fields) -> Pipeline:
    return Pipeline.from_profile(str(model_profile(tmp_path, pair, drafter=DRAFTERS[drafter_name](pair), **fields)))


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_llama_greedy_identity_every_k(tmp_path, llama_pair, drafter):
    pipe = pipeline_for(tmp_path, llama_pair, drafter)
    accepted = 0
    for prompt in PROMPTS:
        ids = pipe.encode(prompt, chat=False)
        expected = transformers_generate(pipe, ids, 40)
        for k in range(1, 9):
            result = pipe.generate(ids, decoder=pipe.decoder(k=k), max_new_tokens=40, seed=0)
            assert result.token_ids == expected, (prompt, k)
            accepted += result.stats.accepted
    if drafter in ("model", "chain", "auto"):
        assert accepted > 0  # the drafts were really used, not all rejected


@pytest.mark.parametrize("drafter", ["model", "ngram", "early-exit"])
def test_gpt2_greedy_identity(tmp_path, gpt2_pair, drafter):
    pipe = pipeline_for(tmp_path, gpt2_pair, drafter)
    for prompt in PROMPTS:
        ids = pipe.encode(prompt, chat=False)
        expected = transformers_generate(pipe, ids, 32)
        for k in (1, 3, 8):
            assert pipe.generate(ids, decoder=pipe.decoder(k=k), max_new_tokens=32).token_ids == expected


def test_plain_decoding_equals_transformers_greedy(tmp_path, llama_pair):
    pipe = pipeline_for(tmp_path, llama_pair, "model")
    ids = pipe.encode(PROMPTS[0], chat=False)
    result = pipe.generate(ids, decoder=pipe.decoder(drafter=None), max_new_tokens=30)
    assert result.token_ids == transformers_generate(pipe, ids, 30)
    assert result.stats.target_forwards == 30 and result.stats.drafted == 0


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_stops_at_eos_inside_an_accepted_draft(tmp_path, llama_pair, drafter):
    """Make a token that greedy decoding emits mid-run the EOS: nothing after it may appear."""
    pipe = pipeline_for(tmp_path, llama_pair, drafter)
    ids = pipe.encode(PROMPTS[0], chat=False)
    free_run = transformers_generate(pipe, ids, 40)
    eos = free_run[17]
    pipe.eos_ids = frozenset({eos})
    expected = transformers_generate(pipe, ids, 40)
    assert expected[-1] == eos and len(expected) < 40
    for k in range(1, 9):
        result = pipe.generate(ids, decoder=pipe.decoder(k=k), max_new_tokens=40)
        assert result.token_ids == expected, k
        assert result.finish_reason == "eos"


def test_stops_at_max_new_tokens_mid_draft(tmp_path, llama_pair):
    pipe = pipeline_for(tmp_path, llama_pair, "model")
    ids = pipe.encode(PROMPTS[1], chat=False)
    for limit in (1, 2, 5, 7, 11):
        expected = transformers_generate(pipe, ids, limit)
        for k in (3, 8):
            result = pipe.generate(ids, decoder=pipe.decoder(k=k), max_new_tokens=limit)
            assert result.token_ids == expected
            assert result.finish_reason == "length" and result.stats.new_tokens == limit


def test_any_of_several_eos_ids_stops(tmp_path, llama_pair):
    pipe = pipeline_for(tmp_path, llama_pair, "model")
    ids = pipe.encode(PROMPTS[2], chat=False)
    run = transformers_generate(pipe, ids, 30)
    pipe.eos_ids = frozenset({run[20], run[9]})
    expected = transformers_generate(pipe, ids, 30)
    assert pipe.generate(ids, max_new_tokens=30).token_ids == expected


def test_draft_with_wider_padded_head(tmp_path, models_root, tokenizer, llama_pair):
    """Qwen-style: the draft's head has padding rows the target lacks; only real ids are compared."""
    from tiny_models import build_model, llama_config, save

    padded = build_model(llama_config(tokenizer, layers=2, vocab_padding=13), seed=5)
    folder = save(padded, tokenizer, models_root / "llama-padded-draft")
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, drafter={"kind": "model", "model": str(folder)})))
    ids = pipe.encode(PROMPTS[0], chat=False)
    for k in (2, 5):
        assert pipe.generate(ids, decoder=pipe.decoder(k=k), max_new_tokens=30).token_ids == transformers_generate(pipe, ids, 30)


def test_int8_draft_keeps_greedy_identity(tmp_path, llama_pair):
    drafter = {"kind": "model", "model": str(llama_pair["draft"]), "quantize": "int8"}
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, drafter=drafter)))
    draft = pipe.decoder(k=4).drafter.draft_model
    quantized = [m for m in draft.modules() if type(getattr(m, "weight", None)).__name__ == "Int8Tensor"]
    assert quantized  # the draft's Linear layers really are int8 now (torchao, weight-only)
    accepted = 0
    for prompt in PROMPTS:
        ids = pipe.encode(prompt, chat=False)
        expected = transformers_generate(pipe, ids, 40)
        for k in (1, 4, 8):
            result = pipe.generate(ids, decoder=pipe.decoder(k=k), max_new_tokens=40, seed=0)
            assert result.token_ids == expected, (prompt, k)
            accepted += result.stats.accepted
    assert accepted > 0


def test_the_decoder_keeps_within_the_context_it_is_given(tmp_path, llama_pair):
    """Called directly (no Pipeline.limit_for), the engine cuts max_new_tokens to the context's
    room and refuses a prompt that fills it, with the same message."""
    from specdec_cli.decoding.engine import SpeculativeDecoder, run
    from specdec_cli.errors import ContextLengthError

    pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair)))
    ids = pipe.encode("def add(a, b):", chat=False)
    decoder = SpeculativeDecoder(pipe.target, pipe.make_drafter(pipe.profile.drafter), vocab=pipe.vocab,
                                 eos_ids=frozenset(), k=3, context_length=len(ids) + 5)
    assert len(run(decoder, ids, max_new_tokens=40).token_ids) == 5
    with pytest.raises(ContextLengthError, match=f"the prompt is {len(ids) + 5} tokens, and the model's context is {len(ids) + 5}; shorten it"):
        run(decoder, ids + ids[:5], max_new_tokens=40)
