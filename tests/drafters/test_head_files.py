"""Draft-head checkpoints: the layouts written are the published ones, every published layout loads
through a profile, and damaged, foreign or pickled checkpoints are refused in one line."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from cli_helpers import assert_one_line_error, run_cli
from head_checkpoints import DRAFT_VOCAB, EAGLE1_KEYS, EAGLE3_KEYS, PROMPTS, drafter_for, eagle_config, head_pipeline, medusa_keys, one_thread, random_tensors, write_head  # noqa: F401 (one_thread: autouse)
from profile_helpers import model_profile
from specdec_cli import Pipeline
from specdec_cli.decoding.transformers_generate import transformers_generate


# --------------------------------------------------------------------------- the layouts written are the published ones


def test_head_files_hold_the_published_tensor_names(heads):
    from safetensors import safe_open

    def keys(kind, name):
        with safe_open(str(heads["folders"][kind] / name), "pt") as handle:
            return set(handle.keys())

    assert keys("medusa", "medusa_lm_head.safetensors") == medusa_keys(3, 1, own_lm_heads=False)
    assert keys("medusa-own", "medusa_lm_head.safetensors") == medusa_keys(3, 1, own_lm_heads=True)
    assert keys("eagle", "model.safetensors") == EAGLE1_KEYS
    assert keys("eagle3", "model.safetensors") == EAGLE3_KEYS
    eagle3 = heads["tensors"]["eagle3"]
    hidden = heads["target"].config.hidden_size
    assert tuple(eagle3["fc.weight"].shape) == (hidden, 3 * hidden)
    assert tuple(eagle3["midlayer.self_attn.q_proj.weight"].shape) == (hidden, 2 * hidden)
    assert tuple(eagle3["lm_head.weight"].shape) == (DRAFT_VOCAB, hidden)
    assert tuple(heads["tensors"]["eagle"]["fc.weight"].shape) == (hidden, 2 * hidden)
    assert eagle3["d2t"].dtype == torch.long and bool(eagle3["d2t"].ne(0).any())  # a non-trivial map


# --------------------------------------------------------------------------- loading: every published layout


def loaded_tensors(pipe: Pipeline) -> dict[str, torch.Tensor]:
    drafter = pipe.drafter
    module = drafter.heads.heads if hasattr(drafter, "heads") else drafter.lm.model
    return module.state_dict()


def layout_variant(heads, name: str, root: Path) -> tuple[str, Path, dict, dict]:
    """(kind, folder, the tensors the loader must hold, extra profile fields) of one published variant."""
    tensors = heads["tensors"]
    target = heads["target"]
    folder = root / name.replace(" ", "-")
    medusa_config = {"medusa_num_heads": 3, "medusa_num_layers": 1}
    if name == "medusa-2 (the target's LM head)":
        return "medusa", heads["folders"]["medusa"], tensors["medusa"], {}
    if name == "medusa original (own LM heads, config understating its heads)":
        # the published vicuna-7b config says 2 heads while its file holds more: count the weights
        write_head(folder, {**medusa_config, "medusa_num_heads": 2}, tensors["medusa-own"], "medusa_lm_head.safetensors")
        return "medusa-own", folder, tensors["medusa-own"], {}
    if name == "medusa, two ResBlocks per head and own LM heads at {h}.2":
        state = {}
        for key, value in tensors["medusa-own"].items():
            h, layer, rest = key.split(".", 2)
            if layer == "1":  # the LM head moves behind the second block
                state[f"{h}.2.{rest}"] = value
            else:
                state[key] = value
                state[f"{h}.1.{rest}"] = torch.zeros_like(value)  # a zero block is the identity
        write_head(folder, {**medusa_config, "medusa_num_layers": 2}, state, "medusa_lm_head.safetensors")
        return "medusa", folder, state, {}
    if name == "medusa pickle (medusa_lm_head.pt), allow_pickle":
        write_head(folder, medusa_config, tensors["medusa-own"], "medusa_lm_head.pt")
        return "medusa-own", folder, tensors["medusa-own"], {"allow_pickle": True}
    if name == "eagle-1 with the target's embed_tokens and a bias key":
        state = {**tensors["eagle"], "embed_tokens.weight": target.get_input_embeddings().weight.detach()}
        write_head(folder, eagle_config(target, "eagle", bias=True), state, "model.safetensors")
        return "eagle", folder, tensors["eagle"], {}
    if name == "eagle-1 pickle (pytorch_model.bin), allow_pickle":
        write_head(folder, eagle_config(target, "eagle"), tensors["eagle"], "pytorch_model.bin")
        return "eagle", folder, tensors["eagle"], {"allow_pickle": True}
    if name == "eagle-3":
        return "eagle3", heads["folders"]["eagle3"], tensors["eagle3"], {}
    if name == "eagle-3 with d2t only (no t2d)":
        state = {k: v for k, v in tensors["eagle3"].items() if k != "t2d"}
        write_head(folder, eagle_config(target, "eagle3"), state, "model.safetensors")
        return "eagle3", folder, state, {}
    raise KeyError(name)


LAYOUTS = [
    "medusa-2 (the target's LM head)",
    "medusa original (own LM heads, config understating its heads)",
    "medusa, two ResBlocks per head and own LM heads at {h}.2",
    "medusa pickle (medusa_lm_head.pt), allow_pickle",
    "eagle-1 with the target's embed_tokens and a bias key",
    "eagle-1 pickle (pytorch_model.bin), allow_pickle",
    "eagle-3",
    "eagle-3 with d2t only (no t2d)",
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_published_layouts_load_through_the_profile(tmp_path, llama_pair, heads, layout):
    kind, folder, expected, fields = layout_variant(heads, layout, tmp_path / "heads")
    pipe = head_pipeline(tmp_path, llama_pair, kind, folder, **fields)
    held = loaded_tensors(pipe)
    for key, value in expected.items():
        assert key in held, key
        assert torch.equal(held[key].cpu(), value.to(held[key].dtype)), key  # every tensor, biases included
    ids = pipe.encode(PROMPTS[0])
    result = pipe.generate(ids, max_new_tokens=16)
    assert result.token_ids == transformers_generate(pipe, ids, 16)
    assert result.stats.accepted >= 8  # the fitted weights are the ones that draft


# --------------------------------------------------------------------------- loading: clean refusals


def cli_refuses(capsys, tmp_path, pair, kind: str, folder: Path, *fragments: str, **fields) -> str:
    profile = model_profile(tmp_path, pair, name="refused", drafter=drafter_for(kind, folder), **fields)
    code, out, err = run_cli(capsys, "generate", "hi", "-p", str(profile))
    assert code == 2 and out == "", (code, out, err)
    assert_one_line_error(err, *fragments)
    return err


def copy_head(heads, kind: str, folder: Path) -> Path:
    import shutil

    shutil.copytree(heads["folders"][kind], folder)
    return folder


def damage(heads, case: str, root: Path) -> tuple[str, Path, tuple[str, ...]]:
    """(kind, folder, what the one-line error must name) for a damaged checkpoint."""
    target = heads["target"]
    folder = root / case.replace(" ", "-").replace("/", "-")
    if case == "truncated model.safetensors":
        copy_head(heads, "eagle", folder)
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        return "eagle", folder, (str(weights), "damaged")
    if case == "truncated medusa_lm_head.safetensors":
        copy_head(heads, "medusa", folder)
        weights = folder / "medusa_lm_head.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
        return "medusa", folder, (str(weights), "damaged")
    if case == "a tensor missing":
        state = {k: v for k, v in heads["tensors"]["eagle3"].items() if k != "midlayer.mlp.down_proj.weight"}
        write_head(folder, eagle_config(target, "eagle3"), state, "model.safetensors")
        return "eagle3", folder, (str(folder), "midlayer.mlp.down_proj.weight")
    if case == "a medusa head's bias missing":
        state = {k: v for k, v in heads["tensors"]["medusa"].items() if k != "2.0.linear.bias"}
        write_head(folder, {"medusa_num_heads": 3, "medusa_num_layers": 1}, state, "medusa_lm_head.safetensors")
        return "medusa", folder, (str(folder), "2.0.linear.bias")
    if case == "a tensor of the wrong shape":
        state = {**heads["tensors"]["eagle"], "fc.weight": torch.zeros(64, 100)}
        write_head(folder, eagle_config(target, "eagle"), state, "model.safetensors")
        return "eagle", folder, (str(folder), "fc.weight")
    if case == "config.json not JSON":
        copy_head(heads, "eagle3", folder)
        (folder / "config.json").write_text('{"hidden_size": 64,,')
        return "eagle3", folder, (str(folder / "config.json"),)
    if case == "config.json binary":
        copy_head(heads, "medusa", folder)
        (folder / "config.json").write_bytes(b"\xff\xfe\x00garbage")
        return "medusa", folder, (str(folder / "config.json"),)
    if case == "no weights file":
        copy_head(heads, "eagle", folder)
        (folder / "model.safetensors").unlink()
        return "eagle", folder, (str(folder), "model.safetensors")
    if case == "d2t outside the target's vocabulary":
        state = {**heads["tensors"]["eagle3"], "d2t": heads["tensors"]["eagle3"]["d2t"] + 1000}
        write_head(folder, eagle_config(target, "eagle3"), state, "model.safetensors")
        return "eagle3", folder, (str(folder), "d2t")
    if case == "draft_ids outside the target's vocabulary":
        state = {**heads["tensors"]["medusa-vocab"]}
        state["draft_ids"] = state["draft_ids"] + 1000
        write_head(folder, {"medusa_num_heads": 3, "medusa_num_layers": 1}, state, "medusa_lm_head.safetensors")
        return "medusa", folder, (str(folder), "draft_ids")
    raise KeyError(case)


DAMAGE = [
    "truncated model.safetensors",
    "truncated medusa_lm_head.safetensors",
    "a tensor missing",
    "a medusa head's bias missing",
    "a tensor of the wrong shape",
    "config.json not JSON",
    "config.json binary",
    "no weights file",
    "d2t outside the target's vocabulary",
    "draft_ids outside the target's vocabulary",
]


@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_head_checkpoint_is_a_one_line_error(capsys, tmp_path, llama_pair, heads, case):
    kind, folder, fragments = damage(heads, case, tmp_path / "damaged")
    cli_refuses(capsys, tmp_path, llama_pair, kind, folder, *fragments)


def test_a_damaged_head_checkpoint_in_a_real_process(tmp_path, llama_pair, heads):
    """The same as a process (`specdec generate -p PROFILE hi`): exit 2, one line, nothing else on stderr."""
    import subprocess
    import sys

    kind, folder, fragments = damage(heads, "truncated model.safetensors", tmp_path / "damaged")
    profile = model_profile(tmp_path, llama_pair, name="refused", drafter=drafter_for(kind, folder))
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "specdec_cli", "generate", "-p", str(profile), "hi"], cwd=repo,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout, proc.stderr)
    assert_one_line_error(proc.stderr, *fragments)


def foreign(heads, case: str, root: Path) -> tuple[str, Path, tuple[str, ...]]:
    """(kind, folder, fragments) of a head made for another target."""
    target = heads["target"]
    generator = torch.Generator().manual_seed(5)
    vocab = target.config.vocab_size
    folder = root / case.replace(" ", "-")
    if case == "medusa for hidden size 32":
        write_head(folder, {"medusa_num_heads": 2, "medusa_num_layers": 1},
                   random_tensors("medusa", 32, vocab, generator=generator, heads=2), "medusa_lm_head.safetensors")
        return "medusa", folder, (str(folder), "hidden size 32", "64")
    if case == "eagle-1 for hidden size 32":
        config = {**eagle_config(target, "eagle"), "hidden_size": 32, "intermediate_size": 64, "head_dim": 8}
        write_head(folder, config, random_tensors("eagle", 32, vocab, generator=generator), "model.safetensors")
        return "eagle", folder, (str(folder), "hidden size 32", "64")
    if case == "eagle-3 for hidden size 32":
        config = {**eagle_config(target, "eagle3"), "hidden_size": 32, "intermediate_size": 64, "head_dim": 8}
        write_head(folder, config, random_tensors("eagle3", 32, vocab, generator=generator, draft_vocab=DRAFT_VOCAB), "model.safetensors")
        return "eagle3", folder, (str(folder), "hidden size 32", "64")
    if case == "medusa LM heads for 400 tokens":
        write_head(folder, {"medusa_num_heads": 2, "medusa_num_layers": 1},
                   random_tensors("medusa", 64, 400, generator=generator, heads=2, own_lm_heads=True), "medusa_lm_head.safetensors")
        return "medusa", folder, (str(folder), "vocabulary size 400", str(vocab))
    if case == "eagle-3 for 400 tokens":
        config = {**eagle_config(target, "eagle3"), "vocab_size": 400}
        write_head(folder, config, random_tensors("eagle3", 64, 400, generator=generator, draft_vocab=DRAFT_VOCAB), "model.safetensors")
        return "eagle3", folder, (str(folder), "vocabulary size 400", str(vocab))
    if case == "eagle-1 for 400 tokens":
        config = {**eagle_config(target, "eagle"), "vocab_size": 400}
        write_head(folder, config, heads["tensors"]["eagle"], "model.safetensors")
        return "eagle", folder, (str(folder), "vocabulary size 400", str(vocab))
    if case == "trained for a 12-layer target (specdec block)":
        recorded_for(heads, "medusa", folder, model_type="llama", hidden_size=64, num_hidden_layers=12, vocab_size=vocab)
        return "medusa", folder, (str(folder), "num_hidden_layers 12", "4")
    if case == "trained for a qwen2 target (specdec block)":
        recorded_for(heads, "eagle3", folder, model_type="qwen2", hidden_size=64, num_hidden_layers=4, vocab_size=vocab)
        return "eagle3", folder, (str(folder), "model_type qwen2", "llama")
    raise KeyError(case)


def recorded_for(heads, kind: str, folder: Path, **target) -> None:
    """A copy of a good head whose config says (as train-draft writes) it was trained for `target`."""
    copy_head(heads, kind, folder)
    config = json.loads((folder / "config.json").read_text())
    config["specdec"] = {"target": target}
    (folder / "config.json").write_text(json.dumps(config))


FOREIGN = [
    "medusa for hidden size 32",
    "eagle-1 for hidden size 32",
    "eagle-3 for hidden size 32",
    "medusa LM heads for 400 tokens",
    "eagle-3 for 400 tokens",
    "eagle-1 for 400 tokens",
    "trained for a 12-layer target (specdec block)",
    "trained for a qwen2 target (specdec block)",
]


@pytest.mark.parametrize("case", FOREIGN)
def test_a_head_for_another_target_is_refused_before_the_first_token(capsys, tmp_path, llama_pair, heads, case):
    kind, folder, fragments = foreign(heads, case, tmp_path / "foreign")
    cli_refuses(capsys, tmp_path, llama_pair, kind, folder, *fragments)


def test_a_head_of_the_other_kind_is_refused(capsys, tmp_path, llama_pair, heads):
    cli_refuses(capsys, tmp_path, llama_pair, "medusa", heads["folders"]["eagle"], str(heads["folders"]["eagle"]), "kind: eagle")
    cli_refuses(capsys, tmp_path, llama_pair, "eagle", heads["folders"]["medusa"], str(heads["folders"]["medusa"]), "kind: medusa")


class RunsCode:
    """Unpickling this calls os.system: a weights-only loader must refuse it."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickled_head_is_refused_without_allow_pickle(capsys, tmp_path, llama_pair, heads):
    """(Allowed, it loads: test_published_layouts_load_through_the_profile.)"""
    folder = tmp_path / "pickled"
    write_head(folder, {"medusa_num_heads": 3, "medusa_num_layers": 1}, heads["tensors"]["medusa"], "medusa_lm_head.pt")
    cli_refuses(capsys, tmp_path, llama_pair, "medusa", folder, str(folder / "medusa_lm_head.pt"), "allow_pickle")
    eagle = tmp_path / "pickled-eagle"
    write_head(eagle, eagle_config(heads["target"], "eagle"), heads["tensors"]["eagle"], "pytorch_model.bin")
    cli_refuses(capsys, tmp_path, llama_pair, "eagle", eagle, str(eagle / "pytorch_model.bin"), "allow_pickle")


def test_an_allowed_pickle_is_read_as_weights_only_and_runs_no_code(capsys, tmp_path, llama_pair):
    marker = tmp_path / "ran"
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "config.json").write_text(json.dumps({"medusa_num_heads": 1, "medusa_num_layers": 1}))
    with open(evil / "medusa_lm_head.pt", "wb") as handle:
        pickle.dump({"0.0.linear.weight": RunsCode(marker)}, handle, protocol=2)
    cli_refuses(capsys, tmp_path, llama_pair, "medusa", evil, str(evil / "medusa_lm_head.pt"), allow_pickle=True)
    assert not marker.exists()
