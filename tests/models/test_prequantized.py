"""A checkpoint saved quantized (here torchao's int8 weight-only, serialized by transformers into
safetensors) loads as transformers loads it and keeps specdec's promises; asking to quantize it
again is a one-line error."""

from __future__ import annotations

import pytest
import torch

from profile_helpers import write_profile
from specdec_cli import Pipeline
from specdec_cli.decoding.transformers_generate import transformers_generate

pytest.importorskip("torchao")


@pytest.fixture(scope="module")
def int8_checkpoint(models_root, tokenizer):
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import AutoModelForCausalLM, TorchAoConfig

    from tiny_models import build_model, llama_config, save

    plain = save(build_model(llama_config(tokenizer, layers=2), seed=7), tokenizer, models_root / "prequant-plain")
    model = AutoModelForCausalLM.from_pretrained(plain, dtype=torch.float32,
                                                 quantization_config=TorchAoConfig(Int8WeightOnlyConfig()))
    folder = models_root / "prequant-int8"
    model.save_pretrained(folder)  # safetensors, with the torchao config in config.json
    tokenizer.save_pretrained(folder)
    return folder


def test_a_torchao_checkpoint_runs_as_stored_and_keeps_greedy_identity(tmp_path, int8_checkpoint):
    profile = write_profile(tmp_path, "pre", target={"model": str(int8_checkpoint), "dtype": "float32"},
                            drafter={"kind": "early-exit", "layers": 1}, device="cpu", chat=False)
    pipe = Pipeline.from_profile(str(profile))
    assert type(pipe.target.model.layers[0].mlp.up_proj.weight).__name__ == "Int8Tensor"
    ids = pipe.encode("def add(a, b): return a + b  # def add(a, b):")
    plain = pipe.generate(ids, decoder=pipe.decoder(drafter=None), max_new_tokens=20)
    reference = transformers_generate(pipe, ids, 20)
    assert list(plain.token_ids) == list(reference)
    for k in (1, 3, 5):
        assert pipe.generate(ids, decoder=pipe.decoder(k=k), max_new_tokens=20).token_ids == plain.token_ids


def test_quantizing_a_quantized_checkpoint_again_is_a_one_line_error(capsys, tmp_path, int8_checkpoint):
    from cli_helpers import assert_one_line_error, run_cli

    profile = write_profile(tmp_path, "again", target={"model": str(int8_checkpoint), "dtype": "float32", "quantize": "int4"},
                            drafter={"kind": "ngram"}, device="cpu", chat=False)
    code, _, err = run_cli(capsys, "generate", "hello", "-p", str(profile), "-n", "4")
    assert code == 2
    assert_one_line_error(err, "stored quantized already (torchao)", "remove quantize: int4")
