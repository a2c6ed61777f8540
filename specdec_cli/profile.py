"""YAML profiles -> frozen dataclasses, validated key by key.

Every error is a ProfileError whose message names the file, the key and what is allowed, e.g.
``profiles/x.yaml: drafter.kind: 'modle' is not one of model, ngram, early-exit, medusa, eagle, chain``.
A file with several problems gets one error listing them all, one line each under a first line
that names the file and the count. The value types themselves live in specs.py.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from .constraints.grammars import to_mapping
from .drafter_kinds import DEFAULT_CHAIN, REGISTRY, Option
from .errors import ProfileError
from .profile_checks import (
    check_chat,
    check_choice,
    check_compile,
    check_constraint,
    check_device,
    check_group_size,
    check_int,
    check_k,
    check_k_by_batch_size,
    check_nonempty_str,
    check_optional_str,
    check_quantize,
    check_temperature,
    check_threshold,
    check_top_p,
    check_tree,
    check_type,
    did_you_mean,
    shown_key,
)
from .profile_files import parse_yaml, read_profile_text, resolve_profile_path
from .specs import (
    DEFAULT_GROUP_SIZE,
    MAX_K,
    AdaptiveSpec,
    ConstraintSpec,
    DrafterSpec,
    ModelSpec,
    Profile,
    SamplingSpec,
    TreeSpec,
)

DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


# --------------------------------------------------------------------------- mappings


def key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class Problems:
    """Every problem found in one document, each as `key.path: what is wrong`, reported together."""

    def __init__(self, label: str):
        self.label = label
        self.found: list[str] = []

    def add(self, problem: str) -> None:
        self.found.append(problem)

    def checked(self, check: Callable[..., Any], value: Any, where: str, *args: Any) -> tuple[bool, Any]:
        """(True, the clean value), or (False, None) with the check's complaint recorded."""
        try:
            return True, check(value, where, *args)
        except ProfileError as exc:
            self.add(str(exc))
            return False, None

    def raise_if_any(self) -> None:
        """One ProfileError: one problem on one line; several as a count, then one line each."""
        if len(self.found) == 1:
            raise ProfileError(f"{self.label}: {self.found[0]}")
        if self.found:
            listed = "\n".join(f"  {problem}" for problem in self.found)
            raise ProfileError(f"{self.label}: {len(self.found)} errors in this profile:\n{listed}")


def unknown_key_problem(where: str, key: Any, allowed: tuple[str, ...]) -> str:
    return f"{where}: unknown key{did_you_mean(str(key), allowed)}; allowed here: {', '.join(allowed)}"


class _Section:
    """A YAML mapping being read: every key must be known, and problems carry the key path.

    A bad value is recorded and its default returned, so that reading goes on to the next key;
    a section that is not a mapping at all is recorded once and then reads as empty and silent.
    """

    def __init__(self, data: Any, problems: Problems, path: str, allowed: tuple[str, ...]):
        self.problems, self.path = problems, path
        self.failed: set[str] = set()  # keys whose value was bad (their default stands in)
        self.valid = isinstance(data, dict)
        if not self.valid:
            kind = "empty" if data is None else f"a {type(data).__name__}"
            problems.add(f"{path + ': ' if path else ''}must be a mapping of keys to values, not {kind}")
            data = {}
        for key in data:
            if key not in allowed:
                problems.add(unknown_key_problem(key_path(path, shown_key(key)), key, allowed))
        self.data = data

    def where(self, key: str) -> str:
        return key_path(self.path, key)

    def get(self, key: str, default: Any, check: Callable[..., Any] | None = None, *args: Any) -> Any:
        if key not in self.data:
            return default
        if check is None:
            return self.data[key]
        ok, value = self.problems.checked(check, self.data[key], self.where(key), *args)
        if not ok:
            self.failed.add(key)
        return value if ok else default

    def require(self, key: str, check: Callable[..., Any], *args: Any) -> Any:
        """The checked value, or None after recording why there is none."""
        if key not in self.data or self.data[key] is None:
            if self.valid:
                self.problems.add(f"{self.where(key)}: required")
            self.failed.add(key)
            return None
        return self.get(key, None, check, *args)

    def section(self, key: str, allowed: tuple[str, ...]) -> "_Section":
        value = self.data.get(key)
        return _Section({} if value is None else value, self.problems, self.where(key), allowed)


MODEL_KEYS = ("model", "revision", "gguf_file", "dtype", "quantize", "group_size", "quantize_head")


def group_size_for(quantize: str, group_size: int | None) -> int | None:
    """int4's group size (its default when unset); None for the methods that have none."""
    return (group_size or DEFAULT_GROUP_SIZE) if quantize == "int4" else None


def _model_spec(s: _Section, default_dtype: str = "auto") -> ModelSpec:
    quantize = s.get("quantize", "none", check_quantize)
    group_size = s.get("group_size", None, check_group_size)
    if group_size is not None and quantize != "int4" and "quantize" not in s.failed:
        s.problems.add(f"{s.where('group_size')}: goes with quantize: int4 only (int8 keeps one scale per row); "
                       "remove it or set quantize: int4")
    quantize_head = s.get("quantize_head", False, check_type, bool)
    # with quantize: none it may name a GPTQ/AWQ int4 checkpoint's head, which only loading can tell
    if quantize_head and quantize == "int8" and "quantize" not in s.failed:
        s.problems.add(f"{s.where('quantize_head')}: goes with quantize: int4 (or a GPTQ/AWQ int4 checkpoint) only; "
                       "remove it or set quantize: int4")
    return ModelSpec(
        model=s.require("model", check_nonempty_str),
        revision=s.get("revision", None, check_optional_str),
        gguf_file=s.get("gguf_file", None, check_optional_str),
        dtype=s.get("dtype", default_dtype, check_choice, DTYPES),
        quantize=quantize,
        group_size=group_size_for(quantize, group_size),
        quantize_head=quantize_head,
    )


def check_option(value: Any, where: str, option: Option) -> Any:
    """A drafter option's value; null means the option's default (`min_ngram: null`)."""
    if value is None:
        return option.default
    if option.type is int:
        return check_int(value, where, option.minimum)
    if option.choices:
        return check_choice(value, where, option.choices)
    return check_type(value, where, option.type)


def _drafter_spec(data: Any, problems: Problems, path: str, target_dtype: str, nested: bool = False) -> DrafterSpec | None:
    """The drafter at `path`, or None when its kind is unknown (then its other keys mean nothing)."""
    if not isinstance(data, dict):
        _Section(data, problems, path, ("kind",))  # records the 'must be a mapping' problem
        return None
    kinds = tuple(k for k in REGISTRY if not (nested and REGISTRY[k].takes_drafters))
    kind = _Section({"kind": data.get("kind")}, problems, path, ("kind",)).require("kind", check_choice, kinds)
    if kind is None:
        return None
    entry = REGISTRY[kind]
    allowed = ("kind",) + (MODEL_KEYS if entry.takes_model else ()) + tuple(entry.options)
    allowed += (entry.members_key,) if entry.takes_drafters else ()
    s = _Section(data, problems, path, allowed)
    options = {
        name: s.require(name, check_option, opt) if opt.required else s.get(name, opt.default, check_option, opt)
        for name, opt in entry.options.items()
    }
    if kind == "ngram" and not s.failed & {"min_ngram", "max_ngram"} and options["min_ngram"] > options["max_ngram"]:
        problems.add(f"{s.where('min_ngram')}: {options['min_ngram']} is above max_ngram {options['max_ngram']}")
    model = _model_spec(s, target_dtype) if entry.takes_model else None
    children: tuple[DrafterSpec | None, ...] = ()
    if entry.takes_drafters:
        listed = s.get(entry.members_key, list(DEFAULT_CHAIN))
        if not isinstance(listed, list) or not listed:
            problems.add(f"{s.where(entry.members_key)}: must be a non-empty list of drafters")
            listed = []
        children = tuple(
            _drafter_spec(d, problems, f"{s.where(entry.members_key)}[{i}]", target_dtype, nested=True)
            for i, d in enumerate(listed)
        )
    return DrafterSpec(kind=kind, options=options, model=model, drafters=children)


TOP_KEYS = (
    "name", "description", "target", "drafter", "device", "device_map", "k", "adaptive",
    "sampling", "max_new_tokens", "chat", "compile", "trust_remote_code", "allow_pickle", "tree",
    "k_by_batch_size", "constraint",
)


def parse_profile(data: Any, label: str, default_name: str = "profile", source: Path | None = None) -> Profile:
    """Validate a loaded YAML document; `label` (usually the file path) starts the one ProfileError
    that lists every problem found."""
    problems = Problems(label)
    top = _Section(data, problems, "", TOP_KEYS)
    if not top.valid:
        problems.raise_if_any()
    target = _model_spec(top.section("target", MODEL_KEYS))
    drafter_data = top.get("drafter", None)
    if drafter_data is None:
        problems.add("drafter: required (e.g. drafter: {kind: ngram})")
    drafter = None if drafter_data is None else _drafter_spec(drafter_data, problems, "drafter", target.dtype)
    # a drafter that failed its own checks is None here (its problem is already recorded)
    reader = drafter and next((d.kind for d in (drafter, *drafter.drafters) if d and d.kind in HEAD_KINDS), None)
    if target.quantize_head and reader:
        problems.add(f"target.quantize_head: a {reader} drafter reads the target's output head in full precision; "
                     "remove quantize_head or choose another drafter")
    adaptive = top.section("adaptive", ("k_max", "threshold"))
    sampling = top.section("sampling", ("temperature", "top_k", "top_p"))
    fields = dict(
        name=top.get("name", default_name, check_nonempty_str),
        description=top.get("description", None, check_optional_str),
        target=target,
        drafter=drafter,
        device=top.get("device", "auto", check_device),
        device_map=top.get("device_map", None, check_choice, (None,) + DEVICE_MAPS),
        k=top.get("k", 5, check_k),
        k_by_batch_size=top.get("k_by_batch_size", None, check_k_by_batch_size),
        tree=top.get("tree", None, check_tree),
        adaptive=AdaptiveSpec(
            k_max=adaptive.get("k_max", AdaptiveSpec.k_max, check_int, 1, MAX_K),
            threshold=adaptive.get("threshold", AdaptiveSpec.threshold, check_threshold),
        ),
        sampling=SamplingSpec(
            temperature=sampling.get("temperature", 0.0, check_temperature),
            top_k=sampling.get("top_k", 0, check_int, 0),
            top_p=sampling.get("top_p", 1.0, check_top_p),
        ),
        max_new_tokens=top.get("max_new_tokens", 256, check_int, 1),
        chat=top.get("chat", "auto", check_chat),
        compile=top.get("compile", "auto", check_compile),
        trust_remote_code=top.get("trust_remote_code", False, check_type, bool),
        allow_pickle=top.get("allow_pickle", False, check_type, bool),
        constraint=top.get("constraint", None, check_constraint, source.parent if source is not None else None),
        source=source,
    )
    problems.raise_if_any()
    return Profile(**fields)


def load_profile(name_or_path: str | os.PathLike) -> Profile:
    """Read and validate a profile by name (`tiny`) or path (`./my.yaml`)."""
    try:
        path = resolve_profile_path(str(name_or_path))
    except (OSError, ValueError) as exc:  # a name too long for the file system, an embedded NUL
        raise ProfileError(f"profile '{str(name_or_path)[:60]}': {getattr(exc, 'strerror', None) or exc}") from None
    text = read_profile_text(path)
    data = parse_yaml(text, str(path))
    if data is None:
        raise ProfileError(f"{path}: is empty; a profile needs at least target and drafter")
    return parse_profile(data, str(path), default_name=path.stem, source=path)


# --------------------------------------------------------------------------- overrides


def with_overrides(
    profile: Profile,
    *,
    k: int | str | None = None,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    chat: bool | None = None,
    device: str | None = None,
    dtype: str | None = None,
    compile: str | None = None,
    tree: str | None = None,
    quantize: str | None = None,
    constraint: ConstraintSpec | None = None,
) -> Profile:
    """The profile with command-line values in place of its own, validated like the file's.
    `quantize` is the target's (a draft model keeps the profile's); `constraint` (checked where it
    was read: constraints.grammars.from_options) replaces the profile's."""
    changes: dict[str, Any] = {}
    if constraint is not None:
        changes["constraint"] = constraint
    if k is not None:
        changes["k"] = check_k(k, "--k")
    if max_new_tokens is not None:
        changes["max_new_tokens"] = check_int(max_new_tokens, "--max-new-tokens", 1)
    if chat is not None:
        changes["chat"] = chat
    if compile is not None:
        changes["compile"] = check_compile(compile, "--compile")
    if tree is not None:
        changes["tree"] = check_tree(tree, "--tree")
    if device is not None:
        changes["device"] = check_device(device, "--device")
    if dtype is not None:
        check_choice(dtype, "--dtype", DTYPES)
        changes["target"] = replace(profile.target, dtype=dtype)
        changes["drafter"] = _with_draft_dtype(profile.drafter, dtype)
    if quantize is not None:
        method = check_quantize(quantize, "--quantize")
        target = changes.get("target", profile.target)
        changes["target"] = replace(target, quantize=method, group_size=group_size_for(method, target.group_size),
                                    quantize_head=target.quantize_head and method == "int4")
    s = profile.sampling
    changes["sampling"] = SamplingSpec(
        temperature=s.temperature if temperature is None else check_temperature(temperature, "--temperature"),
        top_k=s.top_k if top_k is None else check_int(top_k, "--top-k", 0),
        top_p=s.top_p if top_p is None else check_top_p(top_p, "--top-p"),
    )
    return replace(profile, **changes)


# the drafter kinds whose one required option names a folder that --draft can give
HEAD_KINDS = {"medusa": "heads", "eagle": "head"}


def _with_draft_dtype(spec: DrafterSpec, dtype: str) -> DrafterSpec:
    model = replace(spec.model, dtype=dtype) if spec.model else None
    return replace(spec, model=model, drafters=tuple(_with_draft_dtype(d, dtype) for d in spec.drafters))


def model_to_dict(spec: ModelSpec) -> dict[str, Any]:
    return {"model": spec.model, "revision": spec.revision, "gguf_file": spec.gguf_file, "dtype": spec.dtype,
            "quantize": spec.quantize, "group_size": spec.group_size, "quantize_head": spec.quantize_head}


def drafter_to_dict(spec: DrafterSpec) -> dict[str, Any]:
    """The drafter in profile syntax (options beside `kind`), so that the result reads back."""
    data: dict[str, Any] = {"kind": spec.kind, **spec.options}
    if spec.model is not None:
        data.update(model_to_dict(spec.model))
    if spec.drafters:
        data[spec.members_key] = [drafter_to_dict(d) for d in spec.drafters]
    return data


def tree_to_dict(tree: TreeSpec | None) -> dict[str, Any] | None:
    if tree is None:
        return None
    return {"nodes": tree.nodes, "width": tree.width, "depth": tree.depth, "auto": tree.auto}


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    """The resolved profile as plain data in profile syntax (for `profiles show` and JSON output)."""
    data: dict[str, Any] = {"name": profile.name}
    if profile.description is not None:
        data["description"] = profile.description
    return data | {
        "target": model_to_dict(profile.target),
        "drafter": drafter_to_dict(profile.drafter),
        "device": profile.device,
        "device_map": profile.device_map,
        "k": profile.k,
        "k_by_batch_size": dict(profile.k_by_batch_size) if profile.k_by_batch_size else None,
        "tree": tree_to_dict(profile.tree),
        "adaptive": {"k_max": profile.adaptive.k_max, "threshold": profile.adaptive.threshold},
        "sampling": {
            "temperature": profile.sampling.temperature,
            "top_k": profile.sampling.top_k,
            "top_p": profile.sampling.top_p,
        },
        "max_new_tokens": profile.max_new_tokens,
        "chat": profile.chat,
        "compile": profile.compile,
        "trust_remote_code": profile.trust_remote_code,
        "allow_pickle": profile.allow_pickle,
        "constraint": None if profile.constraint is None else to_mapping(profile.constraint),
    }
