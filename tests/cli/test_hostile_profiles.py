"""Hostile profiles: random and malformed YAML, random nested data under the known keys.

The contract (profile.py's docstring): every failure is a ProfileError whose message starts with the
label (the file) and names the key path, e.g. ``x.yaml: drafter.kind: 'modle' is not one of ...``;
a file with several problems gets one error that lists them all, each naming its key path.
Nothing else may escape: the CLI turns any other exception into exit 1 and "unexpected ...".
"""

from __future__ import annotations

import copy
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_cli.drafter_kinds import REGISTRY
from specdec_cli.errors import ProfileError
from specdec_cli.profile import MODEL_KEYS, TOP_KEYS, load_profile, parse_profile, profile_to_dict
from specdec_cli.profile_files import parse_yaml

LABEL = "some dir/prof.yaml"
FAST = settings(max_examples=250, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# values people (and fuzzers) put in profiles: near-misses of the valid ones, and the extremes
HOSTILE_STRINGS = [
    "", " ", "\t", "auto", "5", " 7 ", "0x10", "²", "٣", "½", "1e3", "-1", "3.0", "cpu", "cuda", "cuda:0",
    "cuda:-1", "cuda:x", "mps", "float32", "fp16", "model", "ngram", "early-exit", "chain", "true", "null",
    "~", "\u202eevil", "😀", "a: b", "balanced", "yes",
]
HOSTILE_NUMBERS = [
    0, 1, -1, 2, 64, 65, 2**63, 10**400, -(10**400), 0.0, -0.0, 1e-300, 5e-324, 1e308, float("inf"),
    float("-inf"), float("nan"), 0.5, 1.0, 1.5, True, False,
]
NESTED_KEYS = sorted(
    set(MODEL_KEYS) | {"kind", "drafters", "k_max", "threshold", "temperature", "top_k", "top_p"}
    | {name for entry in REGISTRY.values() for name in entry.options}
)

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
    | st.sampled_from(HOSTILE_STRINGS) | st.sampled_from(HOSTILE_NUMBERS)
)
# keys of nested mappings: the known ones (so that validation goes deep) and junk; control characters
# are left to test_unknown_key_with_a_newline_gives_one_line
keys = (
    st.sampled_from(NESTED_KEYS)
    | st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), max_size=6)
    | st.integers(-2, 2) | st.none() | st.booleans()
)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=4), max_leaves=10
)
kinds = st.sampled_from(list(REGISTRY)) | scalars
model_section = st.fixed_dictionaries({}, optional={k: scalars for k in MODEL_KEYS})
leaf_drafter = st.fixed_dictionaries(
    {"kind": kinds},
    optional={name: scalars for name in ("max_ngram", "min_ngram", "layers") + MODEL_KEYS},
)
drafter = st.fixed_dictionaries(
    {"kind": kinds},
    optional={
        **{name: scalars for name in ("max_ngram", "min_ngram", "layers") + MODEL_KEYS},
        "drafters": st.lists(leaf_drafter | values, max_size=3) | values,
    },
)
SECTIONS = {
    "target": model_section | values,
    "drafter": drafter | values,
    "adaptive": st.fixed_dictionaries({}, optional={"k_max": scalars, "threshold": scalars}) | values,
    "sampling": st.fixed_dictionaries({}, optional={"temperature": scalars, "top_k": scalars, "top_p": scalars}) | values,
}
profile_data = st.fixed_dictionaries(
    {}, optional={**{key: SECTIONS.get(key, scalars | values) for key in TOP_KEYS}, "temprature": scalars}
)


def problems_in(message: str, label: str) -> list[str]:
    """The problems a ProfileError lists: one on the label's line, or several under a first line
    that gives the label and their count, one indented line each."""
    first, *rest = message.split("\n")
    assert first.startswith(f"{label}: "), message
    if not rest:
        return [first[len(label) + 2:]]
    assert first == f"{label}: {len(rest)} errors in this profile:", message
    assert len(rest) >= 2 and all(line.startswith("  ") and line.strip() for line in rest), message
    return [line[2:] for line in rest]


def key_named(message: str, label: str, prefixes) -> None:
    """Each problem names one of the key paths `prefixes` first (followed by ':', '.' or '[')."""
    for problem in problems_in(message, label):
        assert any(re.match(re.escape(p) + r"[:.\[]", problem) for p in prefixes), (message, prefixes)


# --------------------------------------------------------------------------- random data under the known keys


@FAST
@given(data=profile_data)
def test_random_profile_data_raises_only_profile_errors_naming_the_key(data):
    try:
        parse_profile(data, LABEL)
    except ProfileError as exc:
        # the key at fault is one given (or a required one that is missing)
        key_named(str(exc), LABEL, [str(k) for k in data] + ["target", "drafter"])


@FAST
@given(data=values)
def test_random_documents_raise_only_profile_errors(data):
    try:
        parse_profile(data, LABEL)
    except ProfileError as exc:
        message = str(exc)
        assert message.startswith(f"{LABEL}: ")
        if not isinstance(data, dict):
            assert "must be a mapping" in message


VALID_PROFILES = [
    {
        "name": "ok", "description": "a valid profile",
        "target": {"model": "/models/t", "revision": None, "gguf_file": None, "dtype": "float32"},
        "drafter": {"kind": "ngram", "max_ngram": 3, "min_ngram": 1},
        "device": "cpu", "device_map": None, "k": 4, "adaptive": {"k_max": 8, "threshold": 0.4},
        "sampling": {"temperature": 0.7, "top_k": 5, "top_p": 0.9}, "max_new_tokens": 16, "chat": "auto",
        "trust_remote_code": False, "allow_pickle": False,
    },
    {
        "target": {"model": "/models/t"},
        "drafter": {"kind": "chain", "drafters": [{"kind": "ngram", "max_ngram": 4, "min_ngram": 2},
                                                   {"kind": "early-exit", "layers": 2},
                                                   {"kind": "model", "model": "/models/d", "dtype": "float16"}]},
        "k": "auto",
    },
    {"target": {"model": "org/model", "revision": "main"}, "drafter": {"kind": "model", "model": "org/small"}},
]


def leaf_paths(node: Any, path: tuple = ()) -> list[tuple]:
    paths = [path] if path else []
    if isinstance(node, dict):
        for key, value in node.items():
            paths += leaf_paths(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            paths += leaf_paths(value, path + (i,))
    return paths


def dotted(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


MUTATIONS = [(i, path) for i, profile in enumerate(VALID_PROFILES) for path in leaf_paths(profile)]
DELETE = object()


@pytest.mark.parametrize("index", range(len(VALID_PROFILES)))
def test_the_valid_profiles_are_valid(index):
    parse_profile(copy.deepcopy(VALID_PROFILES[index]), LABEL)


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(where=st.sampled_from(MUTATIONS), value=values | st.just(DELETE))
def test_one_bad_value_in_a_valid_profile_is_named_by_its_key_path(where, value):
    """Change one node of a valid profile: it still parses, or the error names that node's key path."""
    index, path = where
    data = copy.deepcopy(VALID_PROFILES[index])
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    if value is DELETE:
        if isinstance(parent, list):
            return
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    try:
        parse_profile(data, LABEL)
    except ProfileError as exc:
        # a new `kind` changes which keys are allowed beside it: then its mapping is named
        named = path[:-1] if path[-1] == "kind" else path
        key_named(str(exc), LABEL, [dotted(named)])


# --------------------------------------------------------------------------- random text


YAML_FRAGMENTS = [
    "k: ", "target: ", "drafter: ", "sampling: ", "description: ", "kind: ", "model: ", "\n", "  ", "- ", "{",
    "}", "[", "]", ": ", ", ", "'", '"', "#", "&a ", "*a", "? ", "|", ">", "---\n", "...\n", "%YAML 1.1\n",
    "!!str ", "!!int ", "!!float ", "!!bool ", "!!null ", "!!binary ", "!!timestamp ", "!!set ", "!!omap ",
    "!!python/name:os.system ", "!local ", "2001-12-14", "2001-13-45", "12:30:00", "0x1F", "0o17", "1_000",
    ".inf", "-.nan", "1e400", "9" * 5000, "yes", "~", "null", "auto", "ngram", "chain", "\t", "\\", "\ufeff",
    "\u2028", "😀", "\x7f", "\x85",
]
yaml_text = st.text(max_size=80) | st.lists(st.sampled_from(YAML_FRAGMENTS), max_size=14).map("".join)


@FAST
@given(text=yaml_text)
def test_random_text_raises_only_profile_errors(text):
    try:
        data = parse_yaml(text, LABEL)
        if data is not None:
            parse_profile(data, LABEL)
    except ProfileError as exc:
        assert str(exc).startswith(f"{LABEL}: "), str(exc)


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=200) | yaml_text.map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_random_file_bytes_raise_only_profile_errors(raw):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "random.yaml"
        path.write_bytes(raw)
        try:
            load_profile(path)
        except ProfileError as exc:
            assert str(exc).startswith(f"{path}: "), str(exc)


# --------------------------------------------------------------------------- documents known to be hostile


def load_text(tmp_path: Path, text: str) -> tuple[Path, Any]:
    path = tmp_path / "hostile.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        return path, load_profile(path)
    except ProfileError as exc:
        return path, exc


BASE = "target: {model: /models/t}\ndrafter: {kind: ngram}\n"
BIG = "1" * 400  # an integer too large for a float
HUGE = "9" * 5000  # past Python's 4300-digit limit for int(str)

YAML_LEVEL = {  # PyYAML's own constructors fail on these, before any key is looked at
    "impossible date": "description: 2001-13-45\n" + BASE,
    "!!float tag on a word": "description: !!float abc\n" + BASE,
    "!!int tag on a word": "description: !!int abc\n" + BASE,
    "!!timestamp tag on a word": "description: !!timestamp yesterday\n" + BASE,
    "5000-digit integer": f"max_new_tokens: {HUGE}\n" + BASE,
}


@pytest.mark.parametrize("name", YAML_LEVEL)
def test_unreadable_yaml_values_are_profile_errors(tmp_path, name):
    path, result = load_text(tmp_path, YAML_LEVEL[name])
    assert isinstance(result, ProfileError), result
    message = str(result)
    assert message.startswith(f"{path}: ") and "\n" not in message, message


VALUE_LEVEL = {  # (document, the key path the message must name)
    "integer temperature too large for a float": (f"sampling: {{temperature: {BIG}}}\n" + BASE, "sampling.temperature"),
    "integer top_p too large for a float": (f"sampling: {{top_p: {BIG}}}\n" + BASE, "sampling.top_p"),
    "integer threshold too large for a float": (f"adaptive: {{threshold: {BIG}}}\n" + BASE, "adaptive.threshold"),
    "k as a superscript digit": ('k: "²"\n' + BASE, "k"),
    "k as a fraction character": ('k: "½"\n' + BASE, "k"),
    "k as 5000 digits in quotes": (f'k: "{HUGE}"\n' + BASE, "k"),
}


@pytest.mark.parametrize("name", VALUE_LEVEL)
def test_bad_values_are_profile_errors_naming_the_key(tmp_path, name):
    text, key = VALUE_LEVEL[name]
    path, result = load_text(tmp_path, text)
    assert isinstance(result, ProfileError), result
    key_named(str(result), str(path), [key])


@pytest.mark.parametrize("option", ["min_ngram", "max_ngram"])
def test_null_ngram_option_is_the_default_or_an_error_naming_it(tmp_path, option):
    path, result = load_text(tmp_path, f"target: {{model: /m}}\ndrafter: {{kind: ngram, {option}: null}}\n")
    if isinstance(result, ProfileError):
        key_named(str(result), str(path), [f"drafter.{option}"])
    else:
        assert isinstance(result.drafter.options[option], int)  # the drafter needs a number to run


def test_unknown_key_with_a_newline_gives_one_line(tmp_path):
    path, result = load_text(tmp_path, '"bad\\nkey": 1\n' + BASE)
    assert isinstance(result, ProfileError)
    assert "\n" not in str(result), str(result)
    assert "unknown key" in str(result)


def test_unhashable_key_is_not_called_a_tag(tmp_path):
    path, result = load_text(tmp_path, "? [a, b]\n: 1\n" + BASE)
    assert isinstance(result, ProfileError)
    assert "tags are not allowed" not in str(result), str(result)


@pytest.mark.parametrize("text, key", [
    ("drafter: &d {kind: chain, drafters: [*d]}\ntarget: {model: /m}\n", "drafter.drafters[0].kind"),
    ("drafter: {kind: chain, drafters: []}\ntarget: {model: /m}\n", "drafter.drafters"),
    ("drafter: {kind: chain, drafters: [{kind: chain}]}\ntarget: {model: /m}\n", "drafter.drafters[0].kind"),
    ("drafter: {kind: ngram, min_ngram: 4, max_ngram: 2}\ntarget: {model: /m}\n", "drafter.min_ngram"),
    ("sampling: {temperature: .nan}\n" + BASE, "sampling.temperature"),
    ("sampling: {temperature: .inf}\n" + BASE, "sampling.temperature"),
    ("sampling: {top_p: -.inf}\n" + BASE, "sampling.top_p"),
    ("max_new_tokens: 1e400\n" + BASE, "max_new_tokens"),
    ("k: yes\n" + BASE, "k"),
    ("device: 'cuda:0 '\n" + BASE, "device"),
    ("target: {model: '   '}\ndrafter: {kind: ngram}\n", "target.model"),
    ("target: [a, b]\ndrafter: {kind: ngram}\n", "target"),
    ("target: {model: /m}\ndrafter: ngram\n", "drafter"),
    ("target: {model: /m}\ndrafter: {kind: ngram, layers: 2}\n", "drafter.layers"),
])
def test_structural_near_misses_name_the_key(tmp_path, text, key):
    path, result = load_text(tmp_path, text)
    assert isinstance(result, ProfileError), result
    key_named(str(result), str(path), [key])


def test_deep_nesting_and_alias_bombs_are_bounded(tmp_path):
    deep = "description: " + "[" * 20000 + "]" * 20000 + "\n" + BASE
    path, result = load_text(tmp_path, deep)
    assert isinstance(result, ProfileError) and str(result).startswith(f"{path}: ")
    # a billion laughs: aliases are shared references, so this is small in memory; still refused
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    path, result = load_text(tmp_path, "\n".join(lines) + "\n" + BASE)
    assert isinstance(result, ProfileError)
    key_named(str(result), str(path), [f"a{i}" for i in range(10)])


def test_odd_profile_names_are_profile_errors():
    # `-p NAME` with odd names never escapes the search dirs nor raises anything but ProfileError
    for name in ["../../etc/passwd", "..", ".", "a\0b", "x" * 300, "😀"]:
        try:
            load_profile(name)
        except ProfileError:
            pass
        except (ValueError, OSError) as exc:  # pragma: no cover - the failure this test looks for
            pytest.fail(f"-p {name!r}: {type(exc).__name__}: {exc}")


# --------------------------------------------------------------------------- every problem at once


def test_every_problem_in_a_file_is_reported_at_once(tmp_path):
    text = ("max_tokens: 10\ntemprature: 1\ntarget: {model: /m}\ndrafter: {kind: ngram, max_gram: 2}\n"
            "sampling: {temperature: -1, top_p: 2}\nk: 0\n")
    path, result = load_text(tmp_path, text)
    assert isinstance(result, ProfileError), result
    problems = problems_in(str(result), str(path))
    assert problems == [
        "max_tokens: unknown key (did you mean max_new_tokens?); allowed here: " + ", ".join(TOP_KEYS),
        "temprature: unknown key; allowed here: " + ", ".join(TOP_KEYS),
        "drafter.max_gram: unknown key (did you mean max_ngram?); allowed here: kind, max_ngram, min_ngram, solo_ngram, pool_tokens",
        "k: 0 is below the minimum of 1",
        "sampling.temperature: -1.0 must be 0 (greedy) or a positive number",
        "sampling.top_p: 2.0 must be in (0, 1]",
    ]


def test_one_problem_stays_one_line(tmp_path):
    path, result = load_text(tmp_path, "k: 0\n" + BASE)
    assert str(result) == f"{path}: k: 0 is below the minimum of 1"


@pytest.mark.parametrize("text, only", [
    # a bad max_ngram is not compared with min_ngram (its default would make a second, false complaint)
    ("target: {model: /m}\ndrafter: {kind: ngram, min_ngram: 4, max_ngram: x}\n", "drafter.max_ngram: "),
    # a section that is not a mapping is one problem, not also its missing keys
    ("target: [a]\ndrafter: {kind: ngram}\n", "target: must be a mapping"),
    # an unknown kind says nothing about the keys beside it
    ("target: {model: /m}\ndrafter: {kind: modle, max_gram: 2, model: /d}\n", "drafter.kind: 'modle'"),
])
def test_one_mistake_is_not_reported_twice(tmp_path, text, only):
    path, result = load_text(tmp_path, text)
    assert isinstance(result, ProfileError), result
    assert problems_in(str(result), str(path)) == [p for p in problems_in(str(result), str(path)) if p.startswith(only)]
    assert "\n" not in str(result), str(result)


def test_the_cli_prints_every_problem_under_one_error_line(capsys, tmp_path):
    path, _ = load_text(tmp_path, "max_tokens: 10\ntarget: {model: /m}\ndrafter: {kind: ngram, max_gram: 2}\n")
    code, out, err = run_cli(capsys, "generate", "hi", "-p", str(path))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert lines[0] == f"specdec: error: {path}: 2 errors in this profile:", err
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["max_tokens", "drafter.max_gram"], err


def test_profiles_show_keeps_the_description():
    data = copy.deepcopy(VALID_PROFILES[0])
    assert profile_to_dict(parse_profile(data, LABEL))["description"] == "a valid profile"
    assert "description" not in profile_to_dict(parse_profile(copy.deepcopy(VALID_PROFILES[1]), LABEL))


@pytest.mark.parametrize("text,problem", [
    ("k_by_batch_size: [5, 3]\n", "k_by_batch_size: must be a mapping of batch size to k, e.g. {1: 5, 4: 3, 16: 0}"),
    ("k_by_batch_size: {}\n", "k_by_batch_size: must be a mapping of batch size to k"),
    ("k_by_batch_size: {0: 3}\n", "k_by_batch_size: batch size 0 is not a whole number of at least 1"),
    ("k_by_batch_size: {one: 3}\n", "k_by_batch_size: batch size one is not a whole number of at least 1"),
    ("k_by_batch_size: {true: 3}\n", "k_by_batch_size: batch size True is not a whole number of at least 1"),
    ("k_by_batch_size: {1: -1}\n", "k_by_batch_size.1: -1 is below the minimum of 0"),
    ("k_by_batch_size: {1: 65}\n", "k_by_batch_size.1: 65 is above the maximum of 64"),
    ("k_by_batch_size: {1: auto}\n", "k_by_batch_size.1: 'auto' is not an integer"),
    ("k_by_batchsize: {1: 3}\n", "k_by_batchsize: unknown key (did you mean k_by_batch_size?)"),
])
def test_k_by_batch_size_problems_name_the_key(tmp_path, text, problem):
    path, result = load_text(tmp_path, text + BASE)
    assert isinstance(result, ProfileError), result
    assert str(result).startswith(f"{path}: {problem}"), str(result)
    assert "\n" not in str(result)


def test_k_by_batch_size_reads_sorted_and_shows_as_written(tmp_path):
    from specdec_cli.specs import k_for_batch_size

    path, profile = load_text(tmp_path, "k_by_batch_size: {16: 0, 1: 5, 4: 3}\n" + BASE)
    assert profile.k_by_batch_size == ((1, 5), (4, 3), (16, 0))
    assert profile_to_dict(profile)["k_by_batch_size"] == {1: 5, 4: 3, 16: 0}
    assert [k_for_batch_size(profile.k_by_batch_size, b) for b in (1, 3, 4, 15, 16, 500)] == [5, 5, 3, 3, 0, 0]
    assert k_for_batch_size(((4, 3),), 2) is None and k_for_batch_size(None, 8) is None
    assert load_text(tmp_path, BASE)[1].k_by_batch_size is None
