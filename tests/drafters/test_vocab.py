"""A draft with another tokenizer (drafter.vocab): the shared tokens, greedy identity for intersect
and text, the draft's cache holding the committed text in its own tokens, and the draft's q over
the target's ids computed exactly."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from cache_checks import assert_cache_holds, assert_static_cache_holds
from cli_helpers import assert_one_line_error, run_cli
from profile_helpers import model_profile

from specdec_cli import Pipeline, SamplingSpec, Verified
from specdec_cli.drafters.model import ModelDrafter
from specdec_cli.drafters.other_vocab import IntersectDrafter, TextDrafter, common_prefix
from specdec_cli.drafters.vocab_map import shared_vocab, token_bytes
from specdec_cli.errors import IncompatibleModelsError
from specdec_cli.primitives.sampling import probabilities
from specdec_cli.specs import AUTO_TREE, TreeSpec
from specdec_cli.decoding.transformers_generate import transformers_generate

PROMPTS = ["def reverse(items):\n", "The quick brown", "Write a Python", "for i in range(10):\n    print("]


def pipeline(tmp_path, pair, vocab: str = "intersect", draft: str = "draft", **fields) -> Pipeline:
    drafter = {"kind": "model", "model": str(pair[draft]), "vocab": vocab}
    return Pipeline.from_profile(str(model_profile(tmp_path, pair, drafter=drafter, chat=False, **fields)))


def draft_encoding(drafter, committed: list[int]) -> list[int]:
    """The committed text in draft tokens, computed here from the two tokenizers."""
    text = drafter.target_tokenizer.decode(committed, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    return drafter.draft_tokenizer.encode(text)


# --------------------------------------------------------------------------- the shared tokens


def sentencepiece_tokenizer():
    """A SentencePiece-style BPE: spaces as "▁", a byte-fallback piece "<0x0A>", and "<0x74>"
    spelling the same byte as "t"."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = ["<unk>", "<0x0A>", "\u2581the", "the", "\u2581", "t", "h", "e", "th", "<0x74>"]
    bpe = models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[("t", "h"), ("th", "e"), ("\u2581", "the")], unk_token="<unk>")
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def test_tokens_compare_as_the_bytes_they_spell(tokenizer):
    """"▁the" (SentencePiece) and "Ġthe" (byte-level) are both b" the"; a byte-fallback piece is
    its byte; special tokens take no part; of two pieces spelling one byte the lower id counts."""
    pieces = sentencepiece_tokenizer()
    spelled = token_bytes(pieces, len(pieces))
    assert spelled[1] == b"\n" and spelled[2] == b" the" and spelled[3] == b"the" and spelled[9] == b"t"
    assert 0 not in spelled  # <unk> is special
    assert token_bytes(tokenizer, len(tokenizer))[tokenizer.convert_tokens_to_ids("\u0120the")] == b" the"
    mapping = shared_vocab(tokenizer, pieces, len(tokenizer), len(pieces), "draft", "target", minimum=0.0)
    pairs = dict(zip(mapping.draft_ids.tolist(), mapping.target_ids.tolist()))
    assert pairs[2] == tokenizer.convert_tokens_to_ids("\u0120the")
    assert pairs[1] == tokenizer.convert_tokens_to_ids("\u010a")  # "\n" in byte-level spelling
    assert pairs[5] == tokenizer.convert_tokens_to_ids("t") and 9 not in pairs


def test_an_added_token_is_its_text_and_leaves_the_reading_byte_level(tmp_path):
    from tiny_models import build_tokenizer

    tok = build_tokenizer(tmp_path / "tok", chat=False)
    tok.add_tokens(["two words", "\u2581odd"])
    spelled = token_bytes(tok, len(tok))
    assert spelled[tok.convert_tokens_to_ids("two words")] == b"two words"
    assert spelled[tok.convert_tokens_to_ids("\u2581odd")] == "\u2581odd".encode()
    assert spelled[tok.convert_tokens_to_ids("\u0120the")] == b" the"


def test_overlap_is_measured_logged_and_kept_on_the_drafter(tmp_path, vocab_pair, caplog):
    with caplog.at_level(logging.INFO, logger="specdec"):
        pipe = pipeline(tmp_path, vocab_pair)
    drafter = pipe.drafter
    assert isinstance(drafter, IntersectDrafter)
    # both tokenizers are byte-level: shared tokens are equal vocabulary strings
    def regular(tok):
        return {t for t, i in tok.get_vocab().items() if i not in tok.all_special_ids}
    shared = regular(drafter.target_tokenizer) & regular(drafter.draft_tokenizer)
    overlap = drafter.overlap
    assert overlap.shared == len(shared) and 0 < overlap.shared < overlap.draft_size == len(drafter.draft_tokenizer)
    assert overlap.target_size == pipe.vocab
    assert overlap.draft_share == pytest.approx(len(shared) / overlap.draft_size)
    assert any("tokens shared" in r.getMessage() and f"{overlap.draft_share:.1%}" in r.getMessage() for r in caplog.records)


def test_auto_shares_a_matching_tokenizer_and_intersects_another(tmp_path, llama_pair, vocab_pair):
    same = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, drafter={"kind": "model", "model": str(llama_pair["draft"])})))
    assert type(same.drafter) is ModelDrafter
    assert isinstance(pipeline(tmp_path, vocab_pair, vocab="auto").drafter, IntersectDrafter)
    assert isinstance(pipeline(tmp_path, vocab_pair, vocab="text").drafter, TextDrafter)
    with pytest.raises(IncompatibleModelsError, match="different tokenizers"):
        pipeline(tmp_path, vocab_pair, vocab="shared")


def test_a_pair_sharing_too_few_tokens_is_refused(capsys, tmp_path, vocab_pair):
    profile = model_profile(tmp_path, vocab_pair, drafter={"kind": "model", "model": str(vocab_pair["stranger"])})
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(profile), "--no-chat")
    assert code == 2
    assert_one_line_error(err, "different tokenizers", "share only", "under 10%")


def test_vocab_is_checked_with_the_profile(capsys, tmp_path, vocab_pair):
    profile = model_profile(tmp_path, vocab_pair, drafter={"kind": "model", "model": str(vocab_pair["draft"]), "vocab": "intersection"})
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(profile))
    assert code == 2
    assert_one_line_error(err, "drafter.vocab", "intersect")


# --------------------------------------------------------------------------- greedy identity


@pytest.mark.parametrize("vocab", ["intersect", "text"])
def test_greedy_ids_are_the_targets_own(tmp_path, vocab_pair, vocab):
    """Every k, k: auto and (intersect) trees: the target's greedy ids, with drafts kept, tokens
    the draft cannot spell emitted, and the draft's encoding rewritten where a merge crossed it."""
    pipe = pipeline(tmp_path, vocab_pair, vocab)
    spelled = set(pipe.drafter.map.target_ids.tolist())
    shapes = [(k, None) for k in (1, 2, 3, 5, 8, "auto")] + [(None, TreeSpec(8, 3, 3)), (None, AUTO_TREE)]
    accepted = unspellable = 0
    for prompt in PROMPTS:
        ids = pipe.encode(prompt)
        expected = transformers_generate(pipe, ids, 40)
        unspellable += sum(t not in spelled and t not in pipe.eos_ids for t in expected)
        for k, tree in shapes:
            result = pipe.generate(ids, decoder=pipe.decoder(k=k, tree=tree), max_new_tokens=40)
            assert result.token_ids == expected, (prompt, k, tree)
            accepted += result.stats.accepted
    assert accepted > 20 and unspellable > 0
    if vocab == "text":  # a tree's shape gets a chain
        events = pipe.stream(pipe.encode(PROMPTS[0]), decoder=pipe.decoder(tree=TreeSpec(8, 3, 3)), max_new_tokens=20)
        assert not any(e.tree for e in events if isinstance(e, Verified))


@pytest.mark.parametrize("committed,new", [
    ("The quick brown", " fox jumps"),  # the new text starts a word: encoded after the last token
    ("def rev", "erse(items):"),  # it continues the last target token's word: encoded alone
    ("def reverse(it", "ems):"),
])
def test_text_proposes_the_target_tokens_of_the_drafts_new_text(tmp_path, vocab_pair, committed, new):
    drafter = pipeline(tmp_path, vocab_pair, "text").drafter
    target, draft = drafter.target_tokenizer, drafter.draft_tokenizer
    ids = target.encode(committed)
    drafter.begin(torch.tensor(ids), SamplingSpec(), None)
    proposed = drafter.target_tokens(draft.encode(new))
    assert target.decode(proposed) == new
    anchored = target.encode(target.decode(ids[-1:]) + new)
    expected = anchored[1:] if anchored[:1] == ids[-1:] else target.encode(new)
    assert proposed == expected
    # a draft whose last token ends inside a character: the partial character is not proposed
    partial = draft.encode(new + "\u0436")[:-1]
    assert draft.decode(partial).endswith("\ufffd")  # two byte-level tokens: one is half a character
    assert target.decode(drafter.target_tokens(partial)) == new


@pytest.mark.parametrize("vocab", ["intersect", "text"])
def test_eos_and_max_new_tokens_inside_a_step(tmp_path, vocab_pair, vocab):
    pipe = pipeline(tmp_path, vocab_pair, vocab)
    ids = pipe.encode(PROMPTS[1])
    free_run = transformers_generate(pipe, ids, 40)
    for limit in (1, 2, 3, 5, 7):
        for k in (2, 4, 6):
            result = pipe.generate(ids, decoder=pipe.decoder(k=k), max_new_tokens=limit)
            assert result.token_ids == free_run[:limit] and result.finish_reason == "length"
    pipe.eos_ids = frozenset({free_run[4]})  # a token mid-run ends it
    expected = transformers_generate(pipe, ids, 40)
    assert expected[-1] == free_run[4] and len(expected) < len(free_run)
    for k in (2, 4, 6):
        result = pipe.generate(ids, decoder=pipe.decoder(k=k), max_new_tokens=40)
        assert result.token_ids == expected and result.finish_reason == "eos"


# --------------------------------------------------------------------------- caches


@pytest.mark.parametrize("vocab,temperature,tree", [
    ("intersect", 0.0, None), ("intersect", 1.0, None), ("intersect", 0.0, TreeSpec(8, 3, 3)),
    ("intersect", 0.8, TreeSpec(8, 3, 3)), ("text", 0.0, None),
])
def test_the_draft_cache_holds_the_committed_text_in_draft_tokens(tmp_path, vocab_pair, vocab, temperature, tree):
    """After every step: the target's cache holds the committed ids but the last; the draft's holds
    a prefix of the committed text's encoding in draft tokens and `pending` the rest."""
    pipe = pipeline(tmp_path, vocab_pair, vocab)
    steps = rewritten = kept = 0
    for prompt in PROMPTS[:3]:
        for k in (2, 5):
            decoder = pipe.decoder(k=k, tree=tree)
            committed = pipe.encode(prompt)
            before = draft_encoding(decoder.drafter, committed)
            events = pipe.stream(committed, decoder=decoder, sampling=SamplingSpec(temperature=temperature), seed=k, max_new_tokens=30)
            for event in events:
                if not isinstance(event, Verified):
                    continue
                committed = committed + list(event.emitted)
                assert_cache_holds(decoder.lm, committed[:-1])
                draft = decoder.drafter
                encoding = draft_encoding(draft, committed)
                held = draft.lm.length
                assert held >= 1 or len(encoding) <= 1
                assert_cache_holds(draft.lm, encoding[:held])
                assert draft.pending.tolist() == encoding[held:] and len(encoding[held:]) >= 1
                rewritten += common_prefix(before, encoding) < len(before)  # the new text re-merged old tokens
                kept += held > len(before)  # drafts the draft fed stayed in its cache
                before = encoding
                steps += 1
    assert steps > 20 and rewritten > 0 and kept > 0


@pytest.mark.parametrize("vocab", ["intersect"])
def test_compiled_steps_keep_identity_and_the_static_caches_exact(tmp_path, vocab_pair, vocab):
    """compile: on: both models in static caches with compiled steps; the same checks. intersect
    only: text drafts through the same compiled draft and target steps (its own work is re-encoding
    text, which compiling does not touch), and the suite keeps under ten minutes."""
    from specdec_cli.runtime.static import StaticLM

    pipe = pipeline(tmp_path, vocab_pair, vocab, compile="on")
    assert isinstance(pipe.drafter.lm, StaticLM)
    accepted = 0
    for prompt in PROMPTS[:2]:
        ids = pipe.encode(prompt)
        expected = transformers_generate(pipe, ids, 30)
        decoder = pipe.decoder(k=4)
        committed = list(ids)
        for event in pipe.stream(ids, decoder=decoder, max_new_tokens=30):
            if not isinstance(event, Verified):
                continue
            committed += event.emitted
            accepted += event.n_accepted
            assert_static_cache_holds(decoder.lm, committed[:-1])
            encoding = draft_encoding(decoder.drafter, committed)
            held = decoder.drafter.lm.length
            assert_static_cache_holds(decoder.drafter.lm, encoding[:held])
            assert decoder.drafter.pending.tolist() == encoding[held:]
        assert tuple(committed[len(ids):]) == expected
    assert accepted > 0


# --------------------------------------------------------------------------- temperature > 0


def drafted_distribution(pipe: Pipeline, ids: list[int], sampling: SamplingSpec, monkeypatch) -> torch.Tensor:
    """The distribution the drafter draws its first token from (what growth.race is given)."""
    import specdec_cli.drafters.growth as growth

    seen = []
    real_race = growth.race
    monkeypatch.setattr(growth, "race", lambda q, noise: seen.append(q.detach().clone()) or real_race(q, noise))
    pipe.generate(ids, decoder=pipe.decoder(k=1), sampling=sampling, seed=0, max_new_tokens=2)
    monkeypatch.setattr(growth, "race", real_race)
    return seen[0][0].double()


def exact_draft_q(pipe: Pipeline, ids: list[int], sampling: SamplingSpec) -> torch.Tensor:
    """The draft's next-token logits after the prompt's text, enumerated over every draft token,
    kept on the tokens whose string the target's vocabulary holds, put at the target's ids, then
    warped: at temperature alone, the draft's distribution restricted to those tokens, renormalised."""
    draft = pipe.drafter
    context = draft_encoding(draft, ids)
    with torch.inference_mode():
        logits = draft.lm.model(torch.tensor([context])).logits[0, -1]
    target_vocab = draft.target_tokenizer.get_vocab()
    specials = set(draft.draft_tokenizer.all_special_ids)
    at_target = torch.full((pipe.vocab,), float("-inf"))
    for token, draft_id in draft.draft_tokenizer.get_vocab().items():
        if draft_id not in specials and token in target_vocab:
            at_target[target_vocab[token]] = logits[draft_id]
    return probabilities(at_target[None], sampling)[0].double()


@pytest.mark.parametrize("sampling", [SamplingSpec(temperature=1.0), SamplingSpec(temperature=0.7, top_k=20, top_p=0.9)])
def test_intersect_draws_from_the_drafts_q_on_shared_tokens(tmp_path, vocab_pair, monkeypatch, sampling):
    """One step, enumerated exactly: the q the drafter draws from (argmax(q / e) is a draw from q)
    is the draft's distribution restricted to the shared tokens and renormalised, at target ids."""
    pipe = pipeline(tmp_path, vocab_pair)
    for prompt in PROMPTS[:2]:
        ids = pipe.encode(prompt)
        expected = exact_draft_q(pipe, ids, sampling)
        drafted = drafted_distribution(pipe, ids, sampling, monkeypatch)
        assert drafted.sum() == pytest.approx(1.0)
        assert torch.allclose(drafted, expected, atol=1e-6), (drafted - expected).abs().max()


def test_a_wrong_id_mapping_fails_the_same_enumeration(tmp_path, vocab_pair, monkeypatch):
    """The shared tokens' target ids shifted by one pair: q lands on the wrong tokens, and the test sees it."""
    sampling = SamplingSpec(temperature=1.0)
    pipe = pipeline(tmp_path, vocab_pair)
    ids = pipe.encode(PROMPTS[0])
    expected = exact_draft_q(pipe, ids, sampling)
    wrong = pipe.drafter.map
    monkeypatch.setattr(wrong, "target_ids", wrong.target_ids.roll(1))
    drafted = drafted_distribution(pipe, ids, sampling, monkeypatch)
    assert not torch.allclose(drafted, expected, atol=1e-6)


def test_intersect_sampling_gives_the_seeds_text(tmp_path, vocab_pair):
    """Above temperature 0 the text is the target's own for the seed, whatever k or tree."""
    pipe = pipeline(tmp_path, vocab_pair)
    sampling = SamplingSpec(temperature=0.8, top_p=0.95)
    ids = pipe.encode(PROMPTS[0])
    plain = pipe.generate(ids, decoder=pipe.decoder(drafter=None), sampling=sampling, seed=3, max_new_tokens=30)
    accepted = 0
    for k, tree in [(1, None), (4, None), ("auto", None), (None, TreeSpec(8, 3, 3))]:
        result = pipe.generate(ids, decoder=pipe.decoder(k=k, tree=tree), sampling=sampling, seed=3, max_new_tokens=30)
        assert result.token_ids == plain.token_ids, (k, tree)
        accepted += result.stats.accepted
    assert accepted > 0


def test_text_refuses_sampling_in_one_line(capsys, tmp_path, vocab_pair):
    profile = model_profile(tmp_path, vocab_pair, drafter={"kind": "model", "model": str(vocab_pair["draft"]), "vocab": "text"})
    code, _, err = run_cli(capsys, "generate", "def add(a, b):", "-p", str(profile), "--no-chat", "-t", "0.7")
    assert code == 2
    assert_one_line_error(err, "vocab: text", "temperature 0")
    code, out, _ = run_cli(capsys, "generate", "def add(a, b):", "-p", str(profile), "--no-chat", "-t", "0")
    assert code == 0 and out.strip()


def test_no_proposal_past_the_drafts_own_context(tmp_path, vocab_pair):
    """The draft's context counts its own tokens: where a proposal would not fit, it proposes none."""
    pipe = pipeline(tmp_path, vocab_pair)
    ids = pipe.encode(PROMPTS[2])
    expected = transformers_generate(pipe, ids, 30)
    decoder = pipe.decoder(k=4)
    decoder.drafter.room = len(draft_encoding(decoder.drafter, ids)) + 16
    result = pipe.generate(ids, decoder=decoder, max_new_tokens=30)
    assert result.token_ids == expected
    last_drafted = max(i for i, step in enumerate(result.stats.steps) if step.drafted)
    assert 0 < last_drafted < len(result.stats.steps) - 1
    committed = list(ids) + list(result.token_ids[: sum(s.emitted for s in result.stats.steps[: last_drafted])])
    assert len(draft_encoding(decoder.drafter, committed)) + 4 <= decoder.drafter.room


def test_generate_prompts_runs_a_draft_with_another_tokenizer_in_a_batch(capsys, tmp_path, vocab_pair):
    profile = model_profile(tmp_path, vocab_pair, drafter={"kind": "model", "model": str(vocab_pair["draft"])})
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(p.replace("\n", " ").strip() + "\n" for p in PROMPTS))  # a prompt a line
    outputs = []
    for size in ("1", "2"):
        code, out, err = run_cli(capsys, "generate", "--prompts", str(prompts), "--batch-size", size, "-p", str(profile),
                                 "--no-chat", "-n", "12")
        assert code == 0, err
        outputs.append([json.loads(line)["token_ids"] for line in out.splitlines()])
    assert outputs[0] == outputs[1] and len(outputs[0]) == len(PROMPTS)


# --------------------------------------------------------------------------- in a batch


@pytest.mark.parametrize("vocab,tree", [("intersect", None), ("intersect", TreeSpec(8, 3, 3)), ("text", None)])
@pytest.mark.parametrize("batch_size", [1, 2, 3, 8])
def test_rows_drafted_with_another_tokenizer_equal_their_own_batch_one_text(tmp_path, vocab_pair, vocab, tree, batch_size):
    """generate --prompts with a draft of another tokenizer, chains and trees: every row is its
    prompt's own greedy text, and a row's draft keeps as many drafts as it does alone."""
    from specdec_cli.decoding.batched import BatchedDecoder, Request

    pipe = pipeline(tmp_path, vocab_pair, vocab)
    prompts = [pipe.encode(p) for p in PROMPTS * 2]
    limits = [30, 9, 17, 24, 1, 12, 20, 26]
    decoder = BatchedDecoder(pipe.target, lambda: pipe.make_drafter(pipe.profile.drafter), vocab=pipe.vocab,
                             eos_ids=pipe.eos_ids, k=4, tree=tree, batch_size=batch_size,
                             context_length=pipe.context_length)
    finished = dict(decoder.run(Request(i, ids, limit) for i, (ids, limit) in enumerate(zip(prompts, limits))))
    for i, (ids, limit) in enumerate(zip(prompts, limits)):
        alone = pipe.generate(ids, decoder=pipe.decoder(k=4, tree=tree), max_new_tokens=limit)
        assert finished[i].token_ids == transformers_generate(pipe, ids, limit) == alone.token_ids, i
        assert finished[i].stats.accepted == alone.stats.accepted, i
    assert sum(f.stats.accepted for f in finished.values()) > 0
