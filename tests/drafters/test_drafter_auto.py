"""drafter: auto's rule with scripted candidates and a scripted clock: it settles on the candidate
that commits the most tokens a second (a plain step included), runs a paid candidate it does not
need only to explore, learns a lookup guess's match length apart, and never times a step across
two generations. Its text is the target's: tests/decoding (greedy identity, the chi-square and
one-seed tests, batches) run it as every drafter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from profile_helpers import model_profile

from specdec_cli import Pipeline

from specdec_cli.drafters import auto
from specdec_cli.drafters.auto import AutoDrafter
from specdec_cli.drafters.base import Draft, Drafter
from specdec_cli.errors import ProfileError
from specdec_cli.profile import load_profile
from specdec_cli.profile_models import with_models
from specdec_cli.specs import SamplingSpec, TreeSpec

CHAIN = TreeSpec.chain(4)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Scripted(Drafter):
    """Proposes 4 tokens (a lookup guess from a `matched`-token match, where free); counts its proposals."""

    def __init__(self, name: str, free: bool, matched: int = 3):
        self.name, self.free, self.matched = name, free, matched
        self.proposals = 0
        self.seen = 0

    def begin(self, prompt_ids, sampling, noise):
        self.seen = len(prompt_ids)

    def propose(self, shape, budget=None):
        self.proposals += 1
        return Draft(torch.tensor([1, 2, 3, 4]), self.name, matched=self.matched if self.free else 0)

    def accept(self, new_tokens, path):
        self.seen += len(new_tokens)


def drive(drafter: AutoDrafter, clock: Clock, outcome: dict, steps: int, catch_up: float = 0.0) -> list[str]:
    """Run `steps` steps; `outcome[name]` = (tokens committed, seconds) of a step that drafter won
    ("plain": nobody drafted), a model step `catch_up` seconds dearer for each token it sat out.
    Returns who drafted each step."""
    chosen = []
    sat_out = 0
    for _ in range(steps):
        draft = drafter.propose(CHAIN)
        name = "plain" if draft is None else draft.drafter
        tokens, seconds = outcome[name]
        if name == "model":
            seconds, sat_out = seconds + catch_up * sat_out, 0
        else:
            sat_out += tokens
        clock.now += seconds
        drafter.accept([7] * tokens, list(range(tokens - 1)) if draft is not None else [])
        chosen.append(name)
    return chosen


def pair(clock: Clock, matched: int = 3) -> tuple[AutoDrafter, Scripted, Scripted]:
    lookup, model = Scripted("ngram", free=True, matched=matched), Scripted("model", free=False)
    drafter = AutoDrafter([lookup, model], clock=clock)
    drafter.begin(torch.tensor([5, 6]), SamplingSpec(), None)
    return drafter, lookup, model


def test_lookup_that_wins_leaves_the_model_to_exploring():
    clock = Clock()
    drafter, lookup, model = pair(clock)
    chosen = drive(drafter, clock, {"ngram": (5, 1.0), "model": (3, 1.5), "plain": (1, 1.0)}, 160)
    assert chosen[-100:].count("ngram") >= 100 - 100 // auto.EXPLORE_EVERY - 1
    assert model.proposals <= auto.TRIES + 160 // auto.EXPLORE_EVERY + 1
    assert lookup.seen == model.seen == 2 + sum({"ngram": 5, "model": 3, "plain": 1}[c] for c in chosen)  # all saw every token


def test_the_model_wins_where_lookup_is_seldom_kept():
    clock = Clock()
    drafter, _, model = pair(clock)
    chosen = drive(drafter, clock, {"ngram": (1, 1.05), "model": (3, 1.4), "plain": (1, 1.0)}, 160)
    assert chosen[-100:].count("model") >= 100 - 2 * (100 // auto.EXPLORE_EVERY + 1)


def test_a_model_that_pays_only_step_after_step_is_run_step_after_step():
    """Each model step first reads the tokens it sat out: run now and then it looks slower than a
    plain step; run in a row it is 2.5x faster."""
    clock = Clock()
    drafter, _, _ = pair(clock)
    outcome = {"ngram": (1, 1.05), "model": (3, 1.2), "plain": (1, 1.0)}
    chosen = drive(drafter, clock, outcome, 200, catch_up=0.5)
    assert chosen[-100:].count("model") >= 80


def test_no_draft_at_all_where_neither_pays():
    clock = Clock()
    drafter, _, _ = pair(clock)
    chosen = drive(drafter, clock, {"ngram": (1, 1.2), "model": (1, 1.5), "plain": (1, 1.0)}, 160)
    assert chosen[-100:].count("plain") >= 100 - 2 * (100 // auto.EXPLORE_EVERY + 1)


def test_a_short_matchs_guess_is_judged_apart_from_a_long_ones():
    clock = Clock()
    drafter, lookup, _ = pair(clock, matched=1)
    drive(drafter, clock, {"ngram": (1, 1.0), "model": (3, 1.4), "plain": (1, 1.0)}, 40)
    assert drafter.rates["ngram@1"].steps >= auto.TRIES and "ngram@3" not in drafter.rates
    lookup.matched = 3  # long matches now: tried on their own before the rule trusts them
    chosen = drive(drafter, clock, {"ngram": (5, 1.0), "model": (3, 1.4), "plain": (1, 1.0)}, 3)
    assert chosen[0] == "ngram"


def test_a_step_is_never_timed_across_two_generations():
    clock = Clock()
    drafter, _, _ = pair(clock)
    drafter.propose(CHAIN)
    drafter.accept([7, 7], [0])
    clock.now += 100.0  # the next prompt's prefill, between two generations
    drafter.begin(torch.tensor([5, 6]), SamplingSpec(), None)
    drafter.propose(CHAIN)
    assert all(rate.steps == 0 for rate in drafter.rates.values())


def test_drafter_auto_from_the_command_line():
    spec = with_models(load_profile("qwen-coder-local-int4"), drafter="auto").drafter
    assert spec.kind == "auto" and [c.kind for c in spec.drafters] == ["ngram", "model"]
    assert spec.drafters[1].model.quantize == "int4"  # the profile's draft model as it was
    mine = with_models(load_profile("qwen-coder-local-int4"), drafter="auto", draft="./my-draft").drafter
    assert mine.drafters[1].model.model == "./my-draft"
    with pytest.raises(ProfileError, match="--draft: a draft model goes with --drafter model, auto"):
        with_models(load_profile("qwen-coder-local-int4"), drafter="ngram", draft="./my-draft")


def test_generate_with_drafter_auto_through_the_command_line(tmp_path, llama_pair):
    """`specdec generate --drafter auto` as a shell runs it: the target's greedy tokens, and the JSON
    stats say which candidate drafted what (the profile's draft model and prompt lookup)."""
    profile = model_profile(tmp_path, llama_pair, k="auto")
    prompt = "for i in range(10):\n    print(i)\nfor i in range(10):\n"
    done = subprocess.run([sys.executable, "-m", "specdec_cli", "generate", prompt, "-p", str(profile), "--drafter", "auto",
                           "--no-chat", "-f", "json", "-n", "40"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    pipe = Pipeline.from_profile(str(profile))
    plain = pipe.generate(prompt, decoder=pipe.decoder(drafter=None), chat=False, max_new_tokens=40)
    assert tuple(answer["token_ids"]) == plain.token_ids
    ran = answer["stats"]["per_drafter"]
    assert "model" in ran and any(name.startswith("ngram") for name in ran), ran
