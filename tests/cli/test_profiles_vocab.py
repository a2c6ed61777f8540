"""`profiles show` for a draft with another tokenizer: the rule its vocab comes to and the tokens both
vocabularies share, read from the tokenizers alone, with the numbers the drafter itself measures."""

from __future__ import annotations

import json

import yaml

from cli_helpers import run_cli
from profile_helpers import model_profile
from specdec_cli import Pipeline


def profile_for(tmp_path, pair, vocab: str | None, model: str | None = None, **fields):
    drafter = {"kind": "model", "model": model or str(pair["draft"])}
    if vocab is not None:
        drafter["vocab"] = vocab
    return model_profile(tmp_path, pair, name=f"v-{vocab}", drafter=drafter, chat=False, **fields)


def test_show_prints_the_overlap_the_drafter_measures(capsys, tmp_path, vocab_pair):
    profile = profile_for(tmp_path, vocab_pair, "intersect")
    overlap = Pipeline.from_profile(str(profile)).drafter.overlap
    code, out, err = run_cli(capsys, "profiles", "show", str(profile))
    assert code == 0, err
    expected = (f"# vocab: intersect — {overlap.shared:,} tokens shared ({overlap.draft_share:.1%} of the draft's "
                f"{overlap.draft_size:,}, {overlap.target_share:.1%} of the target's {overlap.target_size:,})")
    assert out.rstrip("\n").splitlines()[-1] == expected
    assert yaml.safe_load(out)["drafter"]["vocab"] == "intersect"  # still a profile that reads back


def test_auto_shows_its_rule_and_json_has_the_numbers(capsys, tmp_path, vocab_pair):
    profile = profile_for(tmp_path, vocab_pair, None)
    overlap = Pipeline.from_profile(str(profile)).drafter.overlap
    code, out, _ = run_cli(capsys, "profiles", "show", str(profile))
    assert code == 0 and "# vocab: auto → intersect — " in out
    code, out, _ = run_cli(capsys, "profiles", "show", str(profile), "--format", "json")
    data = json.loads(out)
    assert data["drafter"]["vocab"] == "auto"
    assert data["vocab_overlap"] == [{
        "drafter": "drafter", "model": str(vocab_pair["draft"]), "vocab": "auto", "rule": "intersect",
        "shared": overlap.shared, "draft_size": overlap.draft_size, "target_size": overlap.target_size,
        "draft_share": overlap.draft_share, "target_share": overlap.target_share, "unknown": None,
    }]


def test_a_chains_draft_model_is_shown_and_shared_shows_nothing(capsys, tmp_path, vocab_pair, llama_pair):
    chain = {"kind": "chain", "drafters": [{"kind": "ngram"}, {"kind": "model", "model": str(vocab_pair["draft"]), "vocab": "text"}]}
    profile = model_profile(tmp_path, vocab_pair, name="chain", drafter=chain, chat=False)
    code, out, _ = run_cli(capsys, "profiles", "show", str(profile))
    assert code == 0 and out.splitlines()[-1].startswith("# drafter.drafters[1] vocab: text — ")
    assert "tokens shared" in out.splitlines()[-1]
    code, out, _ = run_cli(capsys, "profiles", "show", str(profile_for(tmp_path, llama_pair, "shared")))
    assert code == 0 and "#" not in out and "vocab_overlap" not in out


def test_a_tokenizer_that_cannot_be_loaded_leaves_the_overlap_unknown_in_one_line(capsys, tmp_path, vocab_pair):
    profile = profile_for(tmp_path, vocab_pair, "auto", model="nobody/no-such-draft")
    code, out, err = run_cli(capsys, "profiles", "show", str(profile))
    assert code == 0 and "Traceback" not in out + err
    last = out.rstrip("\n").splitlines()[-1]
    assert last.startswith("# vocab: auto — overlap unknown: ") and "nobody/no-such-draft" in last and "offline" in last
    code, out, _ = run_cli(capsys, "profiles", "show", str(profile), "-f", "json")
    pairing = json.loads(out)["vocab_overlap"][0]
    assert pairing["shared"] is None and pairing["rule"] is None and "offline" in pairing["unknown"]


def test_a_gguf_draft_shows_its_overlap_once_converted(capsys, tmp_path, vocab_pair):
    """A GGUF's tokenizer comes with converting the whole model: before a first load the overlap is
    unknown, saying why; after it, read from the converted copy (nothing converted just to show it)."""
    import shutil

    from specdec_cli.models.gguf import converted_gguf_folder

    folder = tmp_path / "gguf-draft"
    folder.mkdir()
    (folder / "draft.gguf").write_bytes(b"GGUF")  # never read: nothing may convert it here
    drafter = {"kind": "model", "model": str(folder), "gguf_file": "draft.gguf"}
    profile = model_profile(tmp_path, vocab_pair, name="gguf", drafter=drafter, chat=False)
    code, out, _ = run_cli(capsys, "profiles", "show", str(profile))
    last = out.rstrip("\n").splitlines()[-1]
    assert code == 0 and last.startswith("# vocab: auto — overlap unknown: ") and "GGUF" in last and "first" in last
    shutil.copytree(vocab_pair["draft"], converted_gguf_folder(folder / "draft.gguf"))  # as a first load leaves it
    code, out, _ = run_cli(capsys, "profiles", "show", str(profile))
    plain = model_profile(tmp_path, vocab_pair, name="plain", drafter={"kind": "model", "model": str(vocab_pair["draft"])}, chat=False)
    _, expected, _ = run_cli(capsys, "profiles", "show", str(plain))
    assert code == 0 and out.rstrip("\n").splitlines()[-1] == expected.rstrip("\n").splitlines()[-1]
    assert "tokens shared" in out.rstrip("\n").splitlines()[-1]


def test_converting_a_gguf_draws_no_bar_of_transformers(capfd, monkeypatch, tmp_path, llama_pair):
    """The first load of a GGUF writes a safetensors copy; transformers' own bars ("Writing model
    shards") stay off the user's terminal, as in every other load (the GGUF reading is stood in for
    by a saved model: no GGUF writer here)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec_cli.models.gguf import convert_gguf

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    from_pretrained = {AutoModelForCausalLM: AutoModelForCausalLM.from_pretrained, AutoTokenizer: AutoTokenizer.from_pretrained}
    for auto, load in from_pretrained.items():
        monkeypatch.setattr(auto, "from_pretrained", lambda folder, gguf_file, load=load, **kw: load(llama_pair["target"], **kw))
    out = convert_gguf(gguf)
    assert (out / "model.safetensors").is_file() and (out / "tokenizer_config.json").is_file()
    captured = capfd.readouterr()
    assert "Writing model shards" not in captured.err + captured.out, captured.err
