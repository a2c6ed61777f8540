"""Draft-head checkpoints for the tests: written from tensors in the published layouts (Medusa with
shared or own LM heads, EAGLE-1, EAGLE-3 with a reduced vocabulary mapped by d2t; the key names are
spelled out here, not taken from specdec's modules) and fitted for a second or two to a tiny
target's own continuations, so that they are accepted often but not always."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from profile_helpers import model_profile
from specdec_cli import Finished, Pipeline, Verified
from specdec_cli.specs import AUTO_TREE, TreeSpec

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


def merged_chain(folder: Path, solo_ngram: int = 4) -> dict:
    """Prompt lookup whose matches of under `solo_ngram` tokens are weak, so that the head's
    candidates join them in one tree (solo_ngram above max_ngram: every match is weak). Lookup reads
    its own sequence alone: the pool's longer matches (lookup across requests) would be strong."""
    lookup = {"kind": "ngram", "min_ngram": 1, "max_ngram": 3, "solo_ngram": solo_ngram, "pool_tokens": 0}
    return {"kind": "chain", "drafters": [lookup, drafter_for("eagle3", folder)]}


# --------------------------------------------------------------------------- what the heads are handed


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
