"""Quantized models (int8 through torchao; int4 on specdec's kernel where the CPU has AVX512-VNNI
or AVX2, else torchao): the profile keys, what the weights become, and greedy identity against the QUANTIZED
target's own decoding, eager and compiled."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from cli_helpers import assert_one_line_error, run_cli
from kernel_helpers import KERNELS_RUN, needs_kernels
from profile_helpers import write_profile
from tiny_models import build_model, llama_config, qwen2_config, save, save_pair
from specdec_cli import Pipeline
from specdec_cli.decoding.transformers_generate import transformers_generate
from specdec_cli.errors import ProfileError, UsageError
from specdec_cli.kernels.int4_matmul import Int4Linear
from specdec_cli.profile import parse_profile, profile_to_dict, with_overrides

pytest.importorskip("torchao")

PROMPTS = ["def add(a, b):", "The quick brown fox"]
GROUP = 32  # divides the tiny models' widths (hidden 64, MLP 128); int4's default 128 does not


@pytest.fixture(scope="session")
def quant_models(models_root, tokenizer) -> dict[str, dict[str, object]]:
    """A Llama (untied head) and a Qwen2 (q/k/v biases, tied head), each with a noisy-copy draft;
    "qwen2-1": a one-layer Qwen2 pair for the compiled tests (compiling costs seconds a layer)."""
    pairs = {}
    for arch, config in (("llama", llama_config(tokenizer, layers=3)), ("qwen2", qwen2_config(tokenizer, layers=3)),
                         ("qwen2-1", qwen2_config(tokenizer, layers=1))):
        pairs[arch] = save_pair(build_model(config, seed=31), tokenizer, models_root, f"quant-{arch}", noise=0.02, seed=32)
    return pairs


def quant_profile(tmp_path, pair, method: str, draft_method: str = "none", dtype: str = "float32", **fields):
    """Target in `method`, draft in `draft_method`. float32 by default, as the rest of the suite: in
    bfloat16 a verify of several tokens can flip a near-tie that a 1-token forward resolves the
    other way (measured here: a 1-ulp top-2 margin), which is not what these tests look for."""
    target = {"model": str(pair["target"]), "dtype": dtype, "quantize": method}
    draft = {"kind": "model", "model": str(pair["draft"]), "dtype": dtype, "quantize": draft_method}
    for spec, chosen in ((target, method), (draft, draft_method)):
        if chosen == "int4":
            spec["group_size"] = GROUP
    return write_profile(tmp_path, target=target, drafter=draft, device="cpu", **fields)


# --------------------------------------------------------------------------- profile keys


def parsed(target: dict, drafter: dict | None = None):
    data = {"target": {"model": "m", **target}, "drafter": drafter or {"kind": "ngram"}}
    return parse_profile(data, "p.yaml")


def test_profile_keys_parse_and_dump():
    profile = parsed({"quantize": "int4"}, {"kind": "model", "model": "d", "quantize": "int8"})
    assert (profile.target.quantize, profile.target.group_size) == ("int4", 128)  # int4's default group
    assert (profile.drafter.model.quantize, profile.drafter.model.group_size) == ("int8", None)
    assert parsed({"quantize": "int4", "group_size": 32}).target.group_size == 32
    assert parsed({}).target.quantize == "none" and parsed({"quantize": None}).target.quantize == "none"
    dumped = profile_to_dict(profile)
    assert dumped["target"]["quantize"] == "int4" and dumped["target"]["group_size"] == 128
    assert dumped["drafter"]["quantize"] == "int8"
    assert parse_profile(dumped, "again.yaml").target == profile.target  # what `profiles show` writes reads back


@pytest.mark.parametrize("target, fragment", [
    ({"quantize": "in4"}, "target.quantize: 'in4' is not one of none, int8, int4 (did you mean int4?)"),
    ({"quantize": "int4", "group_size": 100}, "target.group_size: 100 is not one of 32, 64, 128"),
    ({"quantize": "int4", "group_size": "64"}, "target.group_size: '64' is not an integer"),
    ({"quantize": "int8", "group_size": 64}, "target.group_size: goes with quantize: int4 only"),
    ({"group_size": 64}, "target.group_size: goes with quantize: int4 only"),
    ({"quantize": "int8", "quantize_head": True}, "target.quantize_head: goes with quantize: int4 (or a GPTQ/AWQ int4 checkpoint) only"),
    ({"quantize": "int4", "quantize_head": "yes"}, "target.quantize_head: 'yes' is not"),
])
def test_bad_profile_values_give_one_line_errors(target, fragment):
    with pytest.raises(ProfileError) as caught:
        parsed(target)
    assert str(caught.value).startswith(f"p.yaml: {fragment}")
    assert "\n" not in str(caught.value)


def test_quantize_head_parses_dumps_and_follows_the_command_line():
    profile = parsed({"quantize": "int4", "quantize_head": True})
    assert profile.target.quantize_head and parsed({"quantize": "int4"}).target.quantize_head is False
    assert parse_profile(profile_to_dict(profile), "again.yaml").target == profile.target
    assert with_overrides(profile, quantize="int8").target.quantize_head is False  # int4's key only


def test_quantize_head_refuses_a_drafter_that_reads_the_head():
    with pytest.raises(ProfileError, match="target.quantize_head: a medusa drafter reads the target's output head"):
        parsed({"quantize": "int4", "quantize_head": True}, {"kind": "medusa", "heads": "h"})


def test_bad_drafter_quantize_names_the_drafter_key():
    with pytest.raises(ProfileError, match=r"drafter\.quantize: 'int16' is not one of"):
        parsed({}, {"kind": "model", "model": "d", "quantize": "int16"})
    with pytest.raises(ProfileError, match=r"drafter\.quantise: unknown key \(did you mean quantize\?\)"):
        parsed({}, {"kind": "model", "model": "d", "quantise": "int8"})


def test_the_command_line_quantizes_the_target_only():
    profile = parsed({"quantize": "int4", "group_size": 64}, {"kind": "model", "model": "d", "quantize": "int8"})
    assert with_overrides(profile, quantize="int8").target.group_size is None
    assert with_overrides(with_overrides(profile, quantize="none"), quantize="int4").target.group_size == 128
    assert with_overrides(profile, quantize="int4").target.group_size == 64
    assert with_overrides(profile, quantize="none").drafter.model.quantize == "int8"
    with pytest.raises(ProfileError, match="--quantize: 'int5' is not one of none, int8, int4"):
        with_overrides(profile, quantize="int5")


def test_bad_values_exit_2_through_the_cli_process(tmp_path, quant_models):
    """A new process, as a user runs it: exit 2, one line, no traceback, before any model loads."""
    bad = write_profile(tmp_path, "bad", target={"model": "m", "quantize": "int8", "group_size": 32},
                        drafter={"kind": "ngram"})
    runs = [
        ["profiles", "show", str(bad)],
        ["generate", "hi", "-p", str(quant_profile(tmp_path, quant_models["llama"], "none")), "--quantize", "int5"],
    ]
    for args in runs:
        done = subprocess.run([sys.executable, "-m", "specdec_cli", *args], capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, (args, done.stderr)
        assert_one_line_error(done.stderr, "group_size: goes with quantize: int4 only" if args[0] == "profiles" else "--quantize")


# --------------------------------------------------------------------------- the weights


def test_group_size_must_divide_every_layer(tmp_path, quant_models):
    """torchao would leave such a layer unquantized without a word: refused, naming the layer."""
    path = quant_profile(tmp_path, quant_models["llama"], "none")
    with pytest.raises(UsageError, match="group_size: 128 does not divide the 64 inputs of layer model.layers.0"):
        Pipeline.from_profile(str(path), quantize="int4")


def held_as(module: torch.nn.Module) -> str:
    """How a layer's weights are held: specdec's int4 layer, or the type of a Linear's weight."""
    return type(module).__name__ if type(module).__name__ == "Int4Linear" else type(module.weight).__name__


INT4_HELD = "Int4Linear" if KERNELS_RUN else "Int4OpaqueTensor"


@pytest.mark.parametrize("method, kernel, held", [
    ("int8", "auto", "Int8Tensor"), ("int4", "auto", INT4_HELD), ("int4", "torchao", "Int4OpaqueTensor"),
])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_every_linear_but_the_head_is_quantized(monkeypatch, tmp_path, quant_models, arch, method, kernel, held):
    monkeypatch.setenv("SPECDEC_INT4_KERNEL", kernel)
    pipe = Pipeline.from_profile(str(quant_profile(tmp_path, quant_models[arch], method, draft_method=method)))
    for model in (pipe.target, pipe.load_draft_model(pipe.profile.drafter.model)):
        head = model.get_output_embeddings()
        layers = [m for m in model.modules()
                  if isinstance(m, (torch.nn.Linear, Int4Linear)) and m is not head]
        assert layers and all(held_as(m) == held for m in layers)
        assert type(head.weight) is torch.nn.Parameter  # a plain tensor: full precision
        assert type(model.get_input_embeddings().weight) is torch.nn.Parameter


def head_profile(tmp_path, quant_models):
    pair = quant_models["qwen2"]  # a tied head
    return write_profile(tmp_path, target={"model": str(pair["target"]), "dtype": "float32", "quantize": "int4",
                                           "group_size": GROUP, "quantize_head": True},
                         drafter={"kind": "model", "model": str(pair["draft"]), "dtype": "float32"}, device="cpu")


def test_quantize_head_takes_the_head_too(monkeypatch, tmp_path, quant_models):
    """The head in int4, untied from the input embedding (which stays full precision); torchao's
    weight-only kernel here: greedy identity holds against this model's own decoding."""
    monkeypatch.setenv("SPECDEC_INT4_KERNEL", "torchao")
    pipe = Pipeline.from_profile(str(head_profile(tmp_path, quant_models)))
    assert held_as(pipe.target.get_output_embeddings()) == "Int4OpaqueTensor"
    assert type(pipe.target.get_input_embeddings().weight) is torch.nn.Parameter
    check_greedy_identity(pipe, ks=(3,), new_tokens=16)


@needs_kernels
def test_quantize_head_on_specdecs_kernel_differs_only_at_near_ties(tmp_path, quant_models):
    """With int8 activations a logit is a step function of the hidden state: the last-bit
    differences float32 attention makes between a 4-token verify and 1-token steps can move an
    activation across a rounding step, as bfloat16 does for any model. So, as for bfloat16:
    specdec's text is plain decoding's, or the first difference sits at a near-tie of the target."""
    pipe = Pipeline.from_profile(str(head_profile(tmp_path, quant_models)))
    assert held_as(pipe.target.get_output_embeddings()) == "Int4Linear"
    for prompt in PROMPTS:
        ids = pipe.encode(prompt, chat=False)
        plain = pipe.generate(ids, decoder=pipe.decoder(drafter=None), max_new_tokens=24).token_ids
        assert plain == transformers_generate(pipe, ids, 24)
        spec = pipe.generate(ids, decoder=pipe.decoder(k=3), max_new_tokens=24).token_ids
        first = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
        if first is not None:
            with torch.no_grad():
                logits = pipe.target(torch.tensor([ids + list(plain[:first])])).logits[0, -1]
            top = logits.topk(2).values
            assert (top[0] - top[1]).item() < 0.01 * logits.abs().max().item(), (prompt, first)


def test_int4_on_torchao_loads_in_bfloat16_under_dtype_auto(monkeypatch, tmp_path, quant_models):
    """bfloat16 is the one dtype torchao's CPU kernel vectorizes; an explicit float32 is kept."""
    monkeypatch.setenv("SPECDEC_INT4_KERNEL", "torchao")
    auto = Pipeline.from_profile(str(quant_profile(tmp_path, quant_models["llama"], "int4", dtype="auto")))
    assert auto.target.dtype == torch.bfloat16
    explicit = Pipeline.from_profile(str(quant_profile(tmp_path, quant_models["llama"], "int4", dtype="float32")))
    assert explicit.target.dtype == torch.float32


@needs_kernels
def test_int4_on_specdecs_kernel_keeps_dtype_auto_and_needs_no_torchao(monkeypatch, tmp_path, quant_models):
    plain = Pipeline.from_profile(str(quant_profile(tmp_path, quant_models["llama"], "none", dtype="auto")))
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)  # as if it were not installed
    int4 = Pipeline.from_profile(str(quant_profile(tmp_path, quant_models["llama"], "int4", dtype="auto")))
    assert int4.target.dtype == plain.target.dtype
    ids = int4.encode(PROMPTS[0], chat=False)
    assert int4.generate(ids, decoder=int4.decoder(drafter=None), max_new_tokens=4).token_ids


def test_without_torchao_the_error_says_how_to_install_it(monkeypatch, quant_models):
    from transformers import AutoModelForCausalLM

    from specdec_cli.kernels.quantize import quantize_model

    model = AutoModelForCausalLM.from_pretrained(str(quant_models["llama"]["target"]))
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)  # as if it were not installed
    with pytest.raises(UsageError) as caught:
        quantize_model(model, "int8", GROUP)
    assert str(caught.value) == "quantize: int8 needs torchao: pip install 'specdec-cli[quant]'"


def test_stored_bytes_count_the_packed_weights(tmp_path, quant_models):
    """What compile: auto's prior reads a step's bytes from: int4 holds fewer than int8, int8 fewer than none."""
    from specdec_cli.kernels.quantize import stored_bytes

    sizes = [stored_bytes(Pipeline.from_profile(str(quant_profile(tmp_path, quant_models["qwen2"], m))).target)
             for m in ("none", "int8", "int4")]
    assert sizes[0] > sizes[1] > sizes[2]


# --------------------------------------------------------------------------- greedy identity


def check_greedy_identity(pipe: Pipeline, ks=(1, 3, 6), new_tokens: int = 24) -> None:
    """specdec with a model draft == the quantized target's own greedy decoding (transformers'
    generate on the same quantized model), for every k; the drafts were really used."""
    accepted = 0
    for prompt in PROMPTS:
        ids = pipe.encode(prompt, chat=False)
        expected = transformers_generate(pipe, ids, new_tokens)
        for k in ks:
            result = pipe.generate(ids, decoder=pipe.decoder(k=k), max_new_tokens=new_tokens)
            assert result.token_ids == expected, (prompt, k)
            accepted += result.stats.accepted
        plain = pipe.generate(ids, decoder=pipe.decoder(drafter=None), max_new_tokens=new_tokens)
        assert plain.token_ids == expected, prompt
    assert accepted > 0


@pytest.mark.parametrize("method, draft_method", [("int8", "none"), ("int4", "int8"), ("int4", "int4")])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_identity_with_a_quantized_target_eager(tmp_path, quant_models, arch, method, draft_method):
    check_greedy_identity(Pipeline.from_profile(str(quant_profile(tmp_path, quant_models[arch], method, draft_method))))


def test_greedy_identity_with_torchaos_int4_kernel(monkeypatch, tmp_path, quant_models):
    """Where specdec's kernel does not run (no AVX512-VNNI or AVX2, or SPECDEC_INT4_KERNEL=torchao)."""
    monkeypatch.setenv("SPECDEC_INT4_KERNEL", "torchao")
    check_greedy_identity(Pipeline.from_profile(str(quant_profile(tmp_path, quant_models["qwen2"], "int4", "int4"))))


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_sampling_with_a_seed_is_the_quantized_targets_own(tmp_path, quant_models, method):
    """At temperature 1 a seed fixes the text whatever k is (sampling keyed by position): specdec
    with a quantized draft draws exactly what the quantized target's plain decoding draws."""
    from specdec_cli.specs import SamplingSpec

    pipe = Pipeline.from_profile(str(quant_profile(tmp_path, quant_models["qwen2"], method, draft_method="int8")))
    sampling = SamplingSpec(temperature=1.0, top_k=0, top_p=1.0)
    accepted = 0
    for seed in (1, 2, 3):
        ids = pipe.encode(PROMPTS[seed % 2], chat=False)
        plain = pipe.generate(ids, decoder=pipe.decoder(drafter=None), max_new_tokens=20, sampling=sampling, seed=seed)
        for k in (2, 5):
            result = pipe.generate(ids, decoder=pipe.decoder(k=k), max_new_tokens=20, sampling=sampling, seed=seed)
            assert result.token_ids == plain.token_ids, (seed, k)
            accepted += result.stats.accepted
    assert accepted > 0


# one pair (each compiled case costs seconds a layer): the int4 target at every verify width, an int8 draft
@pytest.mark.parametrize("arch, method, draft_method", [("qwen2-1", "int4", "int8")])
def test_greedy_identity_with_a_quantized_target_compiled(tmp_path, quant_models, arch, method, draft_method):
    """The compiled static loop over the quantized layers (frozen into the graph): both
    the target and the draft compile, and the tokens stay the quantized target's."""
    pipe = Pipeline.from_profile(str(quant_profile(tmp_path, quant_models[arch], method, draft_method, compile="on")))
    assert pipe.compile == "on"
    decoder = pipe.decoder(k=3)
    assert type(decoder.lm).__name__ == type(decoder.drafter.lm).__name__ == "StaticLM"
    pipe.generate(PROMPTS[0], decoder=decoder, max_new_tokens=16, chat=False)
    assert decoder.lm.compile_seconds > 0 and decoder.drafter.lm.compile_seconds > 0  # compiled, not eager
    check_greedy_identity(pipe, ks=(3,), new_tokens=16)


def test_compile_costs_are_kept_apart_from_the_unquantized_model(tmp_path, quant_models):
    from specdec_cli.runtime.compile_choice import cost_key

    plain = Pipeline.from_profile(str(quant_profile(tmp_path, quant_models["llama"], "none")))
    int4 = Pipeline.from_profile(str(quant_profile(tmp_path, quant_models["llama"], "int4")))
    int8 = Pipeline.from_profile(str(quant_profile(tmp_path, quant_models["llama"], "int8")))
    keys = {cost_key(p.target, torch.device("cpu")) for p in (plain, int4, int8)}
    assert len(keys) == 3 and any(f"int4-g{GROUP}" in key for key in keys)


# --------------------------------------------------------------------------- the command


def test_generate_quantize_int4_through_the_cli_process(tmp_path, models_root, tokenizer):
    """`specdec generate --quantize int4` (default group 128: a model 128 wide): text, exit 0, and
    nothing on stderr but the run's summary line (torchao's import-time warnings are quieted)."""
    target = save(build_model(qwen2_config(tokenizer, layers=2, hidden=128), seed=33), tokenizer, models_root / "quant-wide")
    path = write_profile(tmp_path, target={"model": str(target), "dtype": "auto"}, drafter={"kind": "ngram"}, device="cpu")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "specdec_cli", "generate", "def add(a, b):", "-p", str(path), "--quantize", "int4",
         "-f", "text", "-n", "8", "--no-chat"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    # besides the summary, only the once-only notices: the kernel's build and the weights' packing
    lines = [line for line in done.stderr.splitlines()
             if not line.startswith(("specdec: building specdec's CPU kernels", "specdec: packing "))]
    assert len(lines) == 1 and lines[0].startswith("8 tokens in "), done.stderr


def test_generate_refuses_a_group_that_does_not_divide(capsys, tmp_path, quant_models):
    path = quant_profile(tmp_path, quant_models["llama"], "none", dtype="auto")
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(path), "--quantize", "int4", "-f", "text")
    assert code == 2
    assert_one_line_error(err, "group_size: 128 does not divide")


# --------------------------------------------------------------------------- what quantization costs


def test_compare_tokens_counts_equal_positions_and_the_first_difference():
    from specdec_cli.bench.quant_drift import compare_tokens

    assert compare_tokens((1, 2, 3), (1, 2, 3)) == (3, 3, None)
    assert compare_tokens((1, 2, 3, 4), (1, 9, 3, 4)) == (3, 4, 1)
    assert compare_tokens((1, 2, 3), (1, 2)) == (2, 3, 2)  # one text stopped early (an EOS)


def test_bench_reports_the_drift_from_the_unquantized_model(capsys, tmp_path, quant_models):
    """`bench` on a quantized target compares its greedy text with the unquantized model's, after
    the timed runs: the figures equal a comparison made here by hand; --no-drift leaves it out."""
    import json

    path = quant_profile(tmp_path, quant_models["llama"], "int4", draft_method="int8")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\nThe quick brown fox\n", encoding="utf-8")
    args = ["bench", "-p", str(path), "--prompts", str(prompts), "--methods", "plain,specdec", "-n", "16",
            "--repeats", "1", "--warmup", "0"]
    code, out, err = run_cli(capsys, *args, "-f", "json")
    assert code == 0, err
    drift = json.loads(out)["quantization_drift"]
    assert "comparing the quantized target's greedy text with the unquantized model's" in err

    from specdec_cli.bench.quant_drift import compare_tokens

    quantized = Pipeline.from_profile(str(path))
    (tmp_path / "unquantized").mkdir()  # a profile file of its own: `path` is run again below
    unquantized = Pipeline.from_profile(str(quant_profile(tmp_path / "unquantized", quant_models["llama"], "none")))
    compared = []
    for text in ("def add(a, b):", "The quick brown fox"):
        ids = quantized.encode(text)  # as bench encodes a prompt (chat: auto)
        got = quantized.generate(ids, decoder=quantized.decoder(drafter=None), max_new_tokens=16).token_ids
        compared.append(compare_tokens(transformers_generate(unquantized, ids, 16), got))
    assert drift["prompts"] == 2 and drift["quantization"] == f"int4-g{GROUP}"
    assert drift["first_differences"] == [first for _, _, first in compared]
    assert drift["identical_token_share"] == pytest.approx(sum(e for e, _, _ in compared) / sum(n for _, n, _ in compared))

    code, out, _ = run_cli(capsys, *args)
    shown = " ".join(out.split())  # the table wraps long lines at the terminal's width
    assert code == 0 and f"quantization (int4-g{GROUP}) against the unquantized, float32 model:" in shown
    code, out, _ = run_cli(capsys, *args, "--no-drift", "-f", "json")
    assert code == 0 and json.loads(out)["quantization_drift"] is None


def test_verify_reports_the_drift_beside_its_checks(capsys, tmp_path, quant_models):
    import json

    path = quant_profile(tmp_path, quant_models["qwen2"], "int4", draft_method="int4")
    code, out, err = run_cli(capsys, "verify", "-p", str(path), "--samples", "0", "--limit", "2", "-n", "12", "-f", "json")
    assert code == 0, err
    report = json.loads(out)
    drift = report["quantization_drift"]
    assert report["passed"] and drift["prompts"] == 2 and len(drift["first_differences"]) == 2
    assert 0.0 <= drift["identical_token_share"] <= 1.0
