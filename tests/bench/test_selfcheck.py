"""`specdec verify`: passes on an exact engine, fails (exit 1) when the engine is broken."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import specdec_cli.decoding.batched as core_module
from profile_helpers import model_profile
from specdec_cli.cli.app import main
from specdec_cli.bench.selfcheck import chi2_sf, goodness_of_fit, two_sample_test


def verify_json(capsys, *args: str) -> tuple[int, dict]:
    code = main(["verify", *args, "--format", "json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out)


def test_verify_passes_on_the_real_engine(capsys, tmp_path, llama_pair):
    profile = model_profile(tmp_path, llama_pair)
    code, report = verify_json(capsys, "-p", str(profile), "--samples", "150")
    assert code == 0 and report["passed"] is True
    assert len(report["greedy"]) == 6 and all(r["identical"] for r in report["greedy"])
    assert {r["against"] for r in report["greedy"]} == {"plain", "transformers"}
    (dist,) = report["distribution"]
    assert dist["samples"] == 150 and dist["temperature"] == 1.0  # a greedy profile is checked at T=1
    assert dist["first_token_p_value"] >= 1e-3 and 0 <= dist["first_token_tv"] <= dist["first_token_tv_upper"]


def keep_every_draft(draft_ids, parents, choices):
    """A broken verifier: each row keeps its whole chain, right or wrong."""
    n = torch.tensor([len(row) for row in parents], device=choices.device)
    return n, n - 1, choices.gather(1, n[:, None])[:, 0]


def test_verify_fails_when_greedy_verification_is_broken(capsys, tmp_path, llama_pair, monkeypatch):
    monkeypatch.setattr(core_module, "accept_rows", keep_every_draft)
    profile = model_profile(tmp_path, llama_pair, drafter={"kind": "model", "model": str(llama_pair["stranger"])})
    code, report = verify_json(capsys, "-p", str(profile), "--samples", "0")
    assert code == 1 and report["passed"] is False
    failed = [r for r in report["greedy"] if not r["passed"]]
    assert failed and all(r["divergence"] and not r["divergence"]["near_tie"] for r in failed)


def test_verify_fails_when_the_sampler_is_broken(capsys, tmp_path, small_vocab_pair, monkeypatch):
    monkeypatch.setattr(core_module, "accept_rows", keep_every_draft)
    profile = model_profile(tmp_path, small_vocab_pair, chat=False)
    prompts = tmp_path / "p.txt"
    prompts.write_text("alpha beta gamma alpha beta\n")
    code, report = verify_json(capsys, "-p", str(profile), "--prompts", str(prompts), "--samples", "600")
    assert code == 1
    assert report["distribution"][0]["passed"] is False


def test_chi2_sf_matches_known_values():
    from scipy import stats

    for x, dof in [(3.84, 1), (10.0, 4), (0.5, 3), (50.0, 30)]:
        assert chi2_sf(x, dof) == pytest.approx(stats.chi2.sf(x, dof), rel=1e-6)


def test_goodness_of_fit_and_two_sample_tests_can_fail():
    rng = np.random.default_rng(0)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    fair = torch.tensor(np.bincount(rng.choice(4, 2000, p=p.numpy()), minlength=4), dtype=torch.float64)
    biased = torch.tensor(np.bincount(rng.choice(4, 2000, p=[0.3, 0.3, 0.3, 0.1]), minlength=4), dtype=torch.float64)
    assert goodness_of_fit(fair, p)["p_value"] > 1e-3
    assert goodness_of_fit(biased, p)["p_value"] < 1e-6
    assert goodness_of_fit(biased, p)["tv_upper"] >= goodness_of_fit(biased, p)["tv"] > 0.15
    a = [tuple(rng.choice(3, 2)) for _ in range(1500)]
    b = [tuple(rng.choice(3, 2)) for _ in range(1500)]
    c = [tuple(rng.choice(3, 2, p=[0.6, 0.2, 0.2])) for _ in range(1500)]
    assert two_sample_test(a, b)["p_value"] > 1e-3
    assert two_sample_test(a, c)["p_value"] < 1e-6


def test_verify_covers_tree_profiles(capsys, tmp_path, small_vocab_pair, llama_pair):
    """A profile with `tree:` is verified as a tree: greedy identity, and the sampled distribution."""
    profile = model_profile(tmp_path, llama_pair, tree={"nodes": 12, "width": 3, "depth": 4})
    code, report = verify_json(capsys, "-p", str(profile), "--samples", "0")
    assert code == 0 and report["passed"] is True and all(r["identical"] for r in report["greedy"])
    words = model_profile(tmp_path, small_vocab_pair, name="words", chat=False, tree={"nodes": 6, "width": 3, "depth": 2})
    prompts = tmp_path / "p.txt"
    prompts.write_text("alpha beta gamma alpha beta\n")
    code, report = verify_json(capsys, "-p", str(words), "--prompts", str(prompts), "--samples", "300")
    assert code == 0 and report["distribution"][0]["passed"] is True


def test_verify_tree_flag_fails_when_tree_acceptance_is_broken(capsys, tmp_path, llama_pair, monkeypatch):
    real = core_module.accept_rows

    def keeps_the_first_path(draft_ids, parents, choices):  # keeps node 0, right or wrong
        n, end, token = real(draft_ids, parents, choices)
        drafted = torch.tensor([bool(row) for row in parents], device=choices.device)  # plain steps draft nothing
        # node 0 is always a child of the root
        return torch.where(drafted, 1, n), torch.where(drafted, 0, end), torch.where(drafted, choices[:, 1 % choices.shape[1]], token)

    monkeypatch.setattr(core_module, "accept_rows", keeps_the_first_path)
    profile = model_profile(tmp_path, llama_pair, drafter={"kind": "model", "model": str(llama_pair["stranger"])})
    code, report = verify_json(capsys, "-p", str(profile), "--tree", "12,3,4", "--samples", "0")
    assert code == 1 and report["passed"] is False
