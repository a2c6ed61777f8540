"""Hostile inputs to the decoding path: random distributions for the sampler, random token sequences
for prompt lookup, limits (context, k, memory, devices) and prompts (empty, huge, bad bytes, RTL, emoji).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import assert_one_line_error, run_cli
from exact_distribution import chi_square_pvalue
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profile_helpers import model_profile

from specdec_cli import Pipeline
from specdec_cli.drafters.ngram import TokenHistory, find_continuation
from specdec_cli.errors import ProfileError
from specdec_cli.primitives.sampling import choose, fit_vocab, probabilities, race
from specdec_cli.profile import SamplingSpec
from specdec_cli.profile_checks import check_temperature
from specdec_cli.decoding.transformers_generate import transformers_generate

REPO = Path(__file__).resolve().parents[2]
PROPERTY = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
NEG_INF = float("-inf")


# =========================================================================== 1. the sampler emits exactly p


def assert_distribution(p: torch.Tensor) -> None:
    assert torch.isfinite(p).all() and (p >= 0).all(), p
    assert abs(float(p.double().sum()) - 1.0) < 1e-5, p


@st.composite
def warped_pairs(draw):
    """p and q as the engine makes them: raw logits of two heads, cut or padded to the target's
    vocabulary (fit_vocab), then warped by the same temperature / top-k / top-p (probabilities)."""
    vocab = draw(st.integers(2, 12))
    width_p = vocab + draw(st.integers(0, 3))  # the target's head may be padded past the vocabulary
    width_q = max(1, vocab + draw(st.integers(-3, 3)))  # the draft's may be narrower or wider
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scale_p, scale_q = draw(st.sampled_from([0.05, 1.0, 3.0, 30.0])), draw(st.sampled_from([0.05, 1.0, 3.0, 30.0]))
    logits_p = torch.randn(width_p, generator=generator) * scale_p
    same = draw(st.booleans()) and width_q == width_p
    logits_q = logits_p.clone() if same else torch.randn(width_q, generator=generator) * scale_q
    # tokens a model rules out entirely: q zero where p is positive, and the reverse
    for logits, width in ((logits_p, width_p), (logits_q, width_q)):
        holes = draw(st.lists(st.integers(0, width - 1), max_size=width))
        keep = draw(st.integers(0, min(width, vocab) - 1))  # one real token stays possible
        logits[[h for h in holes if h != keep]] = NEG_INF
    spec = SamplingSpec(
        temperature=draw(st.floats(0.05, 5.0) | st.sampled_from([1e-3, 1.0, 50.0])),
        top_k=draw(st.integers(0, vocab + 2)),
        top_p=draw(st.floats(0.05, 1.0) | st.just(1.0)),
    )
    p = probabilities(fit_vocab(logits_p, vocab), spec)
    q = probabilities(fit_vocab(logits_q, vocab), spec)
    return p, q, spec


CHOICES = 3000


def choice_pvalue(logits: torch.Tensor, sampling: SamplingSpec, rule=choose) -> float:
    """`rule` (the engine's seeded choice) over CHOICES rows of Exp(1) noise: chi-square against
    the warped p; no token the warps removed may ever be chosen."""
    p = probabilities(logits, sampling).double()
    noise = torch.empty(CHOICES, p.shape[0]).exponential_(generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(rule(logits.expand(CHOICES, -1), sampling, noise), minlength=p.shape[0]).double()
    assert counts[p == 0].sum() == 0, (p, counts)
    return chi_square_pvalue(counts.numpy(), (p / p.sum()).numpy()) if int((p > 0).sum()) > 1 else 1.0


@PROPERTY
@given(pair=warped_pairs())
def test_the_seeded_choice_follows_p_for_random_warps_and_vocab_sizes(pair):
    """The target's choice argmax(p / e) is a draw from the warped p; a drafter's ranking by q / e
    puts only tokens q allows first (so a guess is never a token the draft ruled out)."""
    p, q, spec = pair
    assert_distribution(p)
    assert_distribution(q)
    assert choice_pvalue(p.log(), SamplingSpec(1.0)) > 1e-5  # softmax(log p) at temperature 1 is p itself
    noise = torch.empty(50, q.shape[0]).exponential_(generator=torch.Generator().manual_seed(1))
    first = race(q.expand(50, -1), noise).argmax(-1)
    assert (q[first] > 0).all()


def test_the_choice_check_catches_a_wrong_rule():
    """The check above, run over a wrong rule (the noise added, not divided), does not pass."""
    logits, sampling = torch.tensor([2.0, 0.0, -1.0, 1.0]), SamplingSpec(1.0)
    assert choice_pvalue(logits, sampling) > 1e-3

    def plus_noise(logits, sampling, noise):
        return (probabilities(logits, sampling) + noise).argmax(-1)

    assert choice_pvalue(logits, sampling, plus_noise) < 1e-6


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    temperature=st.floats(min_value=0.0, max_value=1e300, exclude_min=True) | st.sampled_from([5e-324, 1e-300, 1e-45, 1e-40]),
    scale=st.sampled_from([0.01, 1.0, 100.0]),
    top_k=st.integers(0, 8),
    top_p=st.floats(0.01, 1.0),
)
def test_every_temperature_a_profile_accepts_gives_a_distribution(temperature, scale, top_k, top_p):
    """Each temperature the profile checks let through must give finite probabilities (refusing the
    tiniest ones there is as good a fix as handling them in the warp)."""
    try:
        temperature = check_temperature(temperature, "--temperature")
    except ProfileError:
        return
    logits = torch.randn(3, 7, generator=torch.Generator().manual_seed(0)) * scale
    p = probabilities(logits, SamplingSpec(temperature, top_k, top_p))
    for row in p:
        assert_distribution(row)


@pytest.mark.parametrize("temperature", ["1e-300", "1e-45"])
def test_tiny_temperature_on_the_command_line(capsys, llama_profile, temperature):
    code, out, err = run_cli(capsys, "generate", "def add(a, b):", "-p", str(llama_profile), "-f", "json",
                             "--temperature", temperature, "--seed", "1")
    if code == 2:
        assert_one_line_error(err, "--temperature")
    else:
        assert code == 0, err
        assert json.loads(out)["new_tokens"] == 24


# =========================================================================== 2. prompt lookup vs brute force


def brute_force_continuation(tokens: list[int], max_ngram: int, min_ngram: int, k: int) -> list[int]:
    """From the docstring: n from max_ngram down to min_ngram, the suffix n-gram's most recent earlier
    occurrence that has a next token, up to k of the tokens after it; [] when nothing matches."""
    length = len(tokens)
    for n in range(max_ngram, min_ngram - 1, -1):
        if n < 1 or n > length - 1:
            continue
        suffix = tokens[length - n:]
        for start in range(length - n - 1, -1, -1):  # start + n <= length - 1: a next token exists
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    tokens=st.lists(st.integers(0, 3), max_size=40) | st.lists(st.integers(0, 50_000), max_size=12),
    max_ngram=st.integers(1, 6),
    min_ngram=st.integers(1, 6),
    k=st.integers(0, 10),
)
def test_find_continuation_agrees_with_brute_force(tokens, max_ngram, min_ngram, k):
    got = find_continuation(np.array(tokens, dtype=np.int64), max_ngram, min_ngram, k)
    assert got.tolist() == brute_force_continuation(tokens, max_ngram, min_ngram, k)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(chunks=st.lists(st.lists(st.integers(0, 5), max_size=70), max_size=8))
def test_token_history_grows_without_losing_tokens(chunks):
    history = TokenHistory(chunks[0] if chunks else [])
    everything = list(chunks[0]) if chunks else []
    for chunk in chunks[1:]:
        history.extend(chunk)
        everything += chunk
        assert history.view().tolist() == everything
        assert find_continuation(history.view(), 3, 1, 4).tolist() == brute_force_continuation(everything, 3, 1, 4)


def lookup(tokens, max_ngram=3, min_ngram=1, k=4) -> list[int]:
    return find_continuation(np.array(tokens, dtype=np.int64), max_ngram, min_ngram, k).tolist()


def test_longest_ngram_wins_over_a_later_shorter_one():
    # suffix [1, 2, 3]: its 3-gram occurs at 0 (followed by 7); the 1-gram [3] occurs later (followed by 9)
    assert lookup([1, 2, 3, 7, 8, 3, 9, 1, 2, 3]) == [7, 8, 3, 9]


def test_most_recent_occurrence_wins():
    assert lookup([5, 6, 1, 5, 6, 2, 5, 6], max_ngram=2) == [2, 5, 6]


def test_no_match_is_empty():
    assert lookup([1, 2, 3, 4]) == []
    assert lookup([]) == [] and lookup([7]) == []
    assert lookup([1, 2, 1, 2], min_ngram=3, max_ngram=3) == []  # only 2-grams repeat


def test_match_at_the_very_end_gives_what_is_left():
    # the latest earlier occurrence of [7, 7] ends one before the last token: one token follows it
    assert lookup([5, 7, 7, 7], max_ngram=2, min_ngram=2) == [7]
    # a continuation cut by the end of the sequence (fewer than k tokens)
    assert lookup([1, 2, 9, 1, 2], max_ngram=2, k=10) == [9, 1, 2]
    assert lookup([4, 4], max_ngram=3) == [4]


def test_k_zero_and_min_above_max_are_empty():
    assert lookup([1, 2, 1, 2], k=0) == []
    assert lookup([1, 2, 1, 2], max_ngram=1, min_ngram=2) == []


# =========================================================================== 4. limits


DRAFTERS = {
    "model": lambda pair: {"kind": "model", "model": str(pair["draft"])},
    "ngram": lambda pair: {"kind": "ngram", "max_ngram": 3},
}
REPETITIVE = "def add(a, b):\n    return a + b\n" * 4  # prompt lookup proposes long runs here


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_k_larger_than_max_new_tokens_stops_exactly(capsys, tmp_path, llama_pair, drafter):
    profile = model_profile(tmp_path, llama_pair, k=8, drafter=DRAFTERS[drafter](llama_pair))
    code, out, err = run_cli(capsys, "generate", REPETITIVE, "-p", str(profile), "--no-chat", "-f", "json", "-n", "3")
    assert code == 0, err
    obj = json.loads(out)
    pipe = Pipeline.from_profile(str(profile))
    expected = list(transformers_generate(pipe, pipe.encode(REPETITIVE, chat=False), 3))
    assert obj["token_ids"] == expected and obj["new_tokens"] == len(expected) <= 3


@pytest.mark.parametrize("pair_name", ["llama_pair", "gpt2_pair"])
@pytest.mark.parametrize("prompt_tokens, room", [(509, 3), (511, 1)])
def test_k_larger_than_the_room_left_in_the_context(capsys, tmp_path, request, monkeypatch, pair_name, prompt_tokens, room):
    """k=8 with 3 (or 1) positions left: the output is the target's greedy tokens, it stops at the
    context end, and no forward of either model is ever fed a position past the context (GPT-2's
    learned position table has exactly 512 rows)."""
    from specdec_cli.runtime.lm import CachedLM

    pair = request.getfixturevalue(pair_name)
    profile = model_profile(tmp_path, pair, k=8, drafter={"kind": "model", "model": str(pair["draft"])})
    deepest = []
    real_forward = CachedLM.forward

    def recording_forward(self, ids, keep, tree=None):
        deepest.append(self.length + ids.shape[-1])
        return real_forward(self, ids, keep, tree)

    monkeypatch.setattr(CachedLM, "forward", recording_forward)
    prompt = "~" * prompt_tokens  # one token per character in this tokenizer (checked below)
    code, out, err = run_cli(capsys, "generate", prompt, "-p", str(profile), "--no-chat", "-f", "json", "-n", "100")
    assert code == 0, err
    obj = json.loads(out)
    assert obj["prompt_tokens"] == prompt_tokens
    pipe = Pipeline.from_profile(str(profile))
    ids = pipe.encode(prompt, chat=False)
    assert len(ids) == prompt_tokens
    expected = list(transformers_generate(pipe, ids, room))
    assert obj["token_ids"] == expected
    assert obj["prompt_tokens"] + obj["new_tokens"] <= 512
    assert max(deepest) <= 512
    assert "would pass the context" in err


def test_prompt_of_exactly_the_context_is_refused(capsys, llama_profile):
    code, out, err = run_cli(capsys, "generate", "~" * 512, "-p", str(llama_profile), "--no-chat", "-f", "json")
    assert code == 2 and out == ""
    assert_one_line_error(err, "512", "shorten")


def oom_cuda(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")


def oom_old_style(*args, **kwargs):
    raise RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported")


def oom_host(*args, **kwargs):
    raise MemoryError()


@pytest.mark.parametrize("where", ["load", "forward"])
@pytest.mark.parametrize("error, fragments", [
    (oom_cuda, ["out of memory", "dtype"]),
    (oom_old_style, ["out of memory", "dtype"]),
    (oom_host, ["out of host memory", "dtype"]),
])
def test_out_of_memory_anywhere_is_one_line_and_exit_1(capsys, llama_profile, monkeypatch, where, error, fragments):
    if where == "load":
        from transformers import AutoModelForCausalLM

        monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", error)
    else:
        from specdec_cli.runtime.lm import CachedLM

        monkeypatch.setattr(CachedLM, "forward", error)
    code, out, err = run_cli(capsys, "generate", "hi", "-p", str(llama_profile), "-f", "json")
    assert code == 1 and out == ""
    assert_one_line_error(err, *fragments)


def test_out_of_memory_during_bench_writes_no_report(capsys, tmp_path, llama_profile, monkeypatch):
    from specdec_cli.runtime.lm import CachedLM

    real_forward, calls = CachedLM.forward, []

    def forward_then_oom(self, ids, keep, tree=None):
        calls.append(1)
        if len(calls) > 5:
            oom_cuda()
        return real_forward(self, ids, keep, tree)

    monkeypatch.setattr(CachedLM, "forward", forward_then_oom)
    report = tmp_path / "reports" / "bench.json"
    code, out, err = run_cli(capsys, "bench", "-p", str(llama_profile), "--methods", "specdec", "--repeats", "1",
                             "--warmup", "0", "-n", "8", "--limit", "1", "-f", "json", "--output", str(report))
    assert code == 1
    assert_one_line_error(err, "out of memory")
    assert not report.exists()
    assert not report.parent.exists() or list(report.parent.iterdir()) == []


def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("setup, where, fragments", [
    ("profile", "cuda", ["cuda", "--device cpu"]),
    ("profile", "cuda:0", ["cuda:0", "--device cpu"]),
    ("flag", "cuda:1", ["cuda:1", "--device cpu"]),
])
def test_cuda_on_a_cpu_only_machine(capsys, tmp_path, llama_pair, monkeypatch, setup, where, fragments):
    no_cuda(monkeypatch)
    if setup == "profile":
        profile = model_profile(tmp_path, llama_pair, device=where)
        args = []
    else:
        profile = model_profile(tmp_path, llama_pair)
        args = ["--device", where]
    code, out, err = run_cli(capsys, "generate", "hi", "-p", str(profile), *args)
    assert code == 2 and out == ""
    assert_one_line_error(err, *fragments)


def test_cuda_index_past_the_device_count(capsys, llama_profile, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(llama_profile), "--device", "cuda:3")
    assert code == 2
    assert_one_line_error(err, "cuda:3", "1 CUDA device")


def test_mps_asked_for_but_absent(capsys, llama_profile, monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(llama_profile), "--device", "mps")
    assert code == 2
    assert_one_line_error(err, "mps", "--device cpu")


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cuda:-1", "cpu:0", ""])
def test_unknown_devices_are_usage_errors(capsys, llama_profile, device):
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(llama_profile), "--device", device)
    assert code == 2
    assert_one_line_error(err, "--device")


@pytest.mark.parametrize("command", ["bench", "tune-k"])
def test_bench_and_tune_refuse_absent_cuda_before_loading(capsys, tmp_path, llama_profile, monkeypatch, command):
    import specdec_cli.api as api

    no_cuda(monkeypatch)
    loads = []
    monkeypatch.setattr(api, "load_model", lambda *a, **kw: loads.append(a))
    report = tmp_path / "out.json"
    code, _, err = run_cli(capsys, command, "-p", str(llama_profile), "--device", "cuda", "--output", str(report))
    assert code == 2 and loads == [] and not report.exists()
    assert_one_line_error(err, "cuda", "--device cpu")


def test_auto_device_without_accelerators_runs_on_cpu(capsys, tmp_path, llama_pair, monkeypatch):
    no_cuda(monkeypatch)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    profile = model_profile(tmp_path, llama_pair, device="auto")
    code, out, err = run_cli(capsys, "generate", "hi", "-p", str(profile), "-f", "json", "-n", "4")
    assert code == 0, err
    assert json.loads(out)["new_tokens"] == 4


# =========================================================================== 5. prompts


@pytest.mark.parametrize("raw", [b"", b"   \n\t \r\n", b"\n", "\u3000\u2003".encode()])
@pytest.mark.parametrize("via", ["stdin", "file"])
def test_empty_and_blank_prompts_from_stdin_and_files(capsys, tmp_path, llama_profile, monkeypatch, raw, via):
    if via == "stdin":
        code, out, err = run_cli(capsys, "generate", "-p", str(llama_profile), stdin=raw, monkeypatch=monkeypatch)
    else:
        prompt = tmp_path / "prompt.txt"
        prompt.write_bytes(raw)
        code, out, err = run_cli(capsys, "generate", "--prompt-file", str(prompt), "-p", str(llama_profile))
    assert code == 2 and out == ""
    assert_one_line_error(err, "prompt is empty")


HUNDRED_KB = ("def add(a, b):\n    return a + b\n" * 3200)[:100_000]


@pytest.mark.parametrize("via", ["argument", "stdin", "file"])
def test_100_kb_prompt_is_a_context_error(capsys, tmp_path, llama_profile, monkeypatch, via):
    assert len(HUNDRED_KB.encode()) == 100_000
    args = ["generate", "-p", str(llama_profile), "--no-chat", "-f", "json"]
    if via == "argument":
        code, out, err = run_cli(capsys, *args, HUNDRED_KB)
    elif via == "stdin":
        code, out, err = run_cli(capsys, *args, stdin=HUNDRED_KB.encode(), monkeypatch=monkeypatch)
    else:
        prompt = tmp_path / "big.txt"
        prompt.write_text(HUNDRED_KB)
        code, out, err = run_cli(capsys, *args, "--prompt-file", str(prompt))
    assert code == 2 and out == ""
    assert_one_line_error(err, "context is 512", "shorten")


BAD_UTF8 = {
    "latin-1": "café".encode("latin-1"),
    "lone continuation byte": b"abc \x80 def",
    "truncated sequence": b"price: 5 \xe2\x82",
    "overlong slash": b"a\xc0\xafb",
    "encoded surrogate": b"x \xed\xa0\x80 y",
    "bytes ff fe": b"\xff\xfeh\x00i\x00",
}


@pytest.mark.parametrize("name", BAD_UTF8)
@pytest.mark.parametrize("via", ["stdin", "file"])
def test_invalid_utf8_prompts_are_clean_errors(capsys, tmp_path, llama_profile, monkeypatch, name, via):
    if via == "stdin":
        code, out, err = run_cli(capsys, "generate", "-p", str(llama_profile), stdin=BAD_UTF8[name], monkeypatch=monkeypatch)
        where = "stdin"
    else:
        prompt = tmp_path / "prompt.txt"
        prompt.write_bytes(BAD_UTF8[name])
        code, out, err = run_cli(capsys, "generate", "--prompt-file", str(prompt), "-p", str(llama_profile))
        where = "--prompt-file"
    assert code == 2 and out == ""
    assert_one_line_error(err, where, "not valid UTF-8")


def test_prompt_directory_is_a_clean_error(capsys, tmp_path, llama_profile):
    code, _, err = run_cli(capsys, "generate", "--prompt-file", str(tmp_path), "-p", str(llama_profile))
    assert code == 2
    assert_one_line_error(err, "--prompt-file", "not a file")


@pytest.mark.parametrize("via", ["argument", "stdin", "file"])
def test_nul_bytes_in_prompts_are_refused(capsys, tmp_path, llama_profile, monkeypatch, via):
    text = "def add(a, b):\x00 return a + b"
    if via == "argument":
        code, out, err = run_cli(capsys, "generate", text, "-p", str(llama_profile))
    elif via == "stdin":
        code, out, err = run_cli(capsys, "generate", "-p", str(llama_profile), stdin=text.encode(), monkeypatch=monkeypatch)
    else:
        prompt = tmp_path / "prompt.txt"
        prompt.write_bytes(text.encode())
        code, out, err = run_cli(capsys, "generate", "--prompt-file", str(prompt), "-p", str(llama_profile))
    assert code == 2 and out == ""
    assert_one_line_error(err, "NUL")


UNICODE_PROMPTS = {
    "arabic": "اكتب دالة بايثون تعكس قائمة مترابطة",
    "hebrew": "כתוב פונקציה שהופכת רשימה מקושרת",
    "emoji": "fix this 🐛 please 🙏🏽 👨‍👩‍👧‍👦",
    "rtl override": "abc \u202edcba\u202c done",
    "combining": "e\u0301e\u0301 n\u0303 Zalgo: Z\u0336\u0351a\u0337l\u0334g\u0335o",
    "mixed scripts": "def f(x): # מחזיר x 😀 يعيد",
}


@pytest.fixture(scope="module")
def unicode_reference(tmp_path_factory, llama_pair):
    """The API's greedy result for each prompt (chat template on: the profile says auto)."""
    profile = model_profile(tmp_path_factory.mktemp("unicode"), llama_pair)
    pipe = Pipeline.from_profile(str(profile))
    return profile, {name: pipe.generate(text, seed=0) for name, text in UNICODE_PROMPTS.items()}


@pytest.mark.parametrize("name", UNICODE_PROMPTS)
def test_unicode_prompts_json_equals_the_api(capsys, unicode_reference, name):
    profile, reference = unicode_reference
    code, out, err = run_cli(capsys, "generate", UNICODE_PROMPTS[name], "-p", str(profile), "-f", "json")
    assert code == 0, err
    obj = json.loads(out)
    assert tuple(obj["token_ids"]) == reference[name].token_ids
    assert obj["text"] == reference[name].text


@pytest.mark.parametrize("name", UNICODE_PROMPTS)
def test_unicode_prompts_text_format_equals_the_api(capsys, unicode_reference, name):
    profile, reference = unicode_reference
    code, out, err = run_cli(capsys, "generate", UNICODE_PROMPTS[name], "-p", str(profile), "-f", "text")
    assert code == 0, err
    assert out == reference[name].text + "\n"


def test_text_format_prints_a_trailing_partial_character(capsys, llama_profile):
    """Byte-level tokens can end a generation in the middle of a UTF-8 character; the text format must
    still print what the API (and --format json) return, U+FFFD included, not drop the tail."""
    pipe = Pipeline.from_profile(str(llama_profile))
    prompt = "def add(a, b):"
    cut = next((n for n in range(1, 25) if pipe.generate(prompt, max_new_tokens=n).text.endswith("\ufffd")), None)
    assert cut is not None, "precondition: some length ends inside a character"
    expected = pipe.generate(prompt, max_new_tokens=cut).text
    code, out, err = run_cli(capsys, "generate", prompt, "-p", str(llama_profile), "-f", "text", "-n", str(cut))
    assert code == 0, err
    assert out == expected + "\n"


def spawn(*args, stdin: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([os.fsencode(sys.executable), b"-m", b"specdec_cli", *args], cwd=REPO, env=env,
                          input=stdin, capture_output=True, timeout=timeout)


def test_subprocess_rtl_and_emoji_argument_equals_the_api(unicode_reference):
    profile, reference = unicode_reference
    proc = spawn(b"generate", UNICODE_PROMPTS["mixed scripts"].encode(), b"-p", os.fsencode(profile), b"-f", b"json")
    assert proc.returncode == 0, proc.stderr
    obj = json.loads(proc.stdout.decode("utf-8"))
    assert tuple(obj["token_ids"]) == reference["mixed scripts"].token_ids
    assert obj["text"] == reference["mixed scripts"].text


def test_subprocess_invalid_utf8_argument_is_a_clean_error(llama_profile):
    """argv bytes that are not UTF-8 reach Python as surrogate escapes: a usage error, like stdin's."""
    proc = spawn(b"generate", b"caf\xe9 \xff", b"-p", os.fsencode(llama_profile), b"-f", b"json")
    assert proc.returncode == 2 and proc.stdout == b"", proc.stderr
    assert_one_line_error(proc.stderr.decode("utf-8", "replace"), "UTF-8")
