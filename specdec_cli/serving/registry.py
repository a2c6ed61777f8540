"""Serving engines by name: the module that writes each one's settings, and the other names --to takes.

A new engine is one file under specdec_cli/serving/ defining `INFO` (a common.EngineInfo) and
`build(profile, k_choice, gpus) -> Export`, plus one line here. Modules are imported only when asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from types import ModuleType


@dataclass(frozen=True)
class EngineEntry:
    module: str  # file under specdec_cli/serving/
    aliases: tuple[str, ...] = ()  # other spellings --to accepts


REGISTRY: dict[str, EngineEntry] = {
    "vllm": EngineEntry("vllm"),
    "sglang": EngineEntry("sglang"),
    "llama.cpp": EngineEntry("llama_cpp", ("llamacpp", "llama-cpp")),
    "trt-llm": EngineEntry("trt_llm", ("tensorrt-llm", "trtllm")),
    "transformers": EngineEntry("hf_transformers", ("hf",)),
}

ENGINES = tuple(REGISTRY)  # in the order `--to all` writes them


def engine_module(name: str) -> ModuleType:
    """The module that writes engine `name` (a key of REGISTRY)."""
    return import_module(f"{__package__}.{REGISTRY[name].module}")


def canonical_name(value: str) -> str | None:
    """The registry's name for what --to was given (case and aliases aside); None if no engine has it."""
    name = value.strip().lower()
    if name in REGISTRY:
        return name
    return next((engine for engine, entry in REGISTRY.items() if name in entry.aliases), None)
