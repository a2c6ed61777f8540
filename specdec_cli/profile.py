"""YAML profiles -> frozen dataclasses, validated key by key.

Every error is a ProfileError whose message names the file, the key and what is allowed, e.g.
``profiles/x.yaml: drafter.kind: 'modle' is not one of model, ngram, early-exit, medusa, eagle, chain``.
A file with several problems gets one error listing them all, one line each under a first line
that names the file and the count. The value types themselves live in specs.py.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Literal

import yaml

from .drafters.registry import DEFAULT_CHAIN, REGISTRY, Option
from .errors import ProfileError
from .specs import AUTO_TREE, MAX_K, AdaptiveSpec, DrafterSpec, ModelSpec, Profile, SamplingSpec, TreeSpec

DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
MAX_PROFILE_BYTES = 1 << 20
PROFILE_SUFFIXES = (".yaml", ".yml")


# --------------------------------------------------------------------------- value checks
# Each check takes (value, where) and returns the clean value or raises ProfileError(where: ...).


def _type_name(t: type) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[t]


def check_type(value: Any, where: str, t: type) -> Any:
    # YAML `yes` is a bool, and bool is an int in Python: never accept it for a number
    if t is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise ProfileError(f"{where}: {str(value)[:12]}... is too large a number") from None
    if isinstance(value, bool) and t is not bool or not isinstance(value, t):
        raise ProfileError(f"{where}: {value!r} is not {_type_name(t)}")
    return value


def check_choice(value: Any, where: str, choices: tuple) -> Any:
    if value not in choices:
        shown = ", ".join("null" if c is None else str(c) for c in choices)
        raise ProfileError(f"{where}: {value!r} is not one of {shown}{did_you_mean(value, choices)}")
    return value


def did_you_mean(value: Any, choices: tuple) -> str:
    """' (did you mean X?)' when a choice is close to the given text, else ''."""
    named = [str(c) for c in choices if isinstance(c, str)]
    guess = difflib.get_close_matches(str(value), named, n=1) if isinstance(value, str) else []
    return f" (did you mean {guess[0]}?)" if guess else ""


def check_int(value: Any, where: str, minimum: int | None = None, maximum: int | None = None) -> int:
    value = check_type(value, where, int)
    if minimum is not None and value < minimum:
        raise ProfileError(f"{where}: {value} is below the minimum of {minimum}")
    if maximum is not None and value > maximum:
        raise ProfileError(f"{where}: {value} is above the maximum of {maximum}")
    return value


def check_k(value: Any, where: str) -> int | Literal["auto"]:
    if value == "auto":
        return "auto"
    if isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]{1,6}\s*", value):  # ASCII digits only, not '²'
        value = int(value)  # a negative k then gets the same "below the minimum" message as 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProfileError(f"{where}: {value!r} is not a whole number of tokens or 'auto'")
    return check_int(value, where, 1, MAX_K)


MIN_TEMPERATURE = 1e-4  # below this, logits / T overflows float32 on the way to the argmax anyway


def check_temperature(value: Any, where: str) -> float:
    value = check_type(value, where, float)
    if not (value >= 0.0) or value == float("inf"):
        raise ProfileError(f"{where}: {value} must be 0 (greedy) or a positive number")
    if 0.0 < value < MIN_TEMPERATURE:
        raise ProfileError(f"{where}: {value} is too small to sample with; use 0 for greedy, or at least {MIN_TEMPERATURE}")
    return value


def check_top_p(value: Any, where: str) -> float:
    value = check_type(value, where, float)
    if not (0.0 < value <= 1.0):
        raise ProfileError(f"{where}: {value} must be in (0, 1]")
    return value


def check_threshold(value: Any, where: str) -> float:
    value = check_type(value, where, float)
    if not (0.0 <= value < 1.0):
        raise ProfileError(f"{where}: {value} must be in [0, 1)")
    return value


def check_device(value: Any, where: str) -> str:
    value = check_type(value, where, str)
    base, _, index = value.partition(":")
    if base not in ("auto", "cpu", "cuda", "mps") or (index and not (base == "cuda" and index.isdigit())):
        raise ProfileError(f"{where}: {value!r} is not one of auto, cpu, cuda, cuda:N, mps")
    return value


TREE_KEYS = ("nodes", "width", "depth", "auto")
DEFAULT_TREE = {"nodes": 16, "width": 4, "depth": 6}
MAX_TREE_WIDTH = 16


def check_tree(value: Any, where: str) -> TreeSpec | None:
    """`tree:` null/off/chain (a chain of k), auto, {nodes, width, depth[, auto]}, or from the
    command line "N" (nodes) / "N/W/D" (or "N,W,D", the older spelling)."""
    if value is None or value in ("off", "chain", "null"):
        return None
    if value == "auto":
        return AUTO_TREE
    if isinstance(value, int) and not isinstance(value, bool):
        value = {"nodes": value}
    if isinstance(value, str):
        parts = re.split(r"[/,]", value)
        if len(parts) not in (1, 3) or not all(re.fullmatch(r"\s*[0-9]{1,4}\s*", part) for part in parts):
            raise ProfileError(f"{where}: {value!r} is not auto, off, NODES or NODES/WIDTH/DEPTH (e.g. 16 or 16/4/6)")
        numbers = [int(part) for part in parts]
        value = {"nodes": numbers[0]} if len(numbers) == 1 else dict(zip(("nodes", "width", "depth"), numbers))
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: {value!r} is not null, auto or a mapping {{nodes, width, depth}}")
    unknown = [shown_key(key) for key in value if key not in TREE_KEYS]
    if unknown:
        raise ProfileError(f"{where}: unknown key {unknown[0]} (known: {', '.join(TREE_KEYS)})")
    fields = {**DEFAULT_TREE, **{k: v for k, v in value.items() if k != "auto"}}
    nodes = check_int(fields["nodes"], f"{where}.nodes", 1, MAX_K)
    width = check_int(fields["width"], f"{where}.width", 1, MAX_TREE_WIDTH)
    depth = check_int(fields["depth"], f"{where}.depth", 1, MAX_K)
    auto = check_type(value.get("auto", False), f"{where}.auto", bool)
    return TreeSpec(nodes, width, min(depth, nodes), auto)


def check_compile(value: Any, where: str) -> str:
    # YAML reads a bare `off` / `on` as a boolean
    named = {False: "off", True: "on"}.get(value, value) if isinstance(value, bool) else value
    return check_choice(named, where, COMPILE_MODES)


def check_chat(value: Any, where: str) -> bool | Literal["auto"]:
    if value == "auto" or isinstance(value, bool):
        return value
    raise ProfileError(f"{where}: {value!r} is not one of auto, true, false")


def check_nonempty_str(value: Any, where: str) -> str:
    value = check_type(value, where, str)
    if not value.strip():
        raise ProfileError(f"{where}: must not be empty")
    return value


def check_optional_str(value: Any, where: str) -> str | None:
    return None if value is None else check_nonempty_str(value, where)


# --------------------------------------------------------------------------- mappings


def shown_key(key: Any) -> str:
    """A key as a one-line message can show it: escaped when it holds newlines or control characters."""
    text = str(key)
    return text if text.isprintable() else repr(text)


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


MODEL_KEYS = ("model", "revision", "gguf_file", "dtype")


def _model_spec(s: _Section, default_dtype: str = "auto") -> ModelSpec:
    return ModelSpec(
        model=s.require("model", check_nonempty_str),
        revision=s.get("revision", None, check_optional_str),
        gguf_file=s.get("gguf_file", None, check_optional_str),
        dtype=s.get("dtype", default_dtype, check_choice, DTYPES),
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
    allowed += ("drafters",) if entry.takes_drafters else ()
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
        listed = s.get("drafters", list(DEFAULT_CHAIN))
        if not isinstance(listed, list) or not listed:
            problems.add(f"{s.where('drafters')}: must be a non-empty list of drafters")
            listed = []
        children = tuple(
            _drafter_spec(d, problems, f"{s.where('drafters')}[{i}]", target_dtype, nested=True)
            for i, d in enumerate(listed)
        )
    return DrafterSpec(kind=kind, options=options, model=model, drafters=children)


TOP_KEYS = (
    "name", "description", "target", "drafter", "device", "device_map", "k", "adaptive",
    "sampling", "max_new_tokens", "chat", "compile", "trust_remote_code", "allow_pickle", "tree",
)
COMPILE_MODES = ("off", "auto", "on")


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
        source=source,
    )
    problems.raise_if_any()
    return Profile(**fields)


# --------------------------------------------------------------------------- files


def shipped_profiles_dir() -> Path:
    """The profiles that come with the package (specdec_cli/profiles links to the top-level profiles/)."""
    return Path(__file__).resolve().parent / "profiles"


def user_config_dir() -> Path:
    if os.environ.get("SPECDEC_CONFIG_DIR"):
        return Path(os.environ["SPECDEC_CONFIG_DIR"]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "specdec"


def user_profiles_dir() -> Path:
    return user_config_dir() / "profiles"


def profile_search_dirs() -> list[Path]:
    """Where `-p NAME` looks, first match wins: the user's own (tuned copies), then the shipped ones."""
    return [user_profiles_dir(), shipped_profiles_dir()]


def list_profiles() -> list[Path]:
    """Every profile file a name can reach, one per name, in search order."""
    seen: dict[str, Path] = {}
    for folder in profile_search_dirs():
        if folder.is_dir():
            for path in sorted(folder.iterdir()):
                if path.suffix in PROFILE_SUFFIXES and path.stem not in seen:
                    seen[path.stem] = path
    return sorted(seen.values(), key=lambda p: p.stem)


def resolve_profile_path(name_or_path: str) -> Path:
    """A path as given when it looks like one or exists; otherwise a profile name in the search dirs."""
    candidate = Path(name_or_path).expanduser()
    looks_like_path = os.sep in name_or_path or candidate.suffix in PROFILE_SUFFIXES
    if candidate.exists() or looks_like_path:
        return candidate
    for folder in profile_search_dirs():
        for suffix in PROFILE_SUFFIXES:
            if (folder / f"{name_or_path}{suffix}").is_file():
                return folder / f"{name_or_path}{suffix}"
    names = ", ".join(p.stem for p in list_profiles()) or "none"
    raise ProfileError(f"no profile named '{name_or_path}' (shipped and yours: {names}); or give a path to a .yaml file")


def read_profile_text(path: Path) -> str:
    label = str(path)
    if not path.exists():
        raise ProfileError(f"{label}: no such file")
    if path.is_dir():
        raise ProfileError(f"{label}: is a directory, not a profile file (a model folder holds a config.json: give it with --target)")
    if not path.is_file():  # a FIFO blocks the reader and /dev/zero never ends: never open those
        raise ProfileError(f"{label}: is not a regular file (a device, pipe or socket), not a profile file")
    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_PROFILE_BYTES + 1)  # bounded, whatever the file claims
    except OSError as exc:
        raise ProfileError(f"{label}: cannot be read ({exc.strerror or exc})") from None
    if len(raw) > MAX_PROFILE_BYTES:
        raise ProfileError(f"{label}: is too large for a profile (limit {MAX_PROFILE_BYTES} bytes)")
    if b"\0" in raw:
        raise ProfileError(f"{label}: is a binary file, not YAML")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{label}: is not UTF-8 text (byte {exc.start})") from None


def parse_yaml(text: str, label: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.constructor.ConstructorError as exc:
        problem = (getattr(exc, "problem", "") or str(exc)).strip()
        if "could not determine a constructor" in problem:
            raise ProfileError(f"{label}: YAML tags are not allowed in a profile ({problem})") from None
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ProfileError(f"{label}: not valid YAML{at}: {problem}") from None
    except (ValueError, TypeError, AttributeError, LookupError, OverflowError) as exc:
        # PyYAML's scalar constructors let these escape: an impossible date, `!!float abc`, huge ints
        raise ProfileError(f"{label}: not valid YAML: a value cannot be read ({exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise ProfileError(f"{label}: not valid YAML{at}: {problem}") from None
    except RecursionError:
        raise ProfileError(f"{label}: YAML nested too deeply") from None


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
) -> Profile:
    """The profile with command-line values in place of its own, validated like the file's."""
    changes: dict[str, Any] = {}
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
    s = profile.sampling
    changes["sampling"] = SamplingSpec(
        temperature=s.temperature if temperature is None else check_temperature(temperature, "--temperature"),
        top_k=s.top_k if top_k is None else check_int(top_k, "--top-k", 0),
        top_p=s.top_p if top_p is None else check_top_p(top_p, "--top-p"),
    )
    return replace(profile, **changes)


# the drafter kinds whose one required option names a folder that --draft can give
HEAD_KINDS = {"medusa": "heads", "eagle": "head"}


def with_models(
    profile: Profile, *, target: str | None = None, draft: str | None = None, drafter: str | None = None,
) -> Profile:
    """The profile with models from the command line, validated as a profile's keys are.

    --target M replaces the target (its dtype stays; revision and gguf_file were the old model's);
    --draft M makes the drafter `kind: model` over M (with --drafter medusa or eagle, M is the
    head folder); --drafter KIND makes it KIND with its default options. The result has no file
    behind it (tune-k --write has nothing to write to) and, with a new target, that model's name.
    """
    if target is None and draft is None and drafter is None:
        return profile
    data = profile_to_dict(profile)
    if target is not None:
        data["target"] = {"model": check_nonempty_str(target, "--target"), "dtype": profile.target.dtype}
        data["name"] = model_short_name(target)
    if draft is not None:
        check_nonempty_str(draft, "--draft")
    kind = "model" if drafter is None and draft is not None else drafter
    if kind is not None:
        data["drafter"] = drafter_from_options(kind, draft, profile.drafter)
    label = str(profile.source or profile.name)
    return replace(parse_profile(data, label, default_name=profile.name), source=None)


def drafter_from_options(kind: str, draft: str | None, current: DrafterSpec) -> dict[str, Any]:
    """--drafter KIND [--draft M] in profile syntax; a profile's drafter of the same kind keeps
    its model or head when --draft does not name another."""
    check_choice(kind, "--drafter", tuple(REGISTRY))
    same = current.kind == kind
    if kind == "model":
        if draft is None and not same:
            raise ProfileError("--drafter model: name the draft model with --draft MODEL (a hub id or a folder)")
        return {"kind": "model", "model": draft} if draft is not None else drafter_to_dict(current)
    if kind in HEAD_KINDS:
        if draft is None and not same:
            raise ProfileError(f"--drafter {kind}: name the head folder with --draft DIR (specdec train-draft --kind {kind} writes one)")
        folder = draft if draft is not None else current.options[HEAD_KINDS[kind]]
        return {"kind": kind, HEAD_KINDS[kind]: folder}
    if draft is not None:
        raise ProfileError(f"--draft: a draft model goes with --drafter model (or a head folder with medusa or eagle), not --drafter {kind}")
    return {"kind": kind}


def model_short_name(model: str) -> str:
    """A model id or folder as a profile name: its last part, safe in a file name."""
    last = Path(model.rstrip("/\\")).name or "model"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", last)


def _with_draft_dtype(spec: DrafterSpec, dtype: str) -> DrafterSpec:
    model = replace(spec.model, dtype=dtype) if spec.model else None
    return replace(spec, model=model, drafters=tuple(_with_draft_dtype(d, dtype) for d in spec.drafters))


def model_to_dict(spec: ModelSpec) -> dict[str, Any]:
    return {"model": spec.model, "revision": spec.revision, "gguf_file": spec.gguf_file, "dtype": spec.dtype}


def drafter_to_dict(spec: DrafterSpec) -> dict[str, Any]:
    """The drafter in profile syntax (options beside `kind`), so that the result reads back."""
    data: dict[str, Any] = {"kind": spec.kind, **spec.options}
    if spec.model is not None:
        data.update(model_to_dict(spec.model))
    if spec.drafters:
        data["drafters"] = [drafter_to_dict(d) for d in spec.drafters]
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
    }
