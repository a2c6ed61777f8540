"""transformers' generate as methods bench times beside ours: alone (hf-plain), and assisted by the
profile's draft model or by prompt lookup (hf-assisted), with the knobs transformers reads."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..api import Pipeline
from ..decoding.transformers_generate import transformers_generate
from ..models.properties import input_device
from ..specs import SamplingSpec
from . import engine_methods  # its synced_clock looked up at run time, so that a test clock can take its place
from .engine_methods import Clock


class FirstTokenClock:
    """A generate() streamer that notes when the first new tokens arrive (after a device sync)."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.calls = 0
        self.first_at: float | None = None
        self.first_tokens = 0

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2:  # the first call carries the prompt
            self.first_at = self.clock()
            self.first_tokens = int(value.numel())

    def end(self) -> None:
        pass


class ForwardCounter:
    """The target's forwards in one generate(), and the tokens they read."""

    def __init__(self, model: torch.nn.Module):
        self.count = 0
        self.tokens = 0
        self.handle = model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output) -> None:
        self.count += 1
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.tokens += int(ids.shape[-1]) if isinstance(ids, torch.Tensor) else 0

    def close(self) -> int:
        self.handle.remove()
        return self.count

    def drafted(self, prompt_length: int) -> int:
        """Candidates the target verified, in its own tokens: its first forward reads the prompt and
        the first candidates, each later one the last step's own token and the new candidates."""
        return self.tokens - prompt_length - max(0, self.count - 1)


class HFMethod:
    """transformers' generate: alone (`hf-plain`), or assisted by the profile's draft model.

    transformers 5 reads the assisted-generation knobs from the ASSISTANT's generation_config,
    so they are set there for the call and restored after it. `assistant_settings` None keeps
    transformers' defaults (up to 20 drafts, a 0.4 confidence threshold). A draft with another
    tokenizer gets both tokenizers in `generate_kwargs` (Universal Assisted Generation); there
    the knobs count the draft's own tokens.
    """

    def __init__(self, name: str, pipeline: Pipeline, assistant: torch.nn.Module | None = None,
                 assistant_settings: dict[str, Any] | None = None, generate_kwargs: dict[str, Any] | None = None,
                 clock: Clock | None = None):
        self.name = name
        self.pipeline = pipeline
        self.clock = clock or engine_methods.synced_clock(input_device(pipeline.target))
        self.assistant = assistant
        self.assistant_settings = assistant_settings or {}
        self.generate_kwargs = generate_kwargs or {}

    def run(self, ids, max_new_tokens, sampling, seed):
        pipeline = self.pipeline
        kwargs: dict[str, Any] = dict(self.generate_kwargs)
        if not sampling.greedy:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or None, top_p=sampling.top_p)
            torch.manual_seed(seed)
        if self.assistant is not None:
            kwargs["assistant_model"] = self.assistant
        clock = FirstTokenClock(self.clock)
        counter = ForwardCounter(pipeline.target)
        saved = self._apply_assistant_settings()
        try:
            started = self.clock()
            token_ids = transformers_generate(pipeline, ids, max_new_tokens, streamer=clock, **kwargs)
            ended = self.clock()
        except Exception as exc:  # noqa: BLE001 - transformers' own failure on one run ends no bench
            lines = str(exc).strip().splitlines()
            error = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
            return {"token_ids": (), "ttft_seconds": 0.0, "total_seconds": 0.0, "first_tokens": 0, "error": error}
        finally:
            self._restore_assistant_settings(saved)
            forwards = counter.close()
        assisted = self.assistant is not None
        return {
            "token_ids": token_ids,
            "ttft_seconds": (clock.first_at or ended) - started,
            "total_seconds": ended - started,
            "first_tokens": clock.first_tokens,
            "target_forwards": forwards,
            # counted in the target's tokens, whatever the draft's tokenizer
            "drafted": counter.drafted(len(ids)) if assisted else None,
            # each target forward emits its accepted drafts plus one token of its own
            "accepted": len(token_ids) - forwards if assisted else None,
        }

    def _apply_assistant_settings(self) -> dict[str, Any]:
        if self.assistant is None:
            return {}
        config = self.assistant.generation_config
        saved = {key: getattr(config, key, None) for key in self.assistant_settings}
        for key, value in self.assistant_settings.items():
            setattr(config, key, value)
        return saved

    def _restore_assistant_settings(self, saved: dict[str, Any]) -> None:
        for key, value in saved.items():
            setattr(self.assistant.generation_config, key, value)


def draft_model_of(pipeline: Pipeline) -> torch.nn.Module | None:
    """The profile drafter's own draft model, which transformers can use as an assistant (or None)."""
    return pipeline.drafter.draft_model


def other_tokenizer_assistant(pipeline: Pipeline, sampling: SamplingSpec) -> tuple[dict[str, Any] | None, str]:
    """Universal Assisted Generation for a draft with another tokenizer: the generate() arguments
    that ask for it (None where it is left out), and a note for the report.

    At temperature 0 transformers re-encodes the draft's text into target tokens and keeps the
    exact matches: the target's greedy text. Above it, transformers' sampled path (its own token
    intersection) prunes the assistant's output head in place, for good, and its first token did
    not follow the target's distribution on a tiny pair (chi-square): no speed to compare with.
    """
    def size(model: torch.nn.Module) -> int:
        return model.config.get_text_config().vocab_size

    if not sampling.greedy:
        return None, ("hf-assisted left out: above temperature 0 transformers' assisted generation with another "
                      "tokenizer did not keep the target's distribution when tested; it runs at temperature 0")
    if size(pipeline.drafter.draft_model) == size(pipeline.target):
        # transformers tells two tokenizers apart by this size alone, and refuses assistant_tokenizer where it matches
        return None, ("hf-assisted left out: transformers takes a draft with another tokenizer only where "
                      f"the two models' vocab_size differ (both {size(pipeline.target)})")
    overlap = getattr(pipeline.drafter, "overlap", None)
    note = ("hf-assisted: the draft has another tokenizer: transformers' Universal Assisted Generation "
            "(tokenizer= and assistant_tokenizer=), its k counted in the draft's tokens"
            + (f"; {overlap.describe()}" if overlap is not None else ""))
    return {"tokenizer": pipeline.tokenizer, "assistant_tokenizer": pipeline.drafter.draft_tokenizer}, note



def assisted_methods(pipeline: Pipeline, k: int | str, hf_ks: Sequence[int], sampling: SamplingSpec,
                     clock: Clock | None) -> tuple[list[HFMethod], str | None]:
    """bench's hf-assisted: the methods, and a note where they differ from ours or are left out.

    transformers' assisted generation uses the drafter's own draft model (kind model, or a chain's
    model member; with both tokenizers where the draft's is another), or prompt lookup for kind
    ngram. It runs at its defaults and at a constant k for each of `hf_ks` (default: the profile's
    k), so that the comparison can be with its best constant k.
    """
    assistant = draft_model_of(pipeline)
    kind = pipeline.profile.drafter.kind
    tokenizers: dict[str, Any] | None = {}
    note = None
    if assistant is not None and pipeline.drafter.draft_tokenizer is not None:
        tokenizers, note = other_tokenizer_assistant(pipeline, sampling)
        if tokenizers is None:
            return [], note
    if assistant is not None:
        methods = [HFMethod("hf-assisted-default", pipeline, assistant, generate_kwargs=tokenizers, clock=clock)]
        for hf_k in hf_ks or ([k] if isinstance(k, int) else []):
            constant = {"num_assistant_tokens": hf_k, "num_assistant_tokens_schedule": "constant",
                        "assistant_confidence_threshold": 0.0}
            methods.append(HFMethod(f"hf-assisted-k{hf_k}", pipeline, assistant, constant, tokenizers, clock=clock))
        return methods, note
    if kind == "ngram":
        lookup = {"prompt_lookup_num_tokens": k if isinstance(k, int) else 10,
                  "max_matching_ngram_size": pipeline.profile.drafter.options["max_ngram"]}
        return [HFMethod("hf-assisted-default", pipeline, generate_kwargs=lookup, clock=clock)], None
    return [], f"hf-assisted left out: transformers has no equivalent of drafter kind '{kind}'"
