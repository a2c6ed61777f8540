"""transformers: a Python snippet calling `generate()` with assistant_model, prompt_lookup_num_tokens or
assistant_early_exit.

Named hf_transformers, not transformers: a file named transformers.py inside the package would be found
by `import transformers` whenever this folder is on sys.path (running a file here as a script, some
tools' import modes), hiding the real library.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..specs import DrafterSpec, Profile
from .common import EngineInfo, Export, NotCarriedError, common_not_carried, header_lines, py_str
from .k_choice import KChoice
from .refs import ModelRef, model_ref
from .selection import select_drafters


INFO = EngineInfo(
    "transformers", "transformers", "transformers 5.24",
    "transformers 5.24 generation/configuration_utils.py and candidate_generator.py (assistant knobs read from the assistant's generation_config)",
)


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


def _from_pretrained(ref: ModelRef, dtype: str, device_map: str, trust: bool) -> str:
    args = [py_str(ref.name)]
    if ref.spec.gguf_file:
        args.append(f"gguf_file={py_str(ref.spec.gguf_file)}")
    if ref.spec.revision:
        args.append(f"revision={py_str(ref.spec.revision)}")
    args.append(f"dtype={py_str(dtype)}")
    args.append(f"device_map={py_str(device_map)}")
    if trust:
        args.append("trust_remote_code=True")
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
    tokenizer_args = [py_str(target.name)]
    if target.spec.gguf_file:
        tokenizer_args.append(f"gguf_file={py_str(target.spec.gguf_file)}")
    if target.spec.revision:
        tokenizer_args.append(f"revision={py_str(target.spec.revision)}")
    int8_draft = chosen.model is not None and chosen.model.options.get("quantize") == "int8"
    lines = [
        *(["import torch"] if int8_draft else []),
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f"tokenizer = AutoTokenizer.from_pretrained({', '.join(tokenizer_args)})",
        f"model = {_from_pretrained(target, target.spec.dtype, device_map, trust)}",
    ]
    generate_kwargs: dict[str, Any] = {}
    assistant_config: dict[str, Any] = {}
    config: dict[str, Any] = {"model": target.name}
    if chosen.model is not None:
        draft = model_ref(chosen.model.model)
        int8 = int8_draft
        draft_dtype = "float32" if int8 else draft.spec.dtype  # int8 quantization starts from float32 weights
        lines.append(f"assistant = {_from_pretrained(draft, draft_dtype, 'cpu' if int8 else device_map, trust)}")
        if int8:
            lines += [
                "# drafter.quantize: int8: dynamic int8 Linear layers, on the CPU, as specdec quantizes its draft",
                "assistant = torch.ao.quantization.quantize_dynamic(assistant, {torch.nn.Linear}, dtype=torch.qint8)",
            ]
            config["assistant_quantize"] = "int8 (torch.ao.quantization.quantize_dynamic, CPU)"
        assistant_config = {"num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant",
                            "assistant_confidence_threshold": 0.0}
        lines.append("# transformers 5 reads these from the ASSISTANT's generation_config; passing them to generate() does nothing")
        lines += [f"assistant.generation_config.{key} = {json.dumps(value)}" for key, value in assistant_config.items()]
        config["assistant_model"] = draft.name
        generate_kwargs["assistant_model"] = "assistant"
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
        f"{key}={value}" if key == "assistant_model" else f"{key}={json.dumps(value)}" for key, value in generate_kwargs.items()
    ).replace("=false", "=False").replace("=true", "=True")
    lines += [
        "",
        prompt,
        *encode,
        f"output = model.generate(**inputs, {kwargs_text})",
        'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
    ]
    config["generate_kwargs"] = {key: ("<assistant>" if key == "assistant_model" else value) for key, value in generate_kwargs.items()}
    if assistant_config:
        config["assistant_generation_config"] = assistant_config
    notes = ["Python, not a shell command: run it with python"]
    return Export(INFO.name, INFO.version, "\n".join(lines), config, not_carried,
                  header_lines(profile, INFO, k_choice, notes))
