"""transformers: a Python snippet calling `generate()` with assistant_model (and, for a draft with another
tokenizer, tokenizer and assistant_tokenizer), prompt_lookup_num_tokens or assistant_early_exit.

Named hf_transformers, not transformers: a file named transformers.py inside the package would be found
by `import transformers` whenever this folder is on sys.path (running a file here as a script, some
tools' import modes), hiding the real library.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..specs import DrafterSpec, ModelSpec, Profile
from .common import EngineInfo, Export, NotCarriedError, common_not_carried, header_lines, py_str
from .k_choice import KChoice
from .refs import ModelRef, model_ref
from .selection import other_vocab, select_drafters

INFO = EngineInfo(
    "transformers", "transformers", "transformers 5.24",
    "transformers 5.24 generation/configuration_utils.py and candidate_generator.py (assistant knobs read from the assistant's generation_config)",
)


# Universal Assisted Generation, read in transformers 5.24 and 5.25 generation/utils.py:
# _get_candidate_generator picks AssistedCandidateGeneratorDifferentTokenizers (the draft's text re-encoded
# in the target's tokens) at do_sample=False and UniversalSpeculativeDecodingGenerator (the tokens both
# vocabularies share, AssistantToTargetTranslator) at do_sample=True; the assistant check refuses
# assistant_tokenizer when the two configs' vocab_size are equal
UNIVERSAL_SOURCE = ("tokenizer= and assistant_tokenizer=: Universal Assisted Generation (transformers 5.24 and 5.25 "
                    "generation/utils.py, _get_candidate_generator), whose rule follows do_sample, not drafter vocab: "
                    "greedy re-encodes the draft's text in the target's tokens (as vocab: text), sampling proposes the "
                    "tokens both vocabularies share (as vocab: intersect); generate() refuses assistant_tokenizer when "
                    "the two models' config vocab_size are equal")
# generate() arguments written as the snippet's Python variables, and how the JSON config names them
PY_VARIABLES = {"assistant_model": "<assistant>", "tokenizer": "<tokenizer>",
                "assistant_tokenizer": "<assistant_tokenizer>"}


def universal_rule(vocab: str, greedy: bool) -> str:
    """Which of transformers' two rules this profile's sampling gets, and whether it is the profile's own."""
    rule = "text" if greedy else "intersect"
    line = f"here ({'greedy' if greedy else 'sampled'}): transformers drafts as vocab: {rule} does"
    if vocab != rule:
        line += f", not as the profile's vocab: {vocab}"
        if vocab == "text":
            line += " (which specdec runs at temperature 0 only)"
    return line


def _tokenizer_args(ref: ModelRef) -> str:
    args = [py_str(ref.name)]
    if ref.spec.gguf_file:
        args.append(f"gguf_file={py_str(ref.spec.gguf_file)}")
    if ref.spec.revision:
        args.append(f"revision={py_str(ref.spec.revision)}")
    return ", ".join(args)


def _early_exit_layers(profile: Profile, member: DrafterSpec) -> int:
    layers = member.options.get("layers")
    if layers:
        return layers
    target = model_ref(profile.target)
    config_file = Path(target.name) / "config.json"
    if target.local and config_file.is_file():
        try:
            n_layers = int(json.loads(config_file.read_text(encoding="utf-8"))["num_hidden_layers"])
            return max(1, n_layers // 4)  # drafters/early_exit.default_layers
        except (ValueError, KeyError, TypeError, OSError):
            pass
    raise NotCarriedError(
        "transformers' assistant_early_exit needs a layer count: set drafter.layers in the profile (its default, a "
        "quarter of the target's layers, is known only once the model is loaded)")


def _torchao_config(spec: ModelSpec, device: str) -> tuple[list[str], str | None]:
    """The imports and the TorchAoConfig that quantize a model as specdec does (kernels/quantize.py:
    the same torchao configs; transformers leaves the output head unquantized, as specdec does)."""
    if spec.quantize == "none":
        return [], None
    if spec.quantize == "int8":
        return ["from torchao.quantization import Int8WeightOnlyConfig"], "TorchAoConfig(Int8WeightOnlyConfig())"
    cpu = f"PrototypeInt4WeightOnlyConfig(group_size={spec.group_size})"
    cuda = f'Int4WeightOnlyConfig(group_size={spec.group_size}, int4_packing_format="tile_packed_to_4d")'
    imports = {"cpu": ["from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig"],
               "cuda": ["from torchao.quantization import Int4WeightOnlyConfig"]}
    if device == "cpu":
        return imports["cpu"], f"TorchAoConfig({cpu})"
    if device.startswith("cuda"):
        return imports["cuda"], f"TorchAoConfig({cuda})"
    # int4's packing is per device: CPU (ATen's _weight_int4pack_mm_for_cpu) or CUDA (tinygemm)
    return ["import torch", *imports["cpu"], *imports["cuda"]], f"TorchAoConfig({cuda} if torch.cuda.is_available() else {cpu})"


def _load_dtype(spec: ModelSpec) -> str:
    """The dtype specdec loads in: int4 under dtype auto runs in bfloat16 (kernels/quantize.load_dtype)."""
    return "bfloat16" if spec.quantize == "int4" and spec.dtype == "auto" else spec.dtype


def _from_pretrained(ref: ModelRef, dtype: str, device_map: str, trust: bool, quantization: str | None = None) -> str:
    args = [py_str(ref.name)]
    if ref.spec.gguf_file:
        args.append(f"gguf_file={py_str(ref.spec.gguf_file)}")
    if ref.spec.revision:
        args.append(f"revision={py_str(ref.spec.revision)}")
    args.append(f"dtype={py_str(dtype)}")
    args.append(f"device_map={py_str(device_map)}")
    if trust:
        args.append("trust_remote_code=True")
    if quantization:
        args.append(f"quantization_config={quantization}")
    return f"AutoModelForCausalLM.from_pretrained({', '.join(args)})"


def build(profile: Profile, k_choice: KChoice, gpus: int = 1) -> Export:
    k = k_choice.k
    target = model_ref(profile.target)
    whole_lm = "generate()'s assistant_model is a whole causal LM, not a head over the target's hidden states"
    eagle = (f"transformers has no EAGLE drafter ({whole_lm}): run the head with specdec itself (`specdec generate`), "
             "or serve it with vLLM or SGLang")
    chosen = select_drafters(profile.drafter, INFO, {
        "medusa": f"transformers has no Medusa drafter ({whole_lm}): run these heads with specdec itself (`specdec generate`)",
        "eagle": eagle,
        "eagle3": eagle,
    })
    not_carried = chosen.not_carried + common_not_carried(profile, INFO, k_choice)
    device_map = profile.device_map or ("auto" if profile.device == "auto" else profile.device)
    trust = profile.trust_remote_code
    target_imports, target_quantization = _torchao_config(target.spec, profile.device)
    draft = model_ref(chosen.model.model) if chosen.model is not None else None
    draft_imports, draft_quantization = _torchao_config(draft.spec, profile.device) if draft else ([], None)
    quantized = bool(target_quantization or draft_quantization)
    lines = [
        *sorted(set(target_imports + draft_imports), key=lambda line: (not line.startswith("import "), line)),
        "from transformers import AutoModelForCausalLM, AutoTokenizer" + (", TorchAoConfig" if quantized else ""),
        "",
        f"tokenizer = AutoTokenizer.from_pretrained({_tokenizer_args(target)})",
        f"model = {_from_pretrained(target, _load_dtype(target.spec), device_map, trust, target_quantization)}",
    ]
    generate_kwargs: dict[str, Any] = {}
    assistant_config: dict[str, Any] = {}
    notes = ["Python, not a shell command: run it with python"]
    config: dict[str, Any] = {"model": target.name}
    if target_quantization:
        config["quantization"] = target_quantization
    if draft is not None:
        lines.append(f"assistant = {_from_pretrained(draft, _load_dtype(draft.spec), device_map, trust, draft_quantization)}")
        if draft_quantization:
            config["assistant_quantization"] = draft_quantization
        assistant_config = {"num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant",
                            "assistant_confidence_threshold": 0.0}
        lines.append("# transformers 5 reads these from the ASSISTANT's generation_config; passing them to generate() does nothing")
        lines += [f"assistant.generation_config.{key} = {json.dumps(value)}" for key, value in assistant_config.items()]
        config["assistant_model"] = draft.name
        generate_kwargs["assistant_model"] = "assistant"
        vocab = other_vocab(chosen.model)
        if vocab:
            lines.append(f"assistant_tokenizer = AutoTokenizer.from_pretrained({_tokenizer_args(draft)})")
            config["assistant_tokenizer"] = draft.name
            generate_kwargs.update(tokenizer="tokenizer", assistant_tokenizer="assistant_tokenizer")
            notes += [UNIVERSAL_SOURCE, universal_rule(vocab, profile.sampling.greedy)]
    elif chosen.ngram is not None:
        n = chosen.ngram.options
        generate_kwargs.update(prompt_lookup_num_tokens=k, max_matching_ngram_size=n["max_ngram"])
        if n["min_ngram"] > 1:
            not_carried.append(f"drafter min_ngram {n['min_ngram']} (transformers' prompt lookup falls back to 1-grams)")
    else:
        generate_kwargs["assistant_early_exit"] = _early_exit_layers(profile, chosen.early_exit)
    s = profile.sampling
    if s.greedy:
        generate_kwargs["do_sample"] = False
    else:
        generate_kwargs.update(do_sample=True, temperature=s.temperature)
        if s.top_k:
            generate_kwargs["top_k"] = s.top_k
        if s.top_p < 1.0:
            generate_kwargs["top_p"] = s.top_p
    generate_kwargs["max_new_tokens"] = profile.max_new_tokens
    if profile.compile == "on":
        not_carried.append("compile: on (specdec's static caches and compiled steps; generate() runs eagerly here)")
    if gpus > 1 and not profile.device_map:
        not_carried.append(f"--gpus {gpus} (set device_map in the profile to spread the target over GPUs)")
    prompt = 'prompt = "Write a Python function that reverses a linked list."'
    if profile.chat is False:
        encode = ['inputs = tokenizer(prompt, return_tensors="pt").to(model.device)']
    else:
        encode = [
            *(["if tokenizer.chat_template:  # chat: auto"] if profile.chat == "auto" else ["if True:  # chat: true"]),
            '    inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,',
            '                                           return_tensors="pt", return_dict=True).to(model.device)',
            *(["else:", '    inputs = tokenizer(prompt, return_tensors="pt").to(model.device)'] if profile.chat == "auto" else []),
        ]
    kwargs_text = ", ".join(
        f"{key}={value}" if key in PY_VARIABLES else f"{key}={json.dumps(value)}" for key, value in generate_kwargs.items()
    ).replace("=false", "=False").replace("=true", "=True")
    lines += [
        "",
        prompt,
        *encode,
        f"output = model.generate(**inputs, {kwargs_text})",
        'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
    ]
    config["generate_kwargs"] = {key: PY_VARIABLES.get(key, value) for key, value in generate_kwargs.items()}
    if assistant_config:
        config["assistant_generation_config"] = assistant_config
    return Export(INFO.name, INFO.version, "\n".join(lines), config, not_carried,
                  header_lines(profile, INFO, k_choice, notes))
