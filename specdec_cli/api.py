"""The Python API: a profile's models loaded once, serving any number of generations.

    from specdec_cli import Pipeline
    pipe = Pipeline.from_profile("smollm2-demo")
    result = pipe.generate("Rename x to count in: def f(x): return x + 1")
    print(result.text, result.stats.acceptance_rate)
    for result in pipe.generate_many(["def add(a, b):", "class Stack:"], batch_size=8):  # Generation or PromptError
        ...
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from typing import Any, Iterable, Iterator

import torch

from .cache_dirs import inductor_cache_dir
from .constraints.matcher import GrammarVocabulary, RowMatcher
from .decoding.batch_k import CANDIDATES, GoodputK
from .decoding.batched import BatchedDecoder, Request
from .decoding.commit import token_limit
from .decoding.engine import SpeculativeDecoder
from .decoding.events import Event, Finished
from .decoding.stats import DecodeStats
from .decoding.stop_texts import StopTexts, text_before_stop
from .drafters import build_drafter
from .drafters.base import DraftContext, Drafter
from .drafters.lookup_pool import LookupPool
from .errors import UsageError
from .models.devices import device_clock, resolve_device
from .models.loading import LoadOptions, load_model, load_tokenizer
from .models.pair_checks import same_tokenizer_files
from .models.properties import context_length, eos_token_ids, input_device, vocabulary_size
from .profile import load_profile, with_overrides
from .prompt_runs import (
    AUTO_BATCH,
    BATCH_SIZE_AUTO,
    PromptError,
    check_prompt,
    in_order,
    one_line,
    prompt_seed,
    resolve_batch_size,
)
from .run_clock import timed
from .runtime.compile_choice import costs_for
from .runtime.lm import resolve_compile
from .specs import ConstraintSpec, DrafterSpec, ModelSpec, Profile, SamplingSpec, TreeSpec, Workload, k_for_batch_size

log = logging.getLogger("specdec")
notice = logging.getLogger("specdec.notice")


@dataclass(frozen=True)
class Generation:
    """One generation. `text` ends before a stop text; `token_ids` run to the token that completed
    it (finish_reason "stop"). `seed` is None at temperature 0, where nothing is drawn."""

    text: str
    token_ids: tuple[int, ...]
    prompt_tokens: int
    finish_reason: str
    seed: int | None
    stats: DecodeStats

    def to_dict(self, profile: str) -> dict[str, Any]:
        return {
            "text": self.text,
            "token_ids": list(self.token_ids),
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": len(self.token_ids),
            "finish_reason": self.finish_reason,
            "profile": profile,
            "seed": self.seed,
            "stats": self.stats.to_dict(),
        }


Job = tuple[int, "str | list[int]", int, "ConstraintSpec | None | str"]  # index, prompt, seed, constraint


def new_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


class Pipeline:
    """Target, tokenizer and drafter of one profile, loaded once."""

    def __init__(self, profile: Profile, *, workload: Workload | None = None):
        """`workload`: the generations this pipeline is expected to run (bench, tune-k, --samples),
        which `compile: auto` weighs against the compile's cost; None: one of the profile's
        max_new_tokens."""
        self.profile = profile
        self.device = resolve_device(profile.device)
        self._announced = False
        self.options = LoadOptions(
            device=self.device,
            device_map=profile.device_map,
            trust_remote_code=profile.trust_remote_code,
            allow_pickle=profile.allow_pickle,
        )
        with timed("tokenizer"):
            self.tokenizer = load_tokenizer(profile.target, self.options)
        with timed("target weights"):
            self.target = load_model(profile.target, self.options)
        self.vocab = vocabulary_size(self.target, self.tokenizer)
        self.eos_ids = eos_token_ids(self.target, self.tokenizer)
        self._draft_models: dict[ModelSpec, torch.nn.Module] = {}
        self.lookup_pool = LookupPool()  # every sequence decoded here, which prompt lookup searches too
        self._draft_tokenizers: dict[ModelSpec, object] = {}
        self._compiled_models = [self.target, *self.compiled_draft_models(profile.drafter)]
        self.compile = resolve_compile(
            profile.compile, self.device, self._compiled_models,
            workload or Workload.of(1, profile.max_new_tokens), context_length(self.target),
        )
        self.drafter = self.make_drafter(profile.drafter)
        self._drafter_taken = False  # by a decoder (decoder())
        # the decoder stream() and generate() run on when given none: kept, so that what k: auto
        # learned and the warm static caches carry over from one call to the next
        self._kept: SpeculativeDecoder | None = None
        self._kept_busy = False  # a stream on it is not yet drained
        self._batch_k: dict[int, GoodputK] = {}  # k: auto in a batch: what each batch size learned
        self._grammar_vocabulary: GrammarVocabulary | None = None  # built at the first constraint

    @classmethod
    def from_profile(cls, profile: Profile | str, **overrides: Any) -> "Pipeline":
        """Load a profile (a Profile, a name or a path), with option overrides such as k=4."""
        loaded = load_profile(profile) if isinstance(profile, (str, os.PathLike)) else profile
        return cls(with_overrides(loaded, **overrides) if overrides else loaded)

    # --- building blocks
    def load_draft_model(self, spec: ModelSpec) -> torch.nn.Module:
        if spec not in self._draft_models:  # bench and tune-k build drafters again: load weights once
            with timed("draft weights"):
                self._draft_models[spec] = load_model(spec, replace(self.options, device_map=None))
        return self._draft_models[spec]

    def compiled_draft_models(self, spec: DrafterSpec) -> list[torch.nn.Module]:
        """The draft models (loaded now, the drafter takes them from here), whose steps compile
        with the target's."""
        if spec.drafters:
            return [m for part in spec.drafters for m in self.compiled_draft_models(part)]
        if spec.kind == "model" and spec.model is not None:
            return [self.load_draft_model(spec.model)]
        return []

    def load_draft_tokenizer(self, spec: ModelSpec):
        if spec not in self._draft_tokenizers:  # every decoder's drafter checks it: load once
            shared = same_tokenizer_files(self.profile.target, spec)
            with timed("tokenizer"):
                self._draft_tokenizers[spec] = self.tokenizer if shared else load_tokenizer(spec, self.options)
        return self._draft_tokenizers[spec]

    def make_drafter(self, spec: DrafterSpec) -> Drafter:
        context = DraftContext(
            target=self.target,
            tokenizer=self.tokenizer,
            vocab=self.vocab,
            device=input_device(self.target),
            load_model=self.load_draft_model,
            load_tokenizer=self.load_draft_tokenizer,
            target_name=self.profile.target.model,
            compile=self.compile, allow_pickle=self.profile.allow_pickle, lookup_pool=self.lookup_pool,
        )
        return build_drafter(spec, context)

    @property
    def context_length(self) -> int | None:
        lengths = [n for n in [context_length(self.target)] + [context_length(m) for m in self._draft_models.values()] if n]
        return min(lengths) if lengths else None

    def decoder(
        self,
        *,
        k: int | str | None = None,
        drafter: Drafter | None | str = "profile",
        tree: TreeSpec | None | str = "profile",
    ) -> SpeculativeDecoder:
        """A decoder over the loaded models; drafter=None gives plain decoding (same code path).
        `tree`: the profile's (default), None for a chain of k, or a TreeSpec.
        Each decoder owns its drafter (a draft model's cache is a decoder's state): the first
        takes the one built at load, later ones a new one over the same weights."""
        chosen = drafter
        if drafter == "profile":
            chosen = self.drafter if not self._drafter_taken else self.make_drafter(self.profile.drafter)
            self._drafter_taken = True
        return SpeculativeDecoder(
            self.target,
            chosen,
            vocab=self.vocab,
            eos_ids=self.eos_ids,
            k=self.profile.k if k is None else k,
            adaptive=self.profile.adaptive,
            tree=self.profile.tree if tree == "profile" else tree,
            context_length=self.context_length,
            compile=self.compile,
            on_compile=self.announce_compiling,
        )

    @property
    def kept_decoder(self) -> SpeculativeDecoder:
        """The profile's decoder that stream() and generate() reuse when given none."""
        if self._kept is None:
            self._kept = self.decoder()
        return self._kept

    def announce_compiling(self, what: str) -> None:
        """Said once per pipeline, before its first compile: the wait that follows is not a hang,
        and how long it took here before. No promise of a fast second run: on CPU the frozen graph
        is rebuilt every run, only its C++ kernels come from the disk cache (configure_compiler)."""
        if not self._announced:
            self._announced = True
            costs = [costs_for(model, self.device) for model in self._compiled_models]
            if costs and all(c.compile_measured for c in costs):
                notice.info("%s: about %.0f s, as it took here before", what, sum(c.compile_s for c in costs))
            else:
                notice.info("%s: a minute or more (a later run reuses only its C++ kernels, from %s)",
                            what, inductor_cache_dir())

    def uses_chat(self, chat: bool | str | None = None) -> bool:
        wanted = self.profile.chat if chat is None else chat
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        if wanted is True and not has_template:
            raise UsageError(f"--chat: the tokenizer of '{self.profile.target.model}' has no chat template; use --no-chat")
        return has_template if wanted == "auto" else bool(wanted)

    def encode(self, prompt: str, chat: bool | str | None = None) -> list[int]:
        """Prompt text -> ids, through the chat template when the profile (or `chat`) says so."""
        check_prompt(prompt)
        if self.uses_chat(chat):
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = self.tokenizer(prompt)["input_ids"]
        if not ids:
            raise UsageError("the prompt encodes to no tokens")
        return self.checked_ids(ids)

    def checked_ids(self, ids) -> list[int]:
        """Prompt ids the target can read: each a row of its input embedding (a tokenizer can
        know more tokens than the model has rows, and such an id would fail inside the forward)."""
        ids = [int(i) for i in ids]
        if not ids:
            raise UsageError("the prompt has no tokens")
        rows = self.target.get_input_embeddings().weight.shape[0]
        outside = [i for i in ids if not 0 <= i < rows]
        if outside:
            raise UsageError(
                f"the prompt has token id {outside[0]}, outside the target's {rows}-row embedding "
                f"({len(outside)} such tokens): its tokenizer knows tokens '{self.profile.target.model}' cannot read; "
                "rephrase the prompt or use a tokenizer that matches the model"
            )
        return ids

    def text_of(self, token_ids, stops: tuple[str, ...] = ()) -> str:
        """The text of generated ids, ending before the first stop text."""
        text = self.decode(token_ids)
        before = text_before_stop(text, stops) if stops else None
        return text if before is None else before

    def decode(self, token_ids) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def matcher(self, constraint: ConstraintSpec | None | str = "profile") -> RowMatcher | None:
        """A fresh matcher for one generation under `constraint` ("profile": the profile's; None:
        unconstrained)."""
        spec = self.profile.constraint if constraint == "profile" else constraint
        if spec is None:
            return None
        if self._grammar_vocabulary is None:
            with timed("grammar vocabulary"):
                self._grammar_vocabulary = GrammarVocabulary(self.tokenizer, self.eos_ids)
        return self._grammar_vocabulary.matcher(spec)

    def limit_for(self, prompt_tokens: int, max_new_tokens: int | None) -> int:
        """max_new_tokens, cut (with a warning) where it would pass the context length."""
        wanted = self.profile.max_new_tokens if max_new_tokens is None else max_new_tokens
        limit = token_limit(self.context_length, prompt_tokens, wanted)
        if limit < wanted:
            log.warning("max_new_tokens %d would pass the context of %d tokens: stopping after %d",
                        wanted, self.context_length, limit)
        return limit

    # --- generation
    def stream(
        self,
        prompt: str | list[int],
        *,
        max_new_tokens: int | None = None,
        sampling: SamplingSpec | None = None,
        seed: int | None = None,
        chat: bool | str | None = None,
        decoder: SpeculativeDecoder | None = None,
        stop: tuple[str, ...] | list[str] = (),
        constraint: ConstraintSpec | None | str = "profile",
    ) -> Iterator[Event]:
        """Events of one generation (see decoding/events.py); prompt text or ids. `stop`: texts that end
        it at the token completing one (the Finished event's ids run to that token). `constraint`:
        what the text must spell (ConstraintSpec; "profile": the profile's; None: nothing).
        `decoder`: None runs on the kept one (kept_decoder), or on a fresh one while another
        stream still holds it."""
        ids = self.encode(prompt, chat) if isinstance(prompt, str) else self.checked_ids(prompt)
        options = dict(
            max_new_tokens=self.limit_for(len(ids), max_new_tokens),
            sampling=sampling or self.profile.sampling,
            seed=new_seed() if seed is None else seed,
            stop=StopTexts(stop, self.decode).check if stop else None,
            constraint=self.matcher(constraint),
        )
        if decoder is not None:
            return decoder.stream(ids, **options)
        return self._stream_kept(ids, options)

    def _stream_kept(self, ids: list[int], options: dict[str, Any]) -> Iterator[Event]:
        # two streams open at once must not share a decoder: its caches hold one sequence
        if self._kept_busy:
            yield from self.decoder().stream(ids, **options)
            return
        decoder, self._kept_busy = self.kept_decoder, True
        try:
            yield from decoder.stream(ids, **options)
        finally:
            self._kept_busy = False

    def generate(self, prompt: str | list[int], *, seed: int | None = None, **kwargs: Any) -> Generation:
        """One generation, with stream()'s options; its text ends before any stop text."""
        seed = new_seed() if seed is None else seed
        for event in self.stream(prompt, seed=seed, **kwargs):
            if isinstance(event, Finished):
                return self._generation(event, seed, kwargs.get("sampling"), kwargs.get("stop") or ())
        raise RuntimeError("the decoder stopped without a Finished event")

    def _generation(self, event: Finished, seed: int, sampling: SamplingSpec | None, stop: Iterable[str]) -> Generation:
        """The Generation of a finished decoding; its seed is None at temperature 0 (nothing drawn)."""
        return Generation(
            text=self.text_of(event.token_ids, tuple(stop)),
            token_ids=event.token_ids,
            prompt_tokens=event.stats.prompt_tokens,
            finish_reason=event.finish_reason,
            seed=None if (sampling or self.profile.sampling).greedy else seed,
            stats=event.stats,
        )

    def generate_many(
        self, prompts: Iterable[str | list[int]], *, batch_size: int | str = 1, seed: int | None = None, **kwargs: Any,
    ) -> Iterator[Generation | PromptError]:
        """generate() for each prompt (text or ids) in turn, yielded in input order as each and all
        before it are done: a Generation, or a PromptError where that prompt cannot run (the others
        still do). `seed`: prompt i draws with seed + i (None: a fresh seed, each row's in its
        Generation). `batch_size`: N rows decoded at once, or 'auto' (batched_decoder). `constraint`
        (in kwargs): one for every prompt, or a list with one (or None) per prompt. A row's
        tokens are its prompt's batch-1 tokens (greedy, or with its seed) whatever shares its batch.
        The models stay loaded, and what k: auto learns carries over to the next call (at batch
        size 1 on the kept decoder, in a batch per batch size); `kwargs`: generate()'s.
        A profile whose models cannot run in a batch (a cache layout the batch cannot hold) is a
        UsageError here, before any prompt runs."""
        size = resolve_batch_size(batch_size)
        base = new_seed() if seed is None else seed
        self.uses_chat(kwargs.get("chat"))  # a profile-wide failure fails the call once, not every row
        constraint = kwargs.pop("constraint", "profile")
        per_prompt = constraint if isinstance(constraint, (list, tuple)) else None
        if per_prompt is not None:
            prompts = list(prompts)
            if len(per_prompt) != len(prompts):
                raise UsageError(f"constraint: a list gives one a prompt: {len(per_prompt)} for {len(prompts)} prompts")
        jobs = ((index, prompt, prompt_seed(base, index), constraint if per_prompt is None else per_prompt[index])
                for index, prompt in enumerate(prompts))
        return in_order(self._run_batch(jobs, size, dict(kwargs)))

    def _run_batch(
        self, jobs: Iterator[Job], batch_size: int | str, options: dict[str, Any],
    ) -> Iterator[tuple[int, Generation | PromptError]]:
        """(index, result) for (index, prompt, seed, constraint) jobs as they finish, in any order (generate_many
        puts them back in input order). Batch size 1: each prompt in turn on the kept decoder (trees,
        heads, k: auto, compile). Larger: one BatchedDecoder, built here, before any prompt runs, so
        that what cannot run in a batch is refused at the call and not after some rows."""
        decoder = None if batch_size == 1 else self.batched_decoder(batch_size)
        if decoder is None:
            return self._run_alone(jobs, options)
        if options.pop("decoder", None) is not None:
            raise UsageError("decoder= runs one prompt at a time: give batch_size=1")
        return self._run_batched(decoder, jobs, options)

    def _run_alone(self, jobs: Iterator[Job], options: dict[str, Any],
                   ) -> Iterator[tuple[int, Generation | PromptError]]:
        for index, prompt, seed, constraint in jobs:
            try:
                yield index, self.generate(prompt, seed=seed, constraint=constraint, **options)
            except UsageError as exc:  # this prompt cannot run (empty, too long, unreadable ids); the rest can
                yield index, PromptError(index, one_line(str(exc)))

    def batched_decoder(self, batch_size: int | str) -> BatchedDecoder | None:
        """The profile's BatchedDecoder for `batch_size` rows, or its one-line UsageError naming
        what cannot run in a batch. 'auto': AUTO_BATCH rows, or None (one at a time) where
        the profile cannot run in a batch: the engine's own refusal decides, so the two never
        disagree. A `k_by_batch_size` table's k for this size comes first; else with k: auto, steps choose
        k by goodput, from what earlier runs at this size learned."""
        size = AUTO_BATCH if batch_size == BATCH_SIZE_AUTO else batch_size
        tabled = k_for_batch_size(self.profile.k_by_batch_size, size)  # tune-k --batch-sizes' measured k, 0: plain
        k = self.profile.k if tabled is None else tabled
        if k == "auto":
            if size not in self._batch_k:
                candidates = [c for c in CANDIDATES if c <= self.profile.adaptive.k_max]
                clock_device = input_device(self.target)
                self._batch_k[size] = GoodputK(candidates, clock=lambda: device_clock(clock_device))
            k = self._batch_k[size]
        try:
            return BatchedDecoder(
                self.target, lambda: self.make_drafter(self.profile.drafter), vocab=self.vocab, eos_ids=self.eos_ids,
                k=k, batch_size=size, context_length=self.context_length, tree=self.profile.tree,
                adaptive=self.profile.adaptive,
                compile=self.compile, on_compile=self.announce_compiling,
            )
        except UsageError as exc:
            if batch_size != BATCH_SIZE_AUTO:
                raise
            log.info("batch size auto: 1, as %s", one_line(str(exc)))
            return None

    def _run_batched(self, decoder: BatchedDecoder, jobs: Iterator[Job],
                     options: dict[str, Any]) -> Iterator[tuple[int, Generation | PromptError]]:
        failed: list[tuple[int, PromptError]] = []  # prompts the requests could not make, yielded as they come
        sampling, stop = options.get("sampling"), options.get("stop") or ()
        for (index, seed), finished in decoder.run(self._requests(jobs, failed, **options)):
            yield from failed
            failed.clear()
            yield index, self._generation(finished, seed, sampling, stop)
        yield from failed

    def _requests(self, jobs: Iterator[Job], failed: list[tuple[int, PromptError]], *,
                  max_new_tokens: int | None = None, sampling: SamplingSpec | None = None,
                  chat: bool | str | None = None, stop: Iterable[str] = ()) -> Iterator[Request]:
        """A Request for each job, encoded and checked as the batch takes it (stream()'s checks); a
        prompt that cannot run goes to `failed` and the rest still run."""
        check_stop = StopTexts(tuple(stop), self.decode).check if stop else None  # no state: one serves every row
        for index, prompt, seed, constraint in jobs:
            try:
                ids = self.encode(prompt, chat) if isinstance(prompt, str) else self.checked_ids(prompt)
                limit = self.limit_for(len(ids), max_new_tokens)
                matcher = self.matcher(constraint)
            except UsageError as exc:
                failed.append((index, PromptError(index, one_line(str(exc)))))
                continue
            yield Request((index, seed), ids, limit, sampling or self.profile.sampling, seed, check_stop, matcher)
