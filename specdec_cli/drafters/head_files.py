"""Reading and writing draft-head checkpoints (heads.py) in their published layouts, and checking
a head against the target before the first token.

Folders: Medusa's `config.json` (medusa_num_heads, medusa_num_layers) with
`medusa_lm_head.safetensors` (or the original pickled `medusa_lm_head.pt`; heads specdec trains
add `draft_ids`, their draft vocabulary); EAGLE's and EAGLE-3's
`config.json` (a one-layer Llama config; EAGLE-3 adds draft_vocab_size) with `model.safetensors`
(or `pytorch_model.bin`). Pickled weights load only where the profile says `allow_pickle: true`,
and then with torch's weights-only unpickler (no code runs). What `specdec train-draft` writes
adds a `specdec` block to the config: the target it was trained for and what it measured.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ModelSourceError, UsageError
from ..files import replace_atomically
from .heads import EagleHead, HeadShape, MedusaHeads

CONFIG = "config.json"
MEDUSA_WEIGHTS = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
EAGLE_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
DRAFT_IDS = "draft_ids"  # Medusa heads specdec trains: the target ids their draft vocabulary keeps


class HeadMismatchError(UsageError):
    """A head made for another target (hidden size, vocabulary, layers, architecture)."""


def text_config(model: nn.Module):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def target_facts(target: nn.Module) -> dict[str, Any]:
    """What a head depends on in its target: recorded by train-draft, checked at load."""
    config = text_config(target)
    return {
        "model_type": config.model_type,
        "hidden_size": int(config.hidden_size),
        "num_hidden_layers": int(config.num_hidden_layers),
        "vocab_size": int(target.get_output_embeddings().out_features),
    }


def resolve_folder(reference: str, kind: str) -> Path:
    """A local folder, `package:NAME/sub`, or a hub id (from the local cache when offline)."""
    from ..models.sources import hub_reachable, is_local_reference, local_path, offline_message

    if is_local_reference(reference):
        folder = local_path(reference)
        if not folder.is_dir():
            raise ModelSourceError(
                f"draft head folder '{reference}' does not exist; train one with "
                f"`specdec train-draft --kind {kind} --out {reference}`, or fix the drafter's path"
            )
        return folder
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(reference, local_files_only=not hub_reachable()))
    except Exception as error:  # huggingface_hub raises many kinds; all mean "not available here"
        if not hub_reachable():
            raise ModelSourceError(offline_message(reference)) from error
        raise ModelSourceError(f"cannot download the draft head '{reference}': {error}") from error


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG
    if not path.is_file():
        raise ModelSourceError(f"'{folder}' has no {CONFIG}: not a Medusa or EAGLE head folder")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelSourceError(f"'{path}' is not readable JSON ({error}); the head checkpoint is damaged") from error
    if not isinstance(config, dict):
        raise ModelSourceError(f"'{path}' must hold a JSON object; the head checkpoint is damaged")
    return config


def read_weights(folder: Path, names: tuple[str, ...], allow_pickle: bool) -> dict[str, torch.Tensor]:
    """The first of `names` that exists (safetensors first); pickles only with allow_pickle."""
    for name in names:
        path = folder / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(path))
            if not allow_pickle:
                raise ModelSourceError(
                    f"'{path}' is a pickle, which can execute code when loaded; convert it to safetensors, "
                    "or set `allow_pickle: true` in the profile if you trust the source"
                )
            return torch.load(path, map_location="cpu", weights_only=True)
        except ModelSourceError:
            raise
        except Exception as error:  # a truncated or corrupt file: safetensors and torch raise various kinds
            first = (str(error).strip().splitlines() or ["unreadable"])[0]
            raise ModelSourceError(f"cannot read '{path}' ({first}); the head checkpoint is damaged or not plain weights") from error
    raise ModelSourceError(f"'{folder}' holds none of {', '.join(names)}")


def head_kind(config: dict[str, Any], weights: dict[str, torch.Tensor] | None = None) -> str:
    if "medusa_num_heads" in config:
        return "medusa"
    if weights is not None:
        if any(k.startswith("midlayer.") for k in weights):
            return "eagle3"
        if "fc.weight" in weights:
            return "eagle"
    if "draft_vocab_size" in config or any("Eagle3" in a for a in config.get("architectures") or []):
        return "eagle3"
    return "eagle"


def load_state(module: nn.Module, state: dict[str, torch.Tensor], where: Path) -> None:
    """Strict loading with a one-line message for a damaged or foreign checkpoint."""
    # the target's embeddings serve; rotary tables are recomputed (older EAGLE files saved them)
    state = {k: v for k, v in state.items() if k != "embed_tokens.weight" and not k.endswith("rotary_emb.inv_freq")}
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ModelSourceError(f"'{where}' lacks {missing[0]}{' and more' if len(missing) > 1 else ''}; the head checkpoint is damaged or of another layout")
    unknown = sorted(set(state) - set(expected))
    if unknown:
        raise ModelSourceError(f"'{where}' has an unexpected tensor {unknown[0]}; the head checkpoint is of another layout")
    for key, value in state.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise ModelSourceError(
                f"'{where}': {key} is {tuple(value.shape)}, expected {tuple(expected[key].shape)}; "
                "the head checkpoint is damaged or its config does not match its weights"
            )
    module.load_state_dict(state)


def check_target(config: dict[str, Any], target: nn.Module, where: Path) -> None:
    """Refuse a head trained for another model (what train-draft recorded)."""
    recorded = (config.get("specdec") or {}).get("target") or {}
    facts = target_facts(target)
    for key, value in recorded.items():
        if key in facts and facts[key] != value:
            raise HeadMismatchError(
                f"the head in '{where}' was trained for a target with {key} {value}; this target has {facts[key]}"
            )


def mismatch(where: Path, what: str, head_value: Any, target_value: Any) -> HeadMismatchError:
    return HeadMismatchError(f"the head in '{where}' is for a target with {what} {head_value}; this target has {target_value}")


# --------------------------------------------------------------------------- Medusa


def build_medusa(config: dict[str, Any], state: dict[str, torch.Tensor], target: nn.Module, where: Path) -> MedusaHeads:
    facts = target_facts(target)
    # the published vicuna config understates its heads: count them from the weights
    heads = 1 + max((int(m.group(1)) for m in map(re.compile(r"^(\d+)\.").match, state) if m), default=-1)
    layers = int(config.get("medusa_num_layers", 1))
    if heads < 1 or "0.0.linear.weight" not in state:
        raise ModelSourceError(f"'{where}' has no Medusa head weights (0.0.linear.weight); the checkpoint is damaged")
    hidden = int(state["0.0.linear.weight"].shape[0])
    if hidden != facts["hidden_size"]:
        raise mismatch(where, "hidden size", hidden, facts["hidden_size"])
    own = f"0.{layers}.weight" in state
    if own and int(state[f"0.{layers}.weight"].shape[0]) != facts["vocab_size"]:
        raise mismatch(where, "vocabulary size", int(state[f"0.{layers}.weight"].shape[0]), facts["vocab_size"])
    draft_ids = state.pop(DRAFT_IDS, None)
    if draft_ids is not None:
        check_draft_ids(draft_ids, own, facts["vocab_size"], where)
    module = MedusaHeads(heads, layers, hidden, facts["vocab_size"], own_lm_heads=own, draft_ids=draft_ids)
    load_state(module.heads, state, where)
    return module


def check_draft_ids(draft_ids: torch.Tensor, own_lm_heads: bool, vocab: int, where: Path) -> None:
    """A draft vocabulary: distinct target ids, for heads that share the target's LM head."""
    if own_lm_heads:
        raise ModelSourceError(f"'{where}' has {DRAFT_IDS} beside its own LM heads; the checkpoint is of another layout")
    if draft_ids.dim() != 1 or draft_ids.dtype not in (torch.int32, torch.int64) or draft_ids.numel() == 0:
        raise ModelSourceError(f"'{where}': {DRAFT_IDS} must be a non-empty list of token ids; the head checkpoint is damaged")
    if int(draft_ids.min()) < 0 or int(draft_ids.max()) >= vocab or draft_ids.unique().numel() != draft_ids.numel():
        raise ModelSourceError(f"'{where}': {DRAFT_IDS} holds ids outside the target's {vocab} or repeats one; the head checkpoint is damaged")


# --------------------------------------------------------------------------- EAGLE, EAGLE-3


def eagle_shape(config: dict[str, Any], kind: str, target: nn.Module, where: Path) -> HeadShape:
    facts = target_facts(target)
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        shape = HeadShape(
            hidden=hidden,
            intermediate=int(config["intermediate_size"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            eps=float(config.get("rms_norm_eps", 1e-6)),
            vocab=int(config.get("vocab_size", facts["vocab_size"])),
            draft_vocab=int(config.get("draft_vocab_size") or config.get("vocab_size", facts["vocab_size"])),
            feature_dim=(len(eagle3_layers(config, facts["num_hidden_layers"])) * int(config.get("target_hidden_size") or hidden))
            if kind == "eagle3" else 2 * hidden,
            fc_bias=bool(config.get("bias", kind == "eagle")),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise ModelSourceError(f"'{where / CONFIG}' lacks a usable {error} for an EAGLE layer; the head checkpoint is damaged") from error
    target_hidden = int(config.get("target_hidden_size") or hidden)
    if target_hidden != facts["hidden_size"]:
        raise mismatch(where, "hidden size", target_hidden, facts["hidden_size"])
    if shape.vocab != facts["vocab_size"]:
        raise mismatch(where, "vocabulary size", shape.vocab, facts["vocab_size"])
    return shape


def eagle3_layers(config: dict[str, Any], target_layers: int) -> tuple[int, ...]:
    """The target's hidden states EAGLE-3 fuses, as transformers' hidden_states indices (the input
    of each layer). Default (2, L//2, L-3), as in EAGLE, vLLM and SGLang; ids given in the config
    (eagle_config.eagle_aux_hidden_state_layer_ids) are read as vLLM reads them."""
    given = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or config.get(
        "eagle_aux_hidden_state_layer_ids"
    )
    return tuple(int(i) for i in given) if given else (2, target_layers // 2, target_layers - 3)


def eagle_module(config: dict[str, Any], kind: str, target: nn.Module, where: Path) -> EagleHead:
    """An EAGLE layer shaped by `config` (checked against the target), with its rotary embedding."""
    from transformers import LlamaConfig

    shape = eagle_shape(config, kind, target, where)
    rope_keys = ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings", "partial_rotary_factor")
    rope_config = LlamaConfig(
        hidden_size=shape.hidden, num_attention_heads=shape.heads, head_dim=shape.head_dim,
        **{k: config[k] for k in rope_keys if config.get(k) is not None},
    )
    return EagleHead(kind, shape, rope_config)


def feature_layers(kind: str, target: nn.Module, config: dict[str, Any] | None = None) -> tuple[int, ...]:
    """The target's hidden states a head of `kind` reads (transformers' hidden_states indices):
    Medusa and EAGLE the final norm's output ([L]), EAGLE-3 three layers' inputs (eagle3_layers)."""
    layers = target_facts(target)["num_hidden_layers"]
    return eagle3_layers(config or {}, layers) if kind == "eagle3" else (layers,)


def build_eagle(config: dict[str, Any], state: dict[str, torch.Tensor], kind: str, target: nn.Module, where: Path) -> EagleHead:
    facts = target_facts(target)
    module = eagle_module(config, kind, target, where)
    shape = module.shape
    if kind == "eagle3":
        layers = eagle3_layers(config, facts["num_hidden_layers"])
        if max(layers) > facts["num_hidden_layers"] or min(layers) < 0:
            raise mismatch(where, "layers", f"{list(layers)} to read", f"{facts['num_hidden_layers']} layers")
        if shape.hidden != facts["hidden_size"] and "embed_tokens.weight" not in state:
            raise ModelSourceError(f"'{where}': a head of another width than its target needs its own embed_tokens.weight")
        if "t2d" not in state:  # inference needs only d2t; some writers keep just that
            state = {**state, "t2d": module.t2d}
    load_state(module, state, where)
    if kind == "eagle3":
        mapped = torch.arange(shape.draft_vocab) + module.d2t
        if int(mapped.min()) < 0 or int(mapped.max()) >= facts["vocab_size"]:
            raise ModelSourceError(f"'{where}': d2t maps draft tokens outside the target's {facts['vocab_size']} ids; the head checkpoint is damaged")
    embed = state.get("embed_tokens.weight")
    if embed is not None and shape.hidden != facts["hidden_size"]:
        module.own_embeddings = nn.Embedding.from_pretrained(embed)
    return module


# --------------------------------------------------------------------------- the one entry point


def load_head(reference: str, target: nn.Module, *, kind: str, allow_pickle: bool = False) -> tuple[nn.Module, dict[str, Any]]:
    """The head at `reference` (for drafter `kind`: medusa or eagle), checked against `target`,
    on the target's device in its dtype; with the config it came with."""
    from ..models.properties import input_device

    folder = resolve_folder(reference, kind)
    config = read_config(folder)
    check_target(config, target, folder)
    if "medusa_num_heads" in config:
        state = read_weights(folder, MEDUSA_WEIGHTS, allow_pickle)
        module: nn.Module = build_medusa(config, state, target, folder)
    else:
        state = read_weights(folder, EAGLE_WEIGHTS, allow_pickle)
        module = build_eagle(config, state, head_kind(config, state), target, folder)
    dtype = target.dtype
    return module.to(device=input_device(target), dtype=dtype).eval(), config


def save_head(module: nn.Module, folder: Path, config: dict[str, Any]) -> None:
    """Write config.json and the weights in the published layout, each file replaced atomically
    (a reader sees the old file or the new one, never half of one); weights first."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(module, MedusaHeads):
        state, weights = dict(module.heads.state_dict()), MEDUSA_WEIGHTS[0]
        if module.draft_ids is not None:
            state[DRAFT_IDS] = module.draft_ids.long()
    else:
        state, weights = module.state_dict(), EAGLE_WEIGHTS[0]
    state = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    replace_atomically(folder / weights, lambda path: save_file(state, str(path)))
    replace_atomically(folder / CONFIG, lambda path: Path(path).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8"))
