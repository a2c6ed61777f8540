"""Draft heads over the target's hidden states: Medusa (heads sharing the target's LM
head, and the original layout with an LM head per head), EAGLE-1 and EAGLE-3 (a reduced draft
vocabulary mapped by d2t).

The heads are written here from tensors in the published layouts (the key names are spelled out
below, not taken from specdec's modules) and fitted for a second or two to the tiny target's own
greedy continuations, so that they are accepted often but not always: greedy identity then runs
through accepted paths, partial paths and rejections. Everything goes through the real loader
(a profile -> Pipeline.from_profile, or `specdec generate` for the errors).
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

# compiled kernels survive between test runs, as in test_compiled.py
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), "specdec-tests-inductor"))

from cli_helpers import assert_one_line_error, run_cli  # noqa: E402
from profile_helpers import model_profile  # noqa: E402
from specdec_cli import Finished, Pipeline, Prefilled, SamplingSpec, Verified  # noqa: E402
from specdec_cli.specs import AUTO_TREE, TreeSpec  # noqa: E402
from exact_distribution import PROMPT_WORDS, chi_square_pvalue, exact_two_token_distribution, texts_by_shape  # noqa: E402

PROMPTS = ["def add(a, b):", "for i in range(10):\n    print(i * i)\nfor i in range(10):\n", "The quick brown fox"]
NEW_TOKENS = 40
KINDS = ["medusa", "medusa-own", "medusa-vocab", "eagle", "eagle3"]  # medusa-vocab: a draft vocabulary (draft_ids)
DRAFT_VOCAB = 100  # EAGLE-3's reduced vocabulary (of the target's 320)
SHAPES = {  # what the profile's `tree:` says -> the decoder's shape
    "chain k 3": None,
    "8 nodes width 2 depth 4": TreeSpec(8, 2, 4),
    "16 nodes width 4 depth 3": TreeSpec(16, 4, 3),
    "auto": AUTO_TREE,
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These models are tiny: a second intra-op thread only adds synchronisation, and on a busy
    2-core machine OpenMP's waiting makes every small op many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --------------------------------------------------------------------------- the published layouts


def medusa_keys(heads: int, layers: int, own_lm_heads: bool) -> set[str]:
    """FasterDecoding/Medusa: nn.ModuleList of Sequential(ResBlock * layers[, Linear(H, V)])."""
    keys = {f"{h}.{l}.linear.{p}" for h in range(heads) for l in range(layers) for p in ("weight", "bias")}
    return keys | ({f"{h}.{layers}.weight" for h in range(heads)} if own_lm_heads else set())


LAYER_KEYS = [
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "post_attention_layernorm.weight",
]
# SafeAILab/EAGLE cnets1.py: fc over cat(embed, feature), one layer without input_layernorm, no norm, no lm_head
EAGLE1_KEYS = {"fc.weight", "fc.bias"} | {f"layers.0.{k}" for k in LAYER_KEYS}
# EAGLE-3 (cnets.py): fc over three layers' states, `midlayer` with two input norms, own norm and lm_head, d2t / t2d
EAGLE3_KEYS = (
    {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
    | {f"midlayer.{k}" for k in LAYER_KEYS}
    | {"midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight"}
)


def eagle_config(target, kind: str, **extra) -> dict:
    """A one-layer Llama config.json as the EAGLE repos publish them."""
    config = target.config
    return {
        "architectures": ["LlamaForCausalLMEagle3" if kind == "eagle3" else "LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": config.hidden_size,
        "intermediate_size": 2 * config.hidden_size,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": config.hidden_size // 4,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-6,
        "vocab_size": config.vocab_size,
        **({"draft_vocab_size": DRAFT_VOCAB} if kind == "eagle3" else {}),
        **extra,
    }


def write_head(folder: Path, config: dict, tensors: dict[str, torch.Tensor], weights: str) -> Path:
    """config.json and the weights file, written by hand (safetensors, or a torch pickle)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {k: v.detach().contiguous().clone() for k, v in tensors.items()}
    if weights.endswith(".safetensors"):
        save_file(tensors, str(folder / weights))
    else:
        torch.save(tensors, folder / weights)
    return folder


def random_tensors(
    kind: str, hidden: int, vocab: int, *, generator: torch.Generator, heads: int = 3, own_lm_heads: bool = False,
    draft_vocab: int | None = None, scale: float = 0.1,
) -> dict[str, torch.Tensor]:
    """A head of `kind` with small random weights, by the published names. The EAGLE kinds pass
    the target's feature through fc (an identity block beside noise), so they draft sensibly."""

    def noise(*shape):
        return scale * torch.randn(*shape, generator=generator)

    if kind == "medusa":
        tensors = {}
        for h in range(heads):
            tensors[f"{h}.0.linear.weight"] = noise(hidden, hidden)
            tensors[f"{h}.0.linear.bias"] = noise(hidden)
            if own_lm_heads:
                tensors[f"{h}.1.weight"] = noise(vocab, hidden)
        return tensors
    prefix, in_dim = ("midlayer", 2 * hidden) if kind == "eagle3" else ("layers.0", hidden)
    head_dim = hidden // 4
    tensors = {
        f"{prefix}.self_attn.q_proj.weight": noise(4 * head_dim, in_dim),
        f"{prefix}.self_attn.k_proj.weight": noise(2 * head_dim, in_dim),
        f"{prefix}.self_attn.v_proj.weight": noise(2 * head_dim, in_dim),
        f"{prefix}.self_attn.o_proj.weight": noise(hidden, 4 * head_dim),
        f"{prefix}.mlp.gate_proj.weight": noise(2 * hidden, hidden),
        f"{prefix}.mlp.up_proj.weight": noise(2 * hidden, hidden),
        f"{prefix}.mlp.down_proj.weight": noise(hidden, 2 * hidden),
        f"{prefix}.post_attention_layernorm.weight": torch.ones(hidden),
    }
    eye = torch.eye(hidden)
    if kind == "eagle":
        return {"fc.weight": torch.cat([noise(hidden, hidden), eye], dim=1), "fc.bias": noise(hidden), **tensors}
    draft_vocab = draft_vocab or vocab
    return {
        "fc.weight": torch.cat([noise(hidden, hidden), noise(hidden, hidden), eye], dim=1),
        **tensors,
        f"{prefix}.input_layernorm.weight": torch.ones(hidden),
        f"{prefix}.hidden_norm.weight": torch.ones(hidden),
        "norm.weight": torch.ones(hidden),
        "lm_head.weight": noise(draft_vocab, hidden),
        "d2t": torch.zeros(draft_vocab, dtype=torch.long),
        "t2d": torch.ones(vocab, dtype=torch.bool),
    }


# --------------------------------------------------------------------------- fitting heads to the target


def own_keys(k, v):
    """The EAGLE layer attends to this call's keys only (a whole sequence under a causal mask)."""
    return k, v


def greedy_sequences(target, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    sequences = []
    for ids in prompts:
        with torch.inference_mode():
            out = target.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0,
            )
        sequences.append(out[0].tolist())
    return sequences


def hidden_states(target, sequence: list[int]) -> list[torch.Tensor]:
    with torch.inference_mode():
        out = target(torch.tensor([sequence]), output_hidden_states=True)
    return [h[0].clone() for h in out.hidden_states]


def eagle3_layer_ids(layers: int) -> tuple[int, ...]:
    """The inputs of layers 2, L//2 and L-3 (transformers' hidden_states indices), as EAGLE, vLLM and SGLang read them."""
    return (2, layers // 2, layers - 3)


def fit_medusa(
    target, sequences, heads: int, own_lm_heads: bool, steps: int = 150, seed: int = 1, wrong_labels: bool = True,
    draft_ids: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Medusa heads (one ResBlock each) trained on the target's own continuations; `wrong_labels`:
    heads after the first learn a wrong token at every third position, so that drafts there are
    accepted partly (the first head right, a later one wrong). `draft_ids`: the heads score only
    those tokens (saved as `draft_ids`, as train-draft writes them); labels outside are not learnt."""
    from specdec_cli.drafters.heads import MedusaHeads

    torch.manual_seed(seed)
    lm_head = target.get_output_embeddings().weight.detach()
    vocab, hidden = lm_head.shape
    module = MedusaHeads(heads, 1, hidden, vocab, own_lm_heads=own_lm_heads, draft_ids=draft_ids)
    frozen_lm_head = torch.nn.Linear(hidden, vocab, bias=False)
    frozen_lm_head.weight = torch.nn.Parameter(lm_head, requires_grad=False)
    in_draft = torch.ones(vocab, dtype=torch.bool)
    if draft_ids is not None:
        in_draft = torch.zeros(vocab, dtype=torch.bool)
        in_draft[draft_ids] = True
    with torch.no_grad():
        for head in module.heads:
            head[0].linear.weight.zero_()
            head[0].linear.bias.zero_()
            if own_lm_heads:
                head[1].weight.copy_(lm_head + 0.02 * torch.randn_like(lm_head))
    layers = target.config.num_hidden_layers
    data = []
    for sequence in sequences:
        labels = torch.tensor(sequence).repeat(heads, 1)  # [heads, T]
        if wrong_labels:
            for h in range(1, heads):
                labels[h, h::3] = (labels[h, h::3] + 1) % vocab
        data.append((hidden_states(target, sequence)[layers], labels))
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = 0.0
        for feature, labels in data:
            logits = module.logits(feature, frozen_lm_head)  # [n, heads, V]
            for h in range(heads):  # head h at position t guesses token t + 2 + h
                guesses, wanted = logits[: labels.shape[1] - 2 - h, h], labels[h, 2 + h :]
                kept = in_draft[wanted]
                loss = loss + F.cross_entropy(guesses[kept], wanted[kept])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    state = dict(module.heads.state_dict())
    return state if draft_ids is None else {**state, "draft_ids": draft_ids}


def most_used(sequences, count: int, vocab: int) -> torch.Tensor:
    """The `count` tokens the sequences use most, ascending (a draft vocabulary)."""
    counts = torch.bincount(torch.tensor([t for s in sequences for t in s]), minlength=vocab).float()
    return torch.sort(torch.topk(counts + torch.rand(vocab) * 0.1, count).indices).values


def fit_eagle(
    target, sequences, kind: str, config: dict, steps: int = 120, seed: int = 2, feature_layers: tuple[int, ...] | None = None,
) -> dict[str, torch.Tensor]:
    """An EAGLE layer trained as EAGLE trains it: (feature i, token i + 1) -> token i + 2, and its
    output regressed on the next position's (projected) feature, so that drafting deeper works too.
    EAGLE-3's draft vocabulary (config's draft_vocab_size): the tokens most used (sorted), d2t[i] = used[i] - i."""
    from specdec_cli.drafters.head_files import eagle_module

    torch.manual_seed(seed)
    vocab = target.config.vocab_size
    layers = target.config.num_hidden_layers
    module = eagle_module(config, kind, target, Path("fit"))
    to_draft = None
    if kind == "eagle3":
        counts = sum(torch.bincount(torch.tensor(s), minlength=vocab).float() for s in sequences)
        draft_vocab = config["draft_vocab_size"]
        used = torch.sort(torch.topk(counts + torch.rand(vocab) * 0.1, draft_vocab).indices).values
        with torch.no_grad():
            module.d2t.copy_(used - torch.arange(draft_vocab))
            module.t2d.zero_()
            module.t2d[used] = True
        to_draft = torch.full((vocab,), -100, dtype=torch.long)
        to_draft[used] = torch.arange(draft_vocab)
    if feature_layers is None:
        feature_layers = eagle3_layer_ids(layers) if kind == "eagle3" else (layers,)
    embed = target.get_input_embeddings().weight.detach()
    lm_head = target.get_output_embeddings().weight.detach()
    data = []
    for sequence in sequences:
        states = hidden_states(target, sequence)
        data.append((torch.cat([states[i] for i in feature_layers], dim=-1), torch.tensor(sequence)))
    optimizer = torch.optim.Adam(module.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = 0.0
        for features, tokens in data:
            n = len(tokens) - 2
            hidden = module.project(features)
            mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
            out = module.step(embed[tokens[1 : n + 1]][None], hidden[None, :n], torch.arange(n)[None], own_keys, mask)[0]
            if kind == "eagle3":
                logits, labels = module.draft_logits(out), to_draft[tokens[2:]]
            else:
                logits, labels = F.linear(out, lm_head), tokens[2:]
            loss = loss + F.cross_entropy(logits, labels) + F.smooth_l1_loss(out, hidden[1 : n + 1].detach())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return module.state_dict()


@pytest.fixture(scope="module")
def heads(llama_pair, tokenizer, tmp_path_factory) -> dict:
    """One head folder of each kind for llama_pair's target, in the published layouts."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("heads")
    target = AutoModelForCausalLM.from_pretrained(llama_pair["target"], dtype=torch.float32).eval()
    sequences = greedy_sequences(target, [tokenizer(p)["input_ids"] for p in PROMPTS], NEW_TOKENS)
    folders, tensors = {}, {}
    for kind in KINDS:
        if kind.startswith("medusa"):
            own = kind == "medusa-own"
            config = {"medusa_num_heads": 3, "medusa_num_layers": 1, "base_model_name_or_path": "tiny-llama"}
            draft_ids = most_used(sequences, DRAFT_VOCAB, target.config.vocab_size) if kind == "medusa-vocab" else None
            state = fit_medusa(target, sequences, 3, own, draft_ids=draft_ids)
            weights = "medusa_lm_head.safetensors"
        else:
            config = eagle_config(target, kind)
            state = fit_eagle(target, sequences, kind, config)
            weights = "model.safetensors"
        tensors[kind] = state
        folders[kind] = write_head(root / kind, config, state, weights)
    return {"folders": folders, "tensors": tensors, "target": target, "root": root}


def drafter_for(kind: str, folder: Path) -> dict:
    return {"kind": "medusa", "heads": str(folder)} if kind.startswith("medusa") else {"kind": "eagle", "head": str(folder)}


def head_pipeline(tmp_path, pair, kind: str, folder: Path, **fields) -> Pipeline:
    fields.setdefault("k", 3)
    fields.setdefault("chat", False)
    profile = model_profile(tmp_path, pair, name=f"head-{kind}", drafter=drafter_for(kind, folder), **fields)
    return Pipeline.from_profile(str(profile))


def stream_all(pipe: Pipeline, ids, decoder, **kwargs) -> tuple[list[Verified], Finished]:
    steps, finished = [], None
    for event in pipe.stream(ids, decoder=decoder, **kwargs):
        if isinstance(event, Verified):
            steps.append(event)
        elif isinstance(event, Finished):
            finished = event
    return steps, finished


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


# --------------------------------------------------------------------------- greedy identity


@pytest.mark.parametrize("kind", KINDS)
def test_heads_keep_greedy_identity_for_chains_and_trees(tmp_path, llama_pair, heads, kind):
    """The emitted ids equal the target's own greedy decoding, for a chain of 3 and three tree
    shapes, and the heads are really accepted (deep paths, partial paths and branches all occur)."""
    pipe = head_pipeline(tmp_path, llama_pair, kind, heads["folders"][kind], tree={"nodes": 8, "width": 2, "depth": 4})
    assert pipe.profile.tree == TreeSpec(8, 2, 4)
    for name, shape in SHAPES.items():
        accepted, deep, partial, branched = 0, 0, 0, 0
        for prompt in PROMPTS:
            ids = pipe.encode(prompt)
            expected = pipe.transformers_generate(ids, NEW_TOKENS)
            decoder = pipe.decoder(tree="profile" if shape == TreeSpec(8, 2, 4) else shape)
            steps, finished = stream_all(pipe, ids, decoder, max_new_tokens=NEW_TOKENS)
            assert finished.token_ids == expected, (kind, name, prompt)
            assert all(s.drafter in ("medusa", "eagle", "eagle-3") for s in steps if s.drafter)
            accepted += sum(s.n_accepted for s in steps)
            deep += sum(s.n_accepted >= 2 for s in steps)
            partial += sum(0 < s.n_accepted < 3 for s in steps)
            branched += sum(s.tree for s in steps)
        assert accepted >= NEW_TOKENS, (kind, name, accepted)  # more than half the output came from the heads
        assert deep > 3 and partial > 0, (kind, name, deep, partial)
        if shape is not None and not shape.auto:
            assert branched > 0, (kind, name)


@pytest.mark.parametrize("kind", KINDS)
def test_heads_stop_at_eos_and_max_new_tokens_inside_an_accepted_path(tmp_path, llama_pair, heads, kind):
    pipe = head_pipeline(tmp_path, llama_pair, kind, heads["folders"][kind])
    ids = pipe.encode(PROMPTS[0])
    shapes = (None, TreeSpec(8, 2, 4), TreeSpec(16, 4, 3))
    for limit in (1, 2, 5, 11):
        expected = pipe.transformers_generate(ids, limit)
        for shape in shapes:
            steps, finished = stream_all(pipe, ids, pipe.decoder(tree=shape), max_new_tokens=limit)
            assert finished.token_ids == expected and len(expected) == limit, (limit, shape)
            assert finished.finish_reason == "length"
    free_run = pipe.transformers_generate(ids, NEW_TOKENS)
    cut_inside = 0
    for position in (9, 17, 25, 33):
        pipe.eos_ids = frozenset({free_run[position]})
        expected = pipe.transformers_generate(ids, NEW_TOKENS)
        assert expected[-1] == free_run[position]
        for shape in shapes:
            steps, finished = stream_all(pipe, ids, pipe.decoder(tree=shape), max_new_tokens=NEW_TOKENS)
            assert finished.token_ids == expected and finished.finish_reason == "eos", (position, shape)
            last = steps[-1]
            cut_inside += last.n_accepted >= len(last.emitted)  # EOS was a drafted token the target kept
    assert cut_inside > 0, "no EOS fell inside an accepted path: the case is not exercised"


@pytest.mark.parametrize("kind", KINDS)
def test_a_one_token_prompt_keeps_greedy_identity(tmp_path, llama_pair, heads, kind):
    """No state precedes the first token: the first step has nothing to draft from (no drafts, or
    a draft without a feature), and the steps after it draft as usual."""
    pipe = head_pipeline(tmp_path, llama_pair, kind, heads["folders"][kind])
    for ids in ([pipe.tokenizer.bos_token_id], pipe.encode("def")[:1]):
        for shape in (None, TreeSpec(8, 2, 4)):
            result = pipe.generate(ids, decoder=pipe.decoder(tree=shape), max_new_tokens=20)
            assert result.token_ids == pipe.transformers_generate(ids, 20), (ids, shape)


def test_compiled_target_feeds_the_heads_and_keeps_greedy_identity(tmp_path, llama_pair, heads):
    """compile: on (a static cache and a compiled step that also returns the chosen layers'
    states, padded to its width): EAGLE-3 over a tree, its output and the states it was handed."""
    pipe = head_pipeline(tmp_path, llama_pair, "eagle3", heads["folders"]["eagle3"], compile="on")
    ids = pipe.encode(PROMPTS[0])
    decoder = pipe.decoder(tree=TreeSpec(8, 2, 4))
    handed = record_features(decoder.drafter)
    steps, finished = stream_all(pipe, ids, decoder, max_new_tokens=NEW_TOKENS)
    assert finished.token_ids == pipe.transformers_generate(ids, NEW_TOKENS)
    assert sum(s.n_accepted for s in steps) >= 10 and any(s.tree for s in steps)
    check_features(heads["target"], "eagle3", list(ids) + list(finished.token_ids), handed)


@pytest.mark.parametrize("kind", ["medusa-own", "eagle3"])
def test_specdec_generate_and_verify_with_a_head_profile(capsys, tmp_path, llama_pair, heads, kind):
    """What a user runs: `specdec generate` prints the target's own continuation and says which
    drafter guessed; `specdec verify` passes on the head profile."""
    profile = model_profile(tmp_path, llama_pair, name="heads", drafter=drafter_for(kind, heads["folders"][kind]), k=3,
                            tree={"nodes": 8, "width": 2, "depth": 4}, chat=False)
    code, out, err = run_cli(capsys, "generate", "-p", str(profile), "-f", "json", "-n", "30", PROMPTS[0])
    assert code == 0, err
    report = json.loads(out)
    pipe = Pipeline.from_profile(str(profile))
    assert tuple(report["token_ids"]) == pipe.transformers_generate(pipe.encode(PROMPTS[0]), 30)
    assert report["stats"]["accepted"] > 5, report["stats"]
    assert set(report["stats"]["per_drafter"]) == {"medusa" if kind.startswith("medusa") else "eagle-3"}
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPTS[0] + "\n")
    code, out, err = run_cli(capsys, "verify", "-p", str(profile), "--prompts", str(prompts), "--samples", "0", "-n", "24")
    assert code == 0 and "PASS" in out and "identical" in out, out + err


# --------------------------------------------------------------------------- the hidden states handed over


def record_features(drafter) -> list[torch.Tensor]:
    handed: list[torch.Tensor] = []
    take = drafter.take_features

    def recording(features):
        handed.append(features.detach().float().cpu().clone())
        return take(features)

    drafter.take_features = recording
    return handed


def reference_features(target, kind: str, sequence: list[int]) -> torch.Tensor:
    """What each kind reads, from a plain forward over the whole sequence, taken by hooks (not by
    transformers' hidden_states): the final norm's output (what the LM head reads) for Medusa and
    EAGLE; the inputs of layers 2, L//2, L-3, side by side, for EAGLE-3."""
    layers = target.model.layers
    taken: dict[str, torch.Tensor] = {}
    hooks = [target.model.norm.register_forward_hook(lambda m, a, out: taken.__setitem__("norm", out[0].clone()))]
    for i in set(eagle3_layer_ids(len(layers))):
        hooks.append(layers[i].register_forward_pre_hook(
            lambda m, args, kwargs, i=i: taken.__setitem__(i, (args[0] if args else kwargs["hidden_states"])[0].clone()),
            with_kwargs=True,
        ))
    try:
        with torch.inference_mode():
            logits = target(torch.tensor([sequence])).logits[0]
            assert torch.allclose(target.lm_head(taken["norm"]), logits, atol=1e-5)  # what the LM head reads
    finally:
        for hook in hooks:
            hook.remove()
    if kind == "eagle3":
        return torch.cat([taken[i] for i in eagle3_layer_ids(len(layers))], dim=-1)
    return taken["norm"]


def check_features(target, kind: str, sequence: list[int], handed: list[torch.Tensor]) -> None:
    """Handed over in order: the prompt's states but the last token's, then per step the root's and
    the accepted nodes'; together, the states of the committed sequence but its newest token."""
    expected = reference_features(target, kind, sequence)
    got = torch.cat(handed)
    assert len(sequence) - 1 <= got.shape[0] <= len(sequence), (got.shape, len(sequence))
    assert torch.allclose(got, expected[: got.shape[0]], atol=1e-4), (got - expected[: got.shape[0]]).abs().max()


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3"])
def test_the_drafter_gets_the_targets_hidden_states_of_the_committed_tokens(tmp_path, llama_pair, heads, kind):
    pipe = head_pipeline(tmp_path, llama_pair, kind, heads["folders"][kind])
    for prompt in PROMPTS[:2]:
        ids = pipe.encode(prompt)
        for shape in (None, TreeSpec(16, 4, 3)):
            decoder = pipe.decoder(tree=shape)
            handed = record_features(decoder.drafter)
            committed = list(ids)
            accepted = 0
            for event in pipe.stream(ids, decoder=decoder, max_new_tokens=NEW_TOKENS):
                if isinstance(event, Prefilled):
                    assert [h.shape[0] for h in handed] == [len(ids) - 1]
                elif isinstance(event, Verified):
                    committed += event.emitted
                    accepted += event.n_accepted
                    rows = sum(h.shape[0] for h in handed)
                    # the root's and the accepted nodes' (at the very end an EOS can cut the path:
                    # then the newest token is an accepted node, and its state comes too)
                    assert handed[-1].shape[0] == 1 + min(event.n_accepted, len(event.emitted)), (handed[-1].shape, event)
                    assert rows == len(committed) - 1 or rows == len(committed), (rows, len(committed))
            assert accepted > 5, (kind, shape, accepted)
            check_features(heads["target"], kind, committed, handed)


@pytest.mark.parametrize("kind", ["medusa", "eagle3"])
def test_a_chain_of_prompt_lookup_then_a_head_feeds_the_head_every_step(tmp_path, llama_pair, heads, kind):
    """Prompt lookup drafts where it finds a match, the head elsewhere; the head still gets the
    states of every committed token (steps it sat out included) and the text stays the target's."""
    drafter = {"kind": "chain", "drafters": [{"kind": "ngram"}, drafter_for(kind, heads["folders"][kind])]}
    profile = model_profile(tmp_path, llama_pair, name=f"chain-{kind}", drafter=drafter, k=3, chat=False)
    pipe = Pipeline.from_profile(str(profile))
    winners: dict[str, int] = {}
    for prompt in PROMPTS:
        ids = pipe.encode(prompt)
        decoder = pipe.decoder()
        handed = record_features(decoder.drafter.drafters[1])
        steps, finished = stream_all(pipe, ids, decoder, max_new_tokens=NEW_TOKENS)
        assert finished.token_ids == pipe.transformers_generate(ids, NEW_TOKENS), (kind, prompt)
        for step in steps:
            if step.n_accepted:
                winners[step.drafter] = winners.get(step.drafter, 0) + step.n_accepted
        check_features(heads["target"], kind, list(ids) + list(finished.token_ids), handed)
    assert set(winners) == {"ngram", "medusa" if kind == "medusa" else "eagle-3"}, winners


def merged_chain(folder: Path, solo_ngram: int = 4) -> dict:
    """Prompt lookup whose matches of under `solo_ngram` tokens are weak, so that the head's
    candidates join them in one tree (solo_ngram above max_ngram: every match is weak)."""
    lookup = {"kind": "ngram", "min_ngram": 1, "max_ngram": 3, "solo_ngram": solo_ngram}
    return {"kind": "chain", "drafters": [lookup, drafter_for("eagle3", folder)]}


@pytest.mark.parametrize("shape", [None, TreeSpec(8, 2, 4), AUTO_TREE])
def test_a_weak_lookup_match_and_the_head_share_one_tree_and_keep_greedy_identity(tmp_path, llama_pair, heads, shape):
    """Every lookup match is weak: lookup's continuation and the EAGLE-3 head's candidates are
    verified in one forward. The text stays the target's; paths through either drafter's nodes
    are accepted (lookup's few right guesses counted where the shape is fixed: the auto rules
    size drafts by measured timings, so which nodes they draft varies from run to run); each
    drafter's k: auto / tree: auto record learns from its own nodes."""
    profile = model_profile(tmp_path, llama_pair, name="merged", drafter=merged_chain(heads["folders"]["eagle3"]),
                            k="auto", chat=False)
    pipe = Pipeline.from_profile(str(profile))
    kept_by = {"ngram/short": 0, "eagle-3": 0}  # every match is short here
    learnt: dict[str, int] = {}
    merged = 0
    for prompt in PROMPTS:
        ids = pipe.encode(prompt)
        decoder = pipe.decoder(tree=shape)
        steps, finished = stream_all(pipe, ids, decoder, max_new_tokens=NEW_TOKENS)
        assert finished.token_ids == pipe.transformers_generate(ids, NEW_TOKENS), (shape, prompt)
        for step in steps:
            if step.parts:
                merged += 1
                assert step.drafter == "ngram/short+eagle-3"
                assert step.nodes <= decoder.node_limit  # the compiled widths hold a merged tree too
                for part in step.parts:
                    kept_by[part.drafter] += sum(kept for _, _, kept, _ in part.judged)
        for name, record in getattr(decoder.lookahead, "records", {}).items():
            learnt[name] = learnt.get(name, 0) + record.judged
    assert merged > 3, merged
    assert kept_by["eagle-3"] > 0, kept_by
    if shape is None or shape.auto:  # k: auto / tree: auto: both drafters' records have judged nodes
        assert learnt.get("ngram/short", 0) > 0 and learnt.get("eagle-3", 0) > 0, learnt
        assert "ngram" not in learnt and "ngram/short+eagle-3" not in learnt, learnt
    else:  # a fixed shape drafts the same nodes every run (the auto rules size drafts by timings)
        assert kept_by["ngram/short"] > 0, kept_by


def test_a_strong_lookup_match_is_proposed_alone(tmp_path, llama_pair, heads):
    """solo_ngram 2: a match of two or three tokens is lookup's alone; a one-token match is merged,
    and its guesses are learnt apart (ngram/short)."""
    profile = model_profile(tmp_path, llama_pair, name="solo", drafter=merged_chain(heads["folders"]["eagle3"], solo_ngram=2),
                            k=3, chat=False)
    pipe = Pipeline.from_profile(str(profile))
    seen = set()
    # the last prompt ends inside a repeated span: its first step has a three-token match
    for prompt in PROMPTS + ["for i in range(10):\n    print(i * i)\nfor i in range("]:
        ids = pipe.encode(prompt)
        steps, finished = stream_all(pipe, ids, pipe.decoder(), max_new_tokens=NEW_TOKENS)
        assert finished.token_ids == pipe.transformers_generate(ids, NEW_TOKENS)
        seen |= {s.drafter for s in steps if s.drafter}
    assert {"ngram", "ngram/short+eagle-3"} <= seen, seen


def check_member_paths(chain) -> list[int]:
    """Wrap each chain member so that every accept checks that the path it is handed, in its own
    numbering, spells the first committed tokens of the step; counts the nodes kept per member."""
    kept = [0] * len(chain.drafters)

    def wrap(i, member):
        propose, accept = member.propose, member.accept
        last: dict = {}

        def recording_propose(shape, budget=None):
            draft = propose(shape, budget)
            last["ids"] = draft.token_ids.tolist() if draft is not None else []
            return draft

        def checking_accept(new_tokens, path):
            assert [last["ids"][node] for node in path] == list(new_tokens)[: len(path)], (member.name, path)
            kept[i] += len(path)
            last["ids"] = []
            accept(new_tokens, path)

        member.propose, member.accept = recording_propose, checking_accept

    for i, member in enumerate(chain.drafters):
        wrap(i, member)
    return kept


def test_each_member_of_a_merged_tree_is_handed_its_own_accepted_path(tmp_path, llama_pair, heads):
    """Lookup then the head, and lookup then a draft model, in one tree: each member gets the
    accepted path in its own node numbering (the draft model keeps those nodes in its cache, the
    head drops its own), and the text stays the target's."""
    draft = {"kind": "model", "model": str(llama_pair["draft"])}
    for drafter in (merged_chain(heads["folders"]["eagle3"]), {**merged_chain(heads["folders"]["eagle3"]), "drafters": [
        merged_chain(heads["folders"]["eagle3"])["drafters"][0], draft]}):
        check_merged_members(tmp_path, llama_pair, drafter)


def check_merged_members(tmp_path, pair, drafter: dict) -> None:
    profile = model_profile(tmp_path, pair, name="merged-members", drafter=drafter, k=5, chat=False)
    pipe = Pipeline.from_profile(str(profile))
    kept = [0, 0]
    for prompt in PROMPTS:
        ids = pipe.encode(prompt)
        for shape in (None, TreeSpec(12, 2, 4)):
            decoder = pipe.decoder(tree=shape)
            counts = check_member_paths(decoder.drafter)
            steps, finished = stream_all(pipe, ids, decoder, max_new_tokens=NEW_TOKENS)
            assert finished.token_ids == pipe.transformers_generate(ids, NEW_TOKENS), (prompt, shape)
            kept = [a + b for a, b in zip(kept, counts)]
    # the second member's nodes are numbered after lookup's in the merged tree: its paths are the mapped ones
    assert kept[1] > 5, (drafter, kept)


# --------------------------------------------------------------------------- temperature > 0: the target's distribution


LOOP_SAMPLES = 1000


@pytest.fixture(scope="module")
def word_heads(small_vocab_pair, tmp_path_factory) -> dict[str, Path]:
    """Heads for small_vocab_pair's 2-layer, 12-token target, fitted to its samples: Medusa sharing
    its LM head, and EAGLE-3 over 8 of the 12 tokens (the other 4 only the target makes)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("word-heads")
    target = AutoModelForCausalLM.from_pretrained(small_vocab_pair["target"], dtype=torch.float32).eval()
    words = AutoTokenizer.from_pretrained(small_vocab_pair["target"])
    prompt = words(PROMPT_WORDS)["input_ids"]
    torch.manual_seed(4)
    with torch.inference_mode():  # the target's own samples at temperature 1
        sampled = target.generate(
            torch.tensor([prompt] * 16), attention_mask=torch.ones(16, len(prompt), dtype=torch.long),
            max_new_tokens=12, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, eos_token_id=None, pad_token_id=0,
        ).tolist()
    folders = {}
    config = {"medusa_num_heads": 2, "medusa_num_layers": 1}
    state = fit_medusa(target, sampled, 2, own_lm_heads=False, steps=60, wrong_labels=False)
    folders["medusa"] = write_head(root / "medusa", config, state, "medusa_lm_head.safetensors")
    state = fit_medusa(target, sampled, 2, own_lm_heads=False, steps=60, wrong_labels=False,
                       draft_ids=most_used(sampled, 8, target.config.vocab_size))
    folders["medusa-vocab"] = write_head(root / "medusa-vocab", config, state, "medusa_lm_head.safetensors")
    # the target is too shallow for the default layers (2, L//2, L-3): the config names them (as vLLM reads them)
    config = eagle_config(target, "eagle3", draft_vocab_size=8, eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]})
    state = fit_eagle(target, sampled, "eagle3", config, steps=60, feature_layers=(0, 1, 2))
    folders["eagle3"] = write_head(root / "eagle3", config, state, "model.safetensors")
    return folders


@pytest.mark.parametrize("kind", ["medusa", "medusa-vocab", "eagle3"])  # (EAGLE-1 drafts through the same code as EAGLE-3)
def test_heads_first_two_tokens_follow_the_target_at_temperature_1(tmp_path, small_vocab_pair, word_heads, kind):
    pipe = head_pipeline(tmp_path, small_vocab_pair, kind, word_heads[kind])
    pipe.eos_ids = frozenset()  # every sample has its tokens
    ids = pipe.encode(PROMPT_WORDS)
    sampling = SamplingSpec(temperature=1.0)
    joint = exact_two_token_distribution(pipe, ids, sampling)
    counts = np.zeros((pipe.vocab, pipe.vocab))
    decoder = pipe.decoder(tree=TreeSpec(6, 3, 2))
    accepted = rejected = 0
    for seed in range(LOOP_SAMPLES):
        # three tokens, so that drafts two deep (not cut by the length) can make both counted ones
        steps, finished = stream_all(pipe, ids, decoder, sampling=sampling, max_new_tokens=3, seed=seed)
        t1, t2 = finished.token_ids[:2]
        counts[t1, t2] += 1
        accepted += sum(s.n_accepted for s in steps)
        rejected += sum(not kept for s in steps for _, _, kept, _ in s.judged)
    # both outcomes of the rule occur often: a guess equal to the target's choice, and one that is not
    assert accepted > LOOP_SAMPLES // 2 and rejected > LOOP_SAMPLES // 4, (accepted, rejected)
    assert chi_square_pvalue(counts, joint) > 1e-3


def test_a_merged_tree_follows_the_target_at_temperature_1(tmp_path, small_vocab_pair, word_heads):
    """Above temperature 0 lookup's guesses and the head's share one tree (an identical guess is one
    node), each kept where it equals the target's choice: the first two tokens follow the target."""
    profile = model_profile(tmp_path, small_vocab_pair, name="merged-t1", drafter=merged_chain(word_heads["eagle3"]),
                            k=3, chat=False)
    pipe = Pipeline.from_profile(str(profile))
    pipe.eos_ids = frozenset()
    # lookup guesses "gamma" here (after the earlier "delta"), which the target draws ~40% of the
    # time: its point mass is accepted often and rejected often
    ids = pipe.encode("delta gamma beta alpha delta")
    sampling = SamplingSpec(temperature=1.0)
    joint = exact_two_token_distribution(pipe, ids, sampling)
    counts = np.zeros((pipe.vocab, pipe.vocab))
    decoder = pipe.decoder(tree=TreeSpec(6, 2, 2))
    merged = kept_lookup = kept_head = 0
    for seed in range(LOOP_SAMPLES):
        steps, finished = stream_all(pipe, ids, decoder, sampling=sampling, max_new_tokens=3, seed=seed)
        t1, t2 = finished.token_ids[:2]
        counts[t1, t2] += 1
        for step in steps:
            merged += bool(step.parts)
            for part in step.parts:
                kept = sum(k for _, _, k, _ in part.judged)
                kept_lookup += kept if part.drafter == "ngram/short" else 0
                kept_head += kept if part.drafter == "eagle-3" else 0
    assert merged > LOOP_SAMPLES // 2 and kept_lookup > 200 and kept_head > 50, (merged, kept_lookup, kept_head)
    assert chi_square_pvalue(counts, joint) > 1e-3


@pytest.mark.parametrize("kind", ["medusa", "eagle3"])
def test_heads_give_the_seeds_text_for_every_k_and_tree(tmp_path, llama_pair, heads, kind):
    """float32, temperature 0.8: the same ids as plain decoding with the same seed, for k = 1, 2,
    4, auto, a tree and tree: auto."""
    pipe = head_pipeline(tmp_path, llama_pair, kind, heads["folders"][kind])
    texts = texts_by_shape(pipe, PROMPTS[0], SamplingSpec(temperature=0.8), seed=3)
    assert all(ids == texts["plain"] for ids in texts.values()), {n: ids[:12] for n, ids in texts.items()}


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
    assert result.token_ids == pipe.transformers_generate(ids, 16)
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
