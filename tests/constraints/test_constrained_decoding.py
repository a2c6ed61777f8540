"""Structured output is exact: at temperature 0 the text is a plain constrained loop's (full
forwards, llguidance's own mask, argmax) for every drafter, k, tree and batch size; above it the
first token follows the target's distribution restricted to what the constraint allows (enumerated),
two tokens pass a chi-square test that a stale mask fails, and one seed gives one text."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specdec_cli.decoding.constrained as constrained_module
import specdec_cli.primitives.sampling as sampling_module
from exact_distribution import chi_square_pvalue
from profile_helpers import model_profile
from specdec_cli import Pipeline, SamplingSpec
from specdec_cli.constraints.grammars import grammar_of
from specdec_cli.constraints.matcher import RowMatcher, Walk, allowed_tokens
from specdec_cli.errors import UsageError
from specdec_cli.specs import ConstraintSpec, TreeSpec

SCHEMA = ConstraintSpec("json_schema", '{"type": "object", "properties": {"id": {"type": "integer"}, "tag": '
                        '{"enum": ["alpha", "beta", "gamma"]}}, "required": ["id", "tag"], "additionalProperties": false}')
CONSTRAINTS = {
    "schema": SCHEMA,
    "regex": ConstraintSpec("regex", r"(def|class) [a-z]{1,6}\([a-z, ]{0,12}\):"),
    "lark": ConstraintSpec("grammar", 'start: "x = " NUMBER ";"\nNUMBER: /[0-9]{1,5}/'),
}
DRAFTERS = {
    "plain": None,
    "model": lambda pair: {"kind": "model", "model": str(pair["draft"])},
    "ngram": lambda pair: {"kind": "ngram", "max_ngram": 3},
    "early-exit": lambda pair: {"kind": "early-exit", "layers": 2},
    "chain": lambda pair: {"kind": "chain", "drafters": [{"kind": "ngram"}, {"kind": "model", "model": str(pair["draft"])}]},
}
PROMPT = "def add(a, b):"


def pipeline(tmp_path, pair, drafter: str = "model", **fields) -> Pipeline:
    make = DRAFTERS[drafter] or DRAFTERS["model"]
    return Pipeline.from_profile(str(model_profile(tmp_path, pair, drafter=make(pair), chat=False, **fields)))


def reference_matcher(pipe: Pipeline, spec: ConstraintSpec):
    """llguidance's matcher built here, apart from specdec's (constraints/matcher.py)."""
    from llguidance import LLMatcher
    from llguidance.hf import from_tokenizer

    return LLMatcher(from_tokenizer(pipe.tokenizer, eos_token=sorted(pipe.eos_ids) or None), grammar_of(spec), log_level=0)


def allowed_now(pipe: Pipeline, matcher) -> torch.Tensor:
    """The tokens the matcher allows next, from its byte-a-token logit bias (not specdec's bitmask reading)."""
    bias = np.frombuffer(matcher.compute_logit_bias(), dtype=np.uint8)[: pipe.vocab]
    allowed = torch.zeros(pipe.vocab, dtype=torch.bool)
    allowed[: len(bias)] = torch.from_numpy(bias > 0)
    return allowed


def next_logits(pipe: Pipeline, sequence: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return pipe.target(torch.tensor([sequence], device=pipe.target.device)).logits[0, -1, : pipe.vocab].float().cpu()


def constrained_greedy(pipe: Pipeline, ids: list[int], spec: ConstraintSpec, tokens: int) -> tuple[int, ...]:
    """Plain constrained decoding, the simplest way: a full forward per token, the mask, argmax."""
    matcher = reference_matcher(pipe, spec)
    out: list[int] = []
    while len(out) < tokens:
        token = int(next_logits(pipe, ids + out).masked_fill(~allowed_now(pipe, matcher), float("-inf")).argmax())
        out.append(token)
        if token in pipe.eos_ids:
            break
        assert matcher.consume_token(token)
    return tuple(out)


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_greedy_equals_a_plain_constrained_loop(tmp_path, llama_pair, drafter):
    pipe = pipeline(tmp_path, llama_pair, drafter)
    ids = pipe.encode(PROMPT)
    shapes = [("plain", None)] if DRAFTERS[drafter] is None else [(k, None) for k in (1, 3, 6)] + [(None, TreeSpec(6, 2, 3))]
    for name, spec in CONSTRAINTS.items():
        expected = constrained_greedy(pipe, ids, spec, 40)
        for k, tree in shapes:
            decoder = pipe.decoder(drafter=None) if k == "plain" else pipe.decoder(k=k, tree=tree)
            result = pipe.generate(ids, decoder=decoder, max_new_tokens=40, constraint=spec, seed=0)
            assert result.token_ids == expected, (name, k, tree)
            assert result.stats.constraint_complete == (result.finish_reason == "eos"), (name, k, tree)


def test_rows_of_a_batch_keep_their_own_constraints(tmp_path, llama_pair):
    """Constrained and free rows side by side: each row's text is the one it gets alone."""
    pipe = pipeline(tmp_path, llama_pair, "model")
    prompts = [PROMPT, "The quick brown fox", "for i in range(10):", PROMPT, "class Stack:"]
    constraints = [SCHEMA, None, CONSTRAINTS["regex"], CONSTRAINTS["lark"], SCHEMA]
    alone = [pipe.generate(p, max_new_tokens=30, constraint=c, seed=0).token_ids for p, c in zip(prompts, constraints)]
    for batch_size in (2, 3, 8):
        results = list(pipe.generate_many(prompts, batch_size=batch_size, max_new_tokens=30, constraint=constraints))
        assert [r.token_ids for r in results] == alone, batch_size
        assert all((r.stats.constraint_complete is None) == (c is None) for r, c in zip(results, constraints))


def test_forced_tokens_are_drafted_free_and_forbidden_drafts_cut(tmp_path, llama_pair):
    pipe = pipeline(tmp_path, llama_pair, "model")
    plain = pipe.generate(PROMPT, decoder=pipe.decoder(drafter=None), max_new_tokens=40, constraint=SCHEMA, seed=0)
    summary = plain.stats.constraint_summary()
    assert summary["forced_tokens"] > 0 and summary["forced_kept"] > 0  # the schema's keys, with no drafter
    assert plain.stats.mean_accepted_length > 1.0
    assert plain.stats.drafted == 0  # forced tokens are not a drafter's
    drafted = pipe.generate(PROMPT, max_new_tokens=40, constraint=SCHEMA, seed=0)
    assert drafted.token_ids == plain.token_ids
    # the draft model draws its guesses within the schema: none is cut, and the target keeps them
    assert drafted.stats.constraint_summary()["cut_drafts"] == 0 and drafted.stats.acceptance_rate > 0.5
    # a batch's draft model drafts every row at once, unconstrained: what the schema forbids is cut
    batch = list(pipe.generate_many([PROMPT, PROMPT], batch_size=2, max_new_tokens=40, constraint=SCHEMA, seed=0))
    assert [r.token_ids for r in batch] == [plain.token_ids] * 2
    assert sum(r.stats.constraint_summary()["cut_drafts"] for r in batch) > 0


def test_a_text_cut_by_max_new_tokens_is_incomplete(tmp_path, llama_pair):
    pipe = pipeline(tmp_path, llama_pair, "model")
    cut = pipe.generate(PROMPT, max_new_tokens=3, constraint=SCHEMA, seed=0)
    assert cut.finish_reason == "length" and cut.stats.constraint_complete is False
    assert cut.stats.to_dict()["constraint"]["complete"] is False
    done = pipe.generate(PROMPT, max_new_tokens=200, constraint=CONSTRAINTS["lark"], seed=0)
    assert done.finish_reason == "eos" and done.stats.constraint_complete is True


# --------------------------------------------------------------------------- temperature > 0

TWO_TOKENS = ConstraintSpec("grammar", 'start: ("ab" | "cd" | "de") ("x" | "yz" | "a")')


def exact_first_distribution(pipe: Pipeline, ids: list[int], spec: ConstraintSpec, sampling: SamplingSpec,
                             ) -> torch.Tensor:
    matcher = reference_matcher(pipe, spec)
    logits = next_logits(pipe, ids).masked_fill(~allowed_now(pipe, matcher), float("-inf"))
    return sampling_module.warp_logits(logits[None], sampling)[0].softmax(-1).double()


def engine_first_distribution(pipe: Pipeline, ids: list[int], spec: ConstraintSpec, sampling: SamplingSpec,
                              monkeypatch) -> torch.Tensor:
    """The distribution the verify draws the first token from under the constraint (what sampling.race
    is given when it chooses again over the allowed tokens: made to choose again at every position, the
    path a forbidden first choice takes; test_a_choice_the_constraint_allows_stands covers the rest)."""
    monkeypatch.setattr(constrained_module, "allows", lambda bits, tokens: np.zeros(tokens.shape, dtype=bool))
    seen = []
    real_race = sampling_module.race
    monkeypatch.setattr(sampling_module, "race", lambda p, noise: seen.append(p.detach().clone()) or real_race(p, noise))
    try:
        pipe.generate(ids, max_new_tokens=1, constraint=spec, sampling=sampling, seed=0)
    except RuntimeError:  # a wrong mask lets through a token the constraint then refuses
        assert seen, "the verify never drew"
    monkeypatch.setattr(sampling_module, "race", real_race)
    return seen[-1][0].double()  # the last call: row 0's positions again, the first token's first


@pytest.mark.parametrize("sampling", [SamplingSpec(temperature=1.0), SamplingSpec(temperature=0.7, top_k=5, top_p=0.9)])
def test_the_first_token_follows_the_constrained_distribution(tmp_path, llama_pair, monkeypatch, sampling):
    pipe = pipeline(tmp_path, llama_pair, "model")
    ids = pipe.encode(PROMPT)
    for spec in (TWO_TOKENS, SCHEMA, CONSTRAINTS["regex"]):
        expected = exact_first_distribution(pipe, ids, spec, sampling)
        drawn = engine_first_distribution(pipe, ids, spec, sampling, monkeypatch)
        assert torch.allclose(drawn, expected, atol=1e-6), (spec.kind, (drawn - expected).abs().max())


def test_a_wrong_mask_fails_the_same_enumeration(tmp_path, llama_pair, monkeypatch):
    """The mask read one token off: the enumeration sees it."""
    pipe = pipeline(tmp_path, llama_pair, "model")
    ids = pipe.encode(PROMPT)
    sampling = SamplingSpec(temperature=1.0)
    expected = exact_first_distribution(pipe, ids, TWO_TOKENS, sampling)
    monkeypatch.setattr(constrained_module, "mask_logits", lambda logits, bits: logits.masked_fill(
        ~allowed_tokens(bits, logits.shape[-1]).roll(1, dims=-1), float("-inf")))
    drawn = engine_first_distribution(pipe, ids, TWO_TOKENS, sampling, monkeypatch)
    assert drawn.sum() == pytest.approx(1.0)
    assert not torch.allclose(drawn, expected, atol=1e-6)


def exact_two_tokens(pipe: Pipeline, ids: list[int], spec: ConstraintSpec, sampling: SamplingSpec) -> np.ndarray:
    matcher = reference_matcher(pipe, spec)
    first = sampling_module.warp_logits(
        next_logits(pipe, ids).masked_fill(~allowed_now(pipe, matcher), float("-inf"))[None], sampling)[0].softmax(-1)
    joint = np.zeros((pipe.vocab, pipe.vocab))
    for t1 in torch.nonzero(first > 0).flatten().tolist():
        assert matcher.consume_token(t1)
        logits = next_logits(pipe, ids + [t1]).masked_fill(~allowed_now(pipe, matcher), float("-inf"))
        joint[t1] = (first[t1] * sampling_module.warp_logits(logits[None], sampling)[0].softmax(-1)).double().numpy()
        matcher.rollback(1)
    return joint


def two_token_counts(pipe: Pipeline, ids: list[int], spec: ConstraintSpec, sampling: SamplingSpec, n: int,
                     **decoder) -> np.ndarray:
    counts = np.zeros((pipe.vocab, pipe.vocab))
    engine = pipe.decoder(**decoder)
    for seed in range(n):
        t1, t2 = pipe.generate(ids, decoder=engine, max_new_tokens=2, constraint=spec, sampling=sampling,
                               seed=seed).token_ids
        counts[t1, t2] += 1
    return counts


def agrees(counts: np.ndarray, joint: np.ndarray) -> bool:
    """The samples fit the exact joint distribution (none where it has no mass, chi-square p > 1e-3)."""
    if counts[joint == 0].sum():
        return False
    return chi_square_pvalue(counts, joint) > 1e-3


@pytest.mark.parametrize("decoder", [dict(k=3), dict(tree=TreeSpec(6, 3, 2))], ids=["chain", "tree"])
def test_two_tokens_follow_the_constrained_distribution(tmp_path, llama_pair, decoder):
    pipe = pipeline(tmp_path, llama_pair, "model")
    pipe.eos_ids = frozenset()  # every sample has two tokens (a complete text's second is EOS)
    ids = pipe.encode(PROMPT)
    sampling = SamplingSpec(temperature=1.0)
    joint = exact_two_tokens(pipe, ids, TWO_TOKENS, sampling)
    assert agrees(two_token_counts(pipe, ids, TWO_TOKENS, sampling, 600, **decoder), joint)


def test_a_stale_mask_fails_the_same_test(tmp_path, llama_pair, monkeypatch):
    """Every position masked with the first position's mask (the matcher not walked along the draft);
    the matcher's own refusal of a forbidden token is lifted, so that the samples show the fault."""
    monkeypatch.setattr(RowMatcher, "advance", lambda self, tokens: self.matcher.consume_tokens(list(tokens)))
    real = constrained_module.ConstrainedStep.bitmasks
    monkeypatch.setattr(constrained_module.ConstrainedStep, "bitmasks",
                        lambda self, width: (lambda m: np.ascontiguousarray(np.broadcast_to(m[:, :1], m.shape)))(real(self, width)))
    pipe = pipeline(tmp_path, llama_pair, "plain")
    pipe.eos_ids = frozenset()
    ids = pipe.encode(PROMPT)
    sampling = SamplingSpec(temperature=1.0)
    joint = exact_two_tokens(pipe, ids, TWO_TOKENS, sampling)
    assert not agrees(two_token_counts(pipe, ids, TWO_TOKENS, sampling, 600, k=3), joint)


def test_one_seed_gives_one_text_whatever_is_drafted(tmp_path, llama_pair):
    pipe = pipeline(tmp_path, llama_pair, "model")
    sampling = SamplingSpec(temperature=1.0)
    decoders = [pipe.decoder(drafter=None), pipe.decoder(k=2), pipe.decoder(k=5), pipe.decoder(tree=TreeSpec(6, 2, 3))]
    for seed in range(3):
        texts = {pipe.generate(PROMPT, decoder=d, max_new_tokens=30, constraint=SCHEMA, sampling=sampling,
                               seed=seed).token_ids for d in decoders}
        assert len(texts) == 1, seed


def test_a_tokenizer_the_grammar_engine_cannot_read_is_a_usage_error(tmp_path, small_vocab_pair):
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, small_vocab_pair, chat=False)))
    with pytest.raises(UsageError, match="grammar"):
        pipe.generate("alpha beta", max_new_tokens=2, constraint=SCHEMA)


def random_step(vocab: int, rows: int, width: int, generator: torch.Generator):
    """A ConstrainedStep whose rows (all but the last) allow a random third of the tokens at each position."""
    words = (vocab + 31) // 32
    walks = []
    for _ in range(rows - 1):
        allowed = torch.rand(width, words * 32, generator=generator) < 0.33
        allowed[:, vocab:] = False
        allowed[:, 0] = True  # never nothing
        bits = (allowed.view(width, words, 32).long() << torch.arange(32)).sum(-1)
        masks = bits.to(torch.int64).where(bits < 2**31, bits - 2**32).to(torch.int32).numpy()
        walks.append(Walk(width - 1, list(range(width - 1)), list(range(-1, width - 2)), [], masks))
    return constrained_module.ConstrainedStep(walks + [None], 0.0)


@pytest.mark.parametrize("sampling", [SamplingSpec(), SamplingSpec(temperature=1.0), SamplingSpec(temperature=0.6, top_k=7),
                                      SamplingSpec(temperature=0.9, top_p=0.8), SamplingSpec(temperature=1.3, top_k=5, top_p=0.5)])
def test_a_choice_the_constraint_allows_stands(sampling):
    """Choosing unmasked and again only where the constraint forbids the choice (or under top-p) gives
    exactly the choices made over the masked logits, on every row and position."""
    generator = torch.Generator().manual_seed(0)
    vocab, rows, width = 80, 4, 5
    for trial in range(40):
        step = random_step(vocab, rows, width, generator)
        logits = torch.randn(rows, width, vocab, generator=generator) * 3
        noises = [None if sampling.greedy else torch.empty(width, vocab).exponential_(generator=generator)
                  for _ in range(rows)]
        samplings = [sampling] * rows
        chosen = step.choose(logits, sampling_module.choose_rows(logits, samplings, noises), samplings, noises)
        allowed = allowed_tokens(step.bitmasks(width), vocab)
        allowed[-1] = True  # the unconstrained row
        expected = sampling_module.choose_rows(logits.masked_fill(~allowed, float("-inf")), samplings, noises)
        assert torch.equal(chosen, expected), trial


def test_a_matcher_in_its_error_state_is_never_complete_and_says_so(tmp_path, llama_pair):
    """The engine refusing a token leaves it stopped for good: that must not pass a cut text off as
    complete, nor be taken silently."""
    pipe = pipeline(tmp_path, llama_pair, "plain")
    matcher = pipe.matcher(CONSTRAINTS["lark"])
    forbidden = pipe.tokenizer.encode("zzz", add_special_tokens=False)[0]
    matcher.matcher.consume_token(forbidden)
    assert matcher.matcher.is_error() and not matcher.complete
    with pytest.raises(RuntimeError, match="grammar engine failed"):
        matcher.advance([forbidden])


def test_a_list_of_constraints_gives_one_a_prompt(tmp_path, llama_pair):
    pipe = pipeline(tmp_path, llama_pair, "plain")
    with pytest.raises(UsageError, match="one a prompt"):
        pipe.generate_many([PROMPT, PROMPT], constraint=[SCHEMA])
