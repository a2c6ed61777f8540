"""After every step, both KV caches hold exactly the committed tokens: no rejected draft survives."""

from __future__ import annotations

import pytest

from cache_checks import assert_cache_holds
from profile_helpers import model_profile
from specdec_cli import Pipeline, SamplingSpec, Verified


@pytest.mark.parametrize("drafter", ["model", "early-exit"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_caches_hold_exactly_the_committed_tokens(tmp_path, llama_pair, drafter, temperature):
    spec = {"kind": "model", "model": str(llama_pair["draft"])} if drafter == "model" else {"kind": "early-exit", "layers": 2}
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, drafter=spec)))
    prompt = pipe.encode("def reverse(items):", chat=False)
    steps = rejections = 0
    for k in (1, 3, 6):
        decoder = pipe.decoder(k=k)
        committed = list(prompt)
        events = pipe.stream(prompt, decoder=decoder, sampling=SamplingSpec(temperature=temperature), seed=k, max_new_tokens=30)
        for event in events:
            if not isinstance(event, Verified):
                continue
            committed += event.emitted
            steps += 1
            rejections += bool(event.rejected)
            # the target holds all but the last committed token (fed with the next drafts)
            assert_cache_holds(decoder.lm, committed[:-1])
            # the draft holds a prefix; the rest waits in `pending` for its next forward
            draft = decoder.drafter
            held = draft.lm.length
            assert_cache_holds(draft.lm, committed[:held])
            assert draft.pending.tolist() == committed[held:]
    assert steps > 10 and rejections > 0  # rollbacks really happened


@pytest.mark.parametrize("kind", ["chain", "auto"])
def test_chain_member_that_sat_out_catches_up(tmp_path, llama_pair, kind):
    members = [{"kind": "ngram", "max_ngram": 2}, {"kind": "model", "model": str(llama_pair["draft"])}]
    chain = {"kind": kind, "drafters" if kind == "chain" else "candidates": members}
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, drafter=chain)))
    prompt = pipe.encode("for i in range(10):\n    print(i * i)\nfor i in range(10):\n", chat=False)
    decoder = pipe.decoder(k=4)
    committed = list(prompt)
    winners = set()
    for event in pipe.stream(prompt, decoder=decoder, max_new_tokens=30):
        if isinstance(event, Verified):
            committed += event.emitted
            winners.add((event.drafter or "plain").split("/")[0])
            model_drafter = decoder.drafter.drafters[1]
            if kind == "auto" and id(model_drafter) not in decoder.drafter.started:
                continue  # auto begins a draft model at its first step
            held = model_drafter.lm.length
            assert_cache_holds(model_drafter.lm, committed[:held])
            assert model_drafter.pending.tolist() == committed[held:]
            assert decoder.drafter.drafters[0].history.view().tolist() == committed
    assert {"ngram", "model"} <= winners
