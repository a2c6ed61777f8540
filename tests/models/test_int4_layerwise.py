"""`quantize: int4` loaded a layer at a time (int4_layerwise.py): the model transformers'
from_pretrained would give, bit for bit, without ever holding the quantized layers' float weights;
with the packed cache warm, those weights are not even read; and a checkpoint this path does not
take still loads, through transformers."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import needs_kernels
from tiny_models import build_model, llama_config, qwen2_config, save, save_pickle_only

from specdec_cli.cache_dirs import cache_dir
from specdec_cli.kernels import int4_matmul
from specdec_cli.kernels.quantize import quantization_of
from specdec_cli.models import int4_layerwise, loading
from specdec_cli.models.loading import LoadOptions, load_model
from specdec_cli.models.stored_int4 import CheckpointReader
from specdec_cli.specs import ModelSpec

pytestmark = needs_kernels

CPU = LoadOptions(device=torch.device("cpu"))
IDS = torch.tensor([[5, 9, 14, 3, 27, 8, 40, 2]])


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def checkpoint(request, tmp_path_factory, tokenizer):
    """qwen2: biases on q/k/v and a head tied to the input embedding; llama: neither."""
    configs = {"qwen2": qwen2_config, "llama": llama_config}
    model = build_model(configs[request.param](tokenizer, layers=2, hidden=64), seed=3)
    return save(model, tokenizer, tmp_path_factory.mktemp(request.param) / "model")


def spec_for(folder, head: bool) -> ModelSpec:
    return ModelSpec(model=str(folder), dtype="float32", quantize="int4", group_size=32, quantize_head=head)


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.inference_mode():
        return model(IDS).logits


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """The checkpoint tensors read, by name."""
    seen = []
    get = CheckpointReader.get

    def counting(self, key):
        seen.append(key)
        return get(self, key)

    monkeypatch.setattr(CheckpointReader, "get", counting)
    return seen


@pytest.fixture
def layerwise_loads(monkeypatch) -> list:
    """What each call of the layer-at-a-time path returned (None: it stepped aside)."""
    returned = []
    load = loading.load_int4_layerwise

    def recording(*args):
        returned.append(load(*args))
        return returned[-1]

    monkeypatch.setattr(loading, "load_int4_layerwise", recording)
    return returned


@pytest.mark.parametrize("head", [False, True], ids=["head-float", "head-int4"])
def test_layerwise_gives_the_transformers_paths_model_and_bits(monkeypatch, checkpoint, layerwise_loads, head):
    layerwise = load_model(spec_for(checkpoint, head), CPU)
    assert len(layerwise_loads) == 1 and layerwise_loads[0] is not None
    with monkeypatch.context() as patch:
        patch.setattr(loading, "load_int4_layerwise", lambda *args: None)
        through_transformers = load_model(spec_for(checkpoint, head), CPU)
    assert [type(m).__name__ for m in layerwise.modules()] == [type(m).__name__ for m in through_transformers.modules()]
    assert quantization_of(layerwise) == quantization_of(through_transformers)
    assert layerwise.generation_config.eos_token_id == through_transformers.generation_config.eos_token_id
    assert torch.equal(logits(layerwise), logits(through_transformers))


def test_a_warm_cache_reads_no_quantized_weight_and_skips_from_pretrained(monkeypatch, checkpoint, reads):
    from transformers import AutoModelForCausalLM

    first = load_model(spec_for(checkpoint, True), CPU)  # packs, reading every weight once
    quantized = {key for key in reads if key.endswith("proj.weight")}
    assert quantized, reads
    reads.clear()

    def refuse(*args, **kwargs):
        raise AssertionError("from_pretrained ran: the whole float model was loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    second = load_model(spec_for(checkpoint, True), CPU)
    assert reads and not quantized & set(reads), reads
    assert torch.equal(logits(first), logits(second))


def test_a_pickle_only_checkpoint_still_loads_through_transformers(tmp_path, tokenizer, layerwise_loads):
    folder = save_pickle_only(build_model(llama_config(tokenizer, layers=1), seed=4), tokenizer, tmp_path / "bin")
    model = load_model(spec_for(folder, False), LoadOptions(device=torch.device("cpu"), allow_pickle=True))
    assert layerwise_loads == [None]  # no safetensors: the layer-at-a-time path stepped aside
    assert quantization_of(model) == "int4-g32" and isinstance(model.model.layers[0].mlp.up_proj, int4_matmul.Int4Linear)


def test_names_the_checkpoint_lacks_send_the_load_to_transformers(monkeypatch, checkpoint):
    monkeypatch.setattr(CheckpointReader, "keys", lambda self: [key for key in self.where if "layers.1." not in key])
    spec = spec_for(checkpoint, False)
    assert int4_layerwise.load_int4_layerwise(spec, str(checkpoint), torch.float32, torch.device("cpu"), cache_dir()) is None
