"""Drafter specifics: the early-exit view is the target's first layers; chain statistics add up."""

from __future__ import annotations

import pytest
import torch

from profile_helpers import model_profile
from specdec_cli import Pipeline
from specdec_cli.drafters.early_exit import early_exit_view
from specdec_cli.errors import UsageError
from tiny_models import build_model, gpt2_config, llama_config


def truncated_copy(model, layers: int):
    """An independent model with only the first `layers` layers, weights copied by name."""
    config = model.config.__class__.from_dict(model.config.to_dict())
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    small = type(model)(config).eval()
    missing, unexpected = small.load_state_dict(model.state_dict(), strict=False)
    assert not missing  # every weight of the small model came from the big one
    return small


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_early_exit_view_is_the_first_layers(tokenizer, arch, layers):
    config = llama_config(tokenizer, layers=4) if arch == "llama" else gpt2_config(tokenizer, layers=4)
    model = build_model(config, seed=1)
    view = early_exit_view(model, layers)
    reference = truncated_copy(model, layers)
    ids = torch.tensor([tokenizer("def add(a, b): return a + b")["input_ids"]])
    with torch.inference_mode():
        assert torch.allclose(view(ids).logits, reference(ids).logits, atol=1e-5)
        assert not torch.allclose(view(ids).logits, model(ids).logits, atol=1e-3)
    # one set of weights: the view holds the very same parameter tensors
    shared = {p.data_ptr() for p in model.parameters()}
    assert all(p.data_ptr() in shared for p in view.parameters())
    assert model.config.num_hidden_layers == 4  # the target itself is untouched


def test_early_exit_needs_fewer_layers_than_the_target(tmp_path, llama_pair):
    with pytest.raises(UsageError, match="below the target's 4 layers"):
        Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, drafter={"kind": "early-exit", "layers": 4})))


def test_early_exit_default_is_a_quarter_of_the_layers(tmp_path, llama_pair):
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, drafter={"kind": "early-exit"})))
    assert pipe.drafter.name == "early-exit(1)"


def test_chain_statistics_add_up(tmp_path, llama_pair):
    chain = {"kind": "chain", "drafters": [{"kind": "ngram", "max_ngram": 2}, {"kind": "model", "model": str(llama_pair["draft"])}]}
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, drafter=chain)))
    result = pipe.generate("for i in range(10):\n    print(i * i)\nfor i in range(10):\n", chat=False, max_new_tokens=40)
    stats = result.stats
    per = stats.per_drafter
    assert set(per) == {"ngram", "model"}
    assert sum(d["drafted"] for d in per.values()) == stats.drafted
    assert sum(d["accepted"] for d in per.values()) == stats.accepted
    assert sum(d["calls"] for d in per.values()) == sum(1 for s in stats.steps if s.drafted)
    for counts in per.values():
        assert counts["acceptance_rate"] == pytest.approx(counts["accepted"] / counts["drafted"])
    # per position: drafted counts never grow with the position, and acceptance is a rate
    assert all(0 <= a <= 1 for a in stats.per_position_acceptance if a is not None)
    assert sum(stats.accept_length_histogram) == stats.target_forwards


def test_duplicate_chain_members_get_distinct_names(tmp_path, llama_pair):
    chain = {"kind": "chain", "drafters": [{"kind": "ngram", "max_ngram": 3}, {"kind": "ngram", "max_ngram": 1}]}
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, drafter=chain)))
    assert [d.name for d in pipe.drafter.drafters] == ["ngram", "ngram#2"]


def test_adaptive_k_varies_the_draft_length_and_stays_exact(tmp_path, llama_pair):
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, k="auto", adaptive={"k_max": 8, "threshold": 0.3})))
    ids = pipe.encode("def reverse(items):", chat=False)
    result = pipe.generate(ids, max_new_tokens=60)
    plain = pipe.generate(ids, decoder=pipe.decoder(drafter=None), max_new_tokens=60)
    assert result.token_ids == plain.token_ids
    lengths = {s.drafted for s in result.stats.steps if s.drafted}
    assert len(lengths) > 1 and max(lengths) <= 8
    assert result.stats.k == "auto" and len(result.stats.accept_length_histogram) == 9



def test_each_drafter_says_which_draft_model_it_runs(tmp_path, llama_pair):
    """A separate model (kind model, or a chain's model member) is named; prompt lookup and the
    target's own layers have none, so bench never hands transformers the target as an assistant."""
    from specdec_cli.bench.local import build_methods

    def pipeline(drafter: dict) -> Pipeline:
        return Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, drafter=drafter)))

    draft = {"kind": "model", "model": str(llama_pair["draft"])}
    model_pipe = pipeline(draft)
    assert isinstance(model_pipe.drafter.draft_model, torch.nn.Module)
    assert model_pipe.drafter.draft_model is not model_pipe.target
    chain = pipeline({"kind": "chain", "drafters": [{"kind": "ngram"}, draft]}).drafter
    assert chain.draft_model is chain.drafters[1].draft_model is not None
    assert pipeline({"kind": "ngram"}).drafter.draft_model is None
    early_exit = pipeline({"kind": "early-exit"})
    assert early_exit.drafter.draft_model is None
    methods, notes = build_methods(early_exit, ["hf-assisted"], 3)
    assert [m.name for m in methods] == ["plain"] and "early-exit" in notes[0]
    methods, _ = build_methods(model_pipe, ["hf-assisted"], 3)
    assert [m.name for m in methods] == ["plain", "hf-assisted-default", "hf-assisted-k3"]
    assert methods[1].assistant is model_pipe.drafter.draft_model


def test_every_drafter_derives_from_the_contract_and_the_hooks_are_optional(tmp_path, llama_pair):
    """Each kind is a Drafter; one that gives only begin / propose / accept runs in the engine
    (reserve, warmup and take_features are the base's no-ops) and keeps the target's text."""
    from specdec_cli.drafters.base import Draft, Drafter

    draft = {"kind": "model", "model": str(llama_pair["draft"])}
    for spec in [{"kind": "ngram"}, draft, {"kind": "early-exit"}, {"kind": "chain", "drafters": [{"kind": "ngram"}, draft]}]:
        pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, drafter=spec)))
        assert isinstance(pipe.drafter, Drafter), spec
    with pytest.raises(TypeError):
        Drafter()  # begin, propose and accept have no default

    class RepeatLast(Drafter):
        name = "repeat"

        def begin(self, prompt_ids, sampling, noise):
            self.last = int(prompt_ids[-1])

        def propose(self, shape, budget=None):
            return Draft(torch.tensor([self.last] * shape.depth), self.name)

        def accept(self, new_tokens, path):
            self.last = int(new_tokens[-1])

    from specdec_cli.decoding.engine import SpeculativeDecoder

    pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair)))
    plain = pipe.generate("def add(a, b):", max_new_tokens=12, decoder=pipe.decoder(drafter=None))
    # a static cache (eager steps): the engine reserves and warms the drafter too
    decoder = SpeculativeDecoder(pipe.target, RepeatLast(), vocab=pipe.vocab, eos_ids=pipe.eos_ids, k=3, compile="static")
    drafted = pipe.generate("def add(a, b):", max_new_tokens=12, decoder=decoder)
    assert drafted.token_ids == plain.token_ids and drafted.stats.drafted > 0


def _draft(tokens, parents, name, confidences=None):
    from specdec_cli.drafters.base import Draft

    return Draft(torch.tensor(tokens), name, parents=tuple(parents), confidences=confidences)


def test_merged_proposals_share_identical_guesses():
    """Lookup's chain 7 8 9 and a head's tree (7 -> 8, 7 -> 5, 4): 7 and 8 become shared nodes,
    each member's nodes map to the merged tree, and an accepted path maps back into each member's
    numbering as far as it is that member's."""
    from specdec_cli.drafters.chain import member_path, merge_drafts

    lookup = _draft([7, 8, 9], [-1, 0, 1], "ngram")
    head = _draft([7, 4, 8, 5], [-1, -1, 0, 0], "eagle-3", confidences=(0.6, 0.2, 0.5, 0.3))
    merged = merge_drafts([(lookup, 0.001), (head, 0.002)])
    assert merged.token_ids.tolist() == [7, 8, 9, 4, 5]
    assert merged.parents == (-1, 0, 1, -1, 0)
    assert merged.confidences == (None, None, None, 0.2, 0.3)  # a shared node keeps the first proposer's
    assert merged.drafter == "ngram+eagle-3"
    lookup_part, head_part = merged.parts
    assert lookup_part.nodes == (0, 1, 2) and head_part.nodes == (0, 3, 1, 4)
    assert (lookup_part.seconds, head_part.seconds) == (0.001, 0.002)
    assert lookup_part.confidences is None and head_part.confidences == (0.6, 0.2, 0.5, 0.3)  # each learns from its own
    assert member_path(lookup_part, [0, 1, 2]) == [0, 1, 2] and member_path(head_part, [0, 1, 2]) == [0, 2]
    assert member_path(lookup_part, [0, 4]) == [0] and member_path(head_part, [0, 4]) == [0, 3]
    assert member_path(lookup_part, [3]) == [] and member_path(head_part, [3]) == [1]
