"""Hostile files: YAML tags that would run code, remote code, pickle checkpoints, and profile paths
that are not profiles (directories, empty, binary, non-UTF-8, huge, devices, FIFOs, junk model folders).

Every case ends in a one-line `specdec: error:` and exit 2 (exit 1 for a model that fails to load),
never a traceback, and nothing in the file is executed.
"""

from __future__ import annotations

import os
import pickle
import resource
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from profile_helpers import model_profile, write_profile
from specdec_cli import Pipeline
from specdec_cli.errors import ProfileError
from specdec_cli.profile import load_profile
from specdec_cli.profile_files import MAX_PROFILE_BYTES, user_profiles_dir
from cli_helpers import assert_one_line_error, run_cli

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- YAML tags


def tag_documents(marker: Path) -> dict[str, str]:
    """Profiles whose tags would create `marker` if any constructor ran them."""
    touch = f"touch {marker}"
    return {
        "object/apply os.system": f'!!python/object/apply:os.system ["{touch}"]\n',
        "object/apply in a key": f'target: {{model: !!python/object/apply:os.system ["{touch}"]}}\ndrafter: {{kind: ngram}}\n',
        "object/apply subprocess": f'drafter: !!python/object/apply:subprocess.check_call [["touch", "{marker}"]]\n',
        "object/new pathlib": f'target: !!python/object/new:pathlib.Path.touch [!!python/object/new:pathlib.Path ["{marker}"]]\n',
        "name os.system": "description: !!python/name:os.system\ntarget: {model: /m}\ndrafter: {kind: ngram}\n",
        "module os": "target:\n  model: !!python/module:os\ndrafter: {kind: ngram}\n",
        "local tag": "k: !custom 5\ntarget: {model: /m}\ndrafter: {kind: ngram}\n",
        "verbatim tag": f'k: !<tag:yaml.org,2002:python/object/apply:os.system> ["{touch}"]\n',
        "tag directive": f'%TAG !py! tag:yaml.org,2002:python/object/apply:\n---\nk: !py!os.system ["{touch}"]\n',
    }


@pytest.mark.parametrize("name", list(tag_documents(Path("/x"))))
def test_yaml_tags_are_refused_and_never_run(capsys, tmp_path, name):
    marker = tmp_path / "pwned"
    profile = tmp_path / "tagged.yaml"
    profile.write_text(tag_documents(marker)[name])
    code, out, err = run_cli(capsys, "generate", "hi", "-p", str(profile))
    assert code == 2 and out == ""
    assert_one_line_error(err, str(profile), "tags are not allowed")
    code, _, err = run_cli(capsys, "profiles", "show", str(profile))
    assert code == 2
    assert_one_line_error(err, "tags are not allowed")
    with pytest.raises(ProfileError, match="tags are not allowed"):
        Pipeline.from_profile(str(profile))
    assert not marker.exists()


def test_tagged_profile_in_the_config_dir_is_listed_as_invalid(capsys, tmp_path):
    marker = tmp_path / "pwned"
    folder = user_profiles_dir()
    folder.mkdir(parents=True)
    (folder / "evil.yaml").write_text(tag_documents(marker)["object/apply os.system"])
    code, out, err = run_cli(capsys, "profiles")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("evil\t"))
    assert "(invalid)" in row and "tags are not allowed" in row
    assert not marker.exists()


def test_listing_survives_every_hostile_file_in_the_config_dir(capsys, tmp_path):
    """One bad file among the user's profiles must not break `specdec profiles` for the rest."""
    folder = user_profiles_dir()
    folder.mkdir(parents=True)
    (folder / "date.yaml").write_text("description: 2024-13-45\ntarget: {model: /m}\ndrafter: {kind: ngram}\n")
    (folder / "binary.yaml").write_bytes(b"\x00\x01\x02")
    (folder / "latin.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    (folder / "empty.yaml").write_text("")
    (folder / "dir.yaml").mkdir()
    (folder / "hugeint.yaml").write_text(f"sampling: {{temperature: {'1' * 400}}}\ntarget: {{model: /m}}\ndrafter: {{kind: ngram}}\n")
    (folder / "good.yaml").write_text("target: {model: /m}\ndrafter: {kind: ngram}\n")
    code, out, err = run_cli(capsys, "profiles")
    assert code == 0, err
    rows = {line.split("\t")[0]: line for line in out.splitlines()}
    assert "(invalid)" not in rows["good"]
    for name in ("date", "binary", "latin", "empty", "dir", "hugeint"):
        assert "(invalid)" in rows[name], (name, out)


# --------------------------------------------------------------------------- remote code


def test_trust_remote_code_warns_naming_the_repo(capsys, tmp_path, llama_pair):
    profile = model_profile(tmp_path, llama_pair, trust_remote_code=True)
    code, out, err = run_cli(capsys, "generate", "hi", "-p", str(profile), "-f", "text", "-n", "4")
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "trust_remote_code" in line]
    assert any(str(llama_pair["target"]) in line for line in warnings), err
    assert any(str(llama_pair["draft"]) in line for line in warnings), err  # the draft is loaded the same way


def test_no_remote_code_warning_by_default(capsys, llama_profile):
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(llama_profile), "-f", "text", "-n", "4")
    assert code == 0 and "trust_remote_code" not in err


# --------------------------------------------------------------------------- pickle checkpoints


@pytest.fixture(scope="module")
def pickled_pair(tmp_path_factory, llama_pair):
    """The llama target saved with only pytorch_model.bin, plus a folder whose .bin would run code."""
    from tiny_models import save_pickle_only
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("pickled")
    model = AutoModelForCausalLM.from_pretrained(llama_pair["target"])
    tokenizer = AutoTokenizer.from_pretrained(llama_pair["target"])
    pickled = save_pickle_only(model, tokenizer, root / "llama-pickle")
    assert not list(pickled.glob("*.safetensors")) and (pickled / "pytorch_model.bin").is_file()
    evil = root / "evil-pickle"
    shutil.copytree(pickled, evil)
    return {"pickled": pickled, "evil": evil, "root": root}


class Touch:
    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_pickle_only_checkpoint_is_refused(capsys, tmp_path, pickled_pair):
    profile = write_profile(tmp_path, target={"model": str(pickled_pair["pickled"]), "dtype": "float32"},
                            drafter={"kind": "ngram"})
    code, out, err = run_cli(capsys, "generate", "hi", "-p", str(profile), "-f", "json")
    assert code == 2 and out == ""
    assert_one_line_error(err, str(pickled_pair["pickled"]), "pickle", "allow_pickle: true")


def test_pickle_draft_is_refused_too(capsys, tmp_path, llama_pair, pickled_pair):
    profile = model_profile(tmp_path, llama_pair, drafter={"kind": "model", "model": str(pickled_pair["pickled"])})
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(profile), "-f", "json")
    assert code == 2
    assert_one_line_error(err, str(pickled_pair["pickled"]), "allow_pickle")


def test_malicious_pickle_is_refused_without_being_opened(capsys, tmp_path, pickled_pair):
    marker = tmp_path / "pwned"
    (pickled_pair["evil"] / "pytorch_model.bin").write_bytes(pickle.dumps(Touch(marker)))
    profile = write_profile(tmp_path, target={"model": str(pickled_pair["evil"]), "dtype": "float32"},
                            drafter={"kind": "ngram"})
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(profile))
    assert code == 2
    assert_one_line_error(err, "pickle")
    assert not marker.exists()


def test_allow_pickle_loads_and_generates_the_same_tokens(capsys, tmp_path, llama_pair, pickled_pair):
    profile = write_profile(tmp_path, "pickle", target={"model": str(pickled_pair["pickled"]), "dtype": "float32"},
                            drafter={"kind": "ngram"}, allow_pickle=True)
    code, out, err = run_cli(capsys, "generate", "def add(a, b):", "-p", str(profile), "-f", "text", "--no-chat", "-n", "12")
    assert code == 0, err
    safe = write_profile(tmp_path, "safe", target={"model": str(llama_pair["target"]), "dtype": "float32"},
                         drafter={"kind": "ngram"})
    expected = Pipeline.from_profile(str(safe)).generate("def add(a, b):", chat=False, max_new_tokens=12).text
    assert out == expected + "\n"


@pytest.mark.parametrize("damage", ["random bytes", "truncated", "config not json", "no weights", "model is a file"])
def test_damaged_model_folders_are_one_line_errors(capsys, tmp_path, llama_pair, damage):
    folder = tmp_path / "damaged"
    shutil.copytree(llama_pair["target"], folder)
    weights = folder / "model.safetensors"
    if damage == "random bytes":
        weights.write_bytes(os.urandom(4096))
    elif damage == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "config not json":
        (folder / "config.json").write_text("{not json")
    elif damage == "no weights":
        weights.unlink()
    else:
        folder = weights
    profile = write_profile(tmp_path, target={"model": str(folder), "dtype": "float32"}, drafter={"kind": "ngram"})
    code, out, err = run_cli(capsys, "generate", "hi", "-p", str(profile))
    assert code in (1, 2) and out == ""
    assert_one_line_error(err)


# --------------------------------------------------------------------------- profile paths that are not profiles


def make_hostile_path(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"{kind.replace(' ', '-')}.yaml"
    if kind == "directory":
        path.mkdir()
    elif kind == "empty file":
        path.write_bytes(b"")
    elif kind == "comments only":
        path.write_text("# a profile with nothing in it\n\n")
    elif kind == "binary junk":
        path.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8)
    elif kind == "random bytes":
        path.write_bytes(b"\x00" + os.urandom(2000))
    elif kind == "non-utf8":
        path.write_bytes("name: caf\xe9\ntarget: {model: /m}\ndrafter: {kind: ngram}\n".encode("latin-1"))
    elif kind == "utf-16":
        path.write_text("target: {model: /m}\ndrafter: {kind: ngram}\n", encoding="utf-16")
    elif kind == "huge file":
        path.write_text("# padding\n" * (MAX_PROFILE_BYTES // 10 + 100) + "target: {model: /m}\ndrafter: {kind: ngram}\n")
    elif kind == "broken symlink":
        path.symlink_to(tmp_path / "nowhere.yaml")
    elif kind == "symlink loop":
        path.symlink_to(path)
    elif kind == "list document":
        path.write_text("- target\n- drafter\n")
    elif kind == "scalar document":
        path.write_text("just some words\n")
    return path


HOSTILE_PATHS = {
    "directory": "directory", "empty file": "empty", "comments only": "empty", "binary junk": "binary",
    "random bytes": "binary", "non-utf8": "UTF-8", "utf-16": "", "huge file": "too large",
    "broken symlink": "no such file", "symlink loop": "", "list document": "mapping", "scalar document": "mapping",
}


@pytest.mark.parametrize("kind", HOSTILE_PATHS)
def test_profile_paths_that_are_not_profiles(capsys, tmp_path, kind):
    path = make_hostile_path(tmp_path, kind)
    code, out, err = run_cli(capsys, "generate", "hi", "-p", str(path))
    assert code == 2 and out == ""
    assert_one_line_error(err, str(path), HOSTILE_PATHS[kind])


def test_a_fifo_as_profile_does_not_hang(tmp_path):
    """A named pipe nobody writes to would block a reader forever: refuse it without opening it."""
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    refusals = []

    def load():
        try:
            load_profile(fifo)
        except ProfileError as exc:
            refusals.append(exc)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    loader.join(timeout=60)  # a hang guard only: the refusal comes without waiting on the pipe
    if loader.is_alive():  # blocked opening or reading it: a writer lets the thread end
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b"target: {model: /m}\n")
        os.close(fd)
        pytest.fail("load_profile blocked on the FIFO")
    assert len(refusals) == 1 and str(refusals[0]).startswith(f"{fifo}: ")


def test_dev_zero_as_profile_is_refused_without_reading_it(tmp_path):
    """/dev/zero reports size 0 and never ends: the size check must not trust st_size alone.
    In a subprocess with an address-space limit, so that reading it cannot eat the machine: 1.5 GiB,
    or 32 GiB for a CUDA build of torch, whose libraries alone map several GiB at import."""
    cap = (32 << 30) if torch.version.cuda else (3 << 29)

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    proc = subprocess.run([sys.executable, "-m", "specdec_cli", "generate", "hi", "-p", "/dev/zero"], cwd=REPO,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True, timeout=60, preexec_fn=limit)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, err
    assert_one_line_error(err, "/dev/zero")


@pytest.mark.parametrize("name", ["x" * 300, "a/" * 2000 + "p.yaml"])
def test_overlong_profile_names_are_clean_errors(capsys, name):
    code, _, err = run_cli(capsys, "generate", "hi", "-p", name)
    assert code == 2
    assert_one_line_error(err)
