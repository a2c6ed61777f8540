"""Shared fixtures: tiny Llama and GPT-2 pairs saved like real checkpoints, and profiles for them."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

from profile_helpers import model_profile
from vocab_pairs import build_vocab_pair
from tiny_models import (
    TEST_DEVICE,
    build_model,
    build_tokenizer,
    build_word_tokenizer,
    gpt2_config,
    llama_config,
    save,
    save_pair,
)


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# parallel workers (pytest-xdist) share the cores: two workers on two cores, each with torch's
# default thread per core, spin against each other and took longer than one process. The CLI
# processes tests start inherit the setting; one set by hand is kept
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    _threads = max(1, usable_cores() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    os.environ["OMP_NUM_THREADS"] = str(_threads)
    torch.set_num_threads(_threads)

# no test may reach the network: the hub is "offline", and the user's config and cache stay untouched
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# specdec's CPU kernels build once per test run, outside the user's cache: kernels/build.py takes
# $TORCH_EXTENSIONS_DIR over <specdec cache>/kernels (which each test moves); the run's parallel
# workers share one folder (torch's build takes a lock there), so they build once
if "TORCH_EXTENSIONS_DIR" not in os.environ:
    _run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if _run_id:
        _extensions = Path(tempfile.gettempdir()) / f"specdec-test-extensions-{_run_id}"
        _extensions.mkdir(exist_ok=True)
    else:
        _extensions = Path(tempfile.mkdtemp(prefix="specdec-test-extensions-"))
    os.environ["TORCH_EXTENSIONS_DIR"] = str(_extensions)


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("SPECDEC_CONFIG_DIR", str(home / "config"))
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(home / "cache"))
    monkeypatch.delenv("SPECDEC_PROFILE", raising=False)
    monkeypatch.delenv("SPECDEC_DEBUG", raising=False)


@pytest.fixture(scope="session")
def models_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tokenizer(models_root):
    return build_tokenizer(models_root / "tokenizer")


@pytest.fixture(scope="session")
def llama_pair(models_root, tokenizer) -> dict[str, Path]:
    """target: 4-layer Llama; draft: the target plus noise (agrees about half the time);
    stranger: an unrelated 2-layer Llama (rarely agrees)."""
    target = build_model(llama_config(tokenizer, layers=4), seed=0)
    return {
        **save_pair(target, tokenizer, models_root, "llama", noise=0.01, seed=1),
        "stranger": save(build_model(llama_config(tokenizer, layers=2), seed=7), tokenizer, models_root / "llama-stranger"),
    }


@pytest.fixture(scope="session")
def gpt2_pair(models_root, tokenizer) -> dict[str, Path]:
    target = build_model(gpt2_config(tokenizer, layers=3), seed=3)
    return save_pair(target, tokenizer, models_root, "gpt2", noise=0.1, seed=4)


@pytest.fixture(scope="session")
def vocab_pair(models_root) -> dict[str, Path]:
    """A target and a draft with two different tokenizers, fitted to write alike (vocab_pairs.py)."""
    return build_vocab_pair(models_root / "vocab")


@pytest.fixture(scope="session")
def small_vocab_pair(models_root) -> dict[str, Path]:
    """A 12-token vocabulary: small enough to write down the exact distribution of two tokens."""
    words = build_word_tokenizer(models_root / "words-tokenizer")
    target = build_model(llama_config(words, layers=2, hidden=32, seed_std=0.5), seed=11)
    return save_pair(target, words, models_root, "words", noise=0.3, seed=12)


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: a worker per core this process may use, at most 4 (each worker loads its own
    torch, transformers and tiny models)."""
    return max(1, min(4, usable_cores()))


def pytest_report_header(config):
    if TEST_DEVICE != "cpu":
        return f"specdec: tests run on {TEST_DEVICE} (SPECDEC_TEST_DEVICE)"
    return None


@pytest.fixture
def llama_profile(tmp_path, llama_pair) -> Path:
    return model_profile(tmp_path, llama_pair)
