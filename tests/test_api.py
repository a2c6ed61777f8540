"""Pipeline keeps one decoder across generate() and stream() calls: the same text, and what
k: auto learned carries over; streams open at once never share it."""

from __future__ import annotations

import json
import shutil

from profile_helpers import model_profile
from specdec_cli import Pipeline
from specdec_cli.decoding.events import Finished


def auto_pipeline(tmp_path, llama_pair) -> Pipeline:
    return Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, k="auto", adaptive={"k_max": 8, "threshold": 0.3})))


def test_generate_reuses_one_decoder_and_k_auto_keeps_learning(tmp_path, llama_pair):
    pipe = auto_pipeline(tmp_path, llama_pair)
    first = pipe.generate("def reverse(items):", max_new_tokens=40, chat=False)
    kept = pipe.kept_decoder
    learned = kept.lookahead.steps
    assert learned == len(first.stats.steps) > 0
    second = pipe.generate("def reverse(items):", max_new_tokens=40, chat=False)
    assert pipe.kept_decoder is kept
    assert second.text == first.text and second.token_ids == first.token_ids  # temperature 0
    assert kept.lookahead.steps == learned + len(second.stats.steps)  # not started afresh
    plain = pipe.generate("def reverse(items):", max_new_tokens=40, chat=False, decoder=pipe.decoder(drafter=None))
    assert plain.token_ids == first.token_ids


def test_streams_open_at_once_do_not_share_the_kept_decoder(tmp_path, llama_pair):
    pipe = auto_pipeline(tmp_path, llama_pair)
    prompts = ["def reverse(items):", "class Stack:"]
    alone = [pipe.generate(p, max_new_tokens=30, chat=False).token_ids for p in prompts]
    streams = [pipe.stream(p, max_new_tokens=30, chat=False) for p in prompts]
    finished: dict[int, tuple[int, ...]] = {}
    while len(finished) < len(streams):  # one event of each in turn
        for i, stream in enumerate(streams):
            if i not in finished:
                event = next(stream)
                if isinstance(event, Finished):
                    finished[i] = event.token_ids
    assert [finished[0], finished[1]] == alone
    assert pipe.generate(prompts[0], max_new_tokens=30, chat=False).token_ids == alone[0]  # free again


def test_a_draft_with_the_targets_tokenizer_files_shares_its_tokenizer(tmp_path, llama_pair, vocab_pair):
    """Byte-identical tokenizer files: one tokenizer loaded; different ones (or an edited
    tokenizer_config.json): the draft's own."""
    same = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair)))
    assert same.load_draft_tokenizer(same.profile.drafter.model) is same.tokenizer
    other = Pipeline.from_profile(str(model_profile(tmp_path, vocab_pair, name="other")))
    assert other.load_draft_tokenizer(other.profile.drafter.model) is not other.tokenizer
    edited = tmp_path / "edited-draft"
    shutil.copytree(llama_pair["draft"], edited)
    config = json.loads((edited / "tokenizer_config.json").read_text())
    (edited / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 77}))
    pipe = Pipeline.from_profile(str(model_profile(tmp_path, {**llama_pair, "draft": edited}, name="edited")))
    draft_tokenizer = pipe.load_draft_tokenizer(pipe.profile.drafter.model)
    assert draft_tokenizer is not pipe.tokenizer and draft_tokenizer.model_max_length == 77
