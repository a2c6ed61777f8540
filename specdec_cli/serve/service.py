"""What the server does with a request: its prompt's tokens (the chat template for chat), its
length, sampling, seed and stop texts as `specdec generate` would take them, a row in the engine,
and the row's events as a whole response or as streamed chunks.

A field a request leaves out takes the profile's value (temperature, top_p, top_k) or the server's
(max tokens): the same request and `specdec generate` with the same profile give the same tokens.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass
from typing import Any, AsyncIterator, Hashable

from starlette.concurrency import run_in_threadpool

from ..api import Pipeline, new_seed
from ..constraints.matcher import RowMatcher
from ..decoding.batched import Request
from ..decoding.commit import token_limit
from ..decoding.events import Finished, Verified
from ..decoding.stop_texts import StopTexts
from ..errors import ContextLengthError, UsageError
from ..prompt_runs import one_line
from ..specs import SamplingSpec
from .engine import Engine, EngineFault, QueueFull
from .errors import ApiError
from .responses import FINISH_REASONS, GrowingText, Shape, speculation, usage
from .schemas import ChatRequest, CompletionRequest, Sampling

DISCONNECT_POLL_S = 0.5  # how often a non-streamed request looks for its client gone
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class Prepared:
    """A request made ready for the engine."""

    ids: list[int]
    limit: int
    sampling: SamplingSpec
    seed: int
    stops: tuple[str, ...]
    constraint: RowMatcher | None = None  # response_format's, else the profile's


class Service:
    """The loaded pipeline and its engine, answering requests."""

    def __init__(self, pipeline: Pipeline, engine: Engine, *, model_id: str, max_tokens: int):
        self.pipeline = pipeline
        self.engine = engine
        self.model_id = model_id
        self.max_tokens = max_tokens
        profile = pipeline.profile
        self.names = {model_id, profile.name, profile.target.model}
        self.drafter = profile.drafter.describe()
        self.tree = None if profile.tree is None else str(profile.tree)
        # requests are encoded on the thread pool, several at once: one at a time through the
        # tokenizer, whose Rust core refuses to be borrowed by two threads when a call changes its settings
        self._encoding = threading.Lock()
        # decoding (the engine's stop texts, the streamed text) borrows it without changing it; one
        # encode now settles its truncation and padding settings before any thread shares it
        pipeline.tokenizer("warm", add_special_tokens=False)

    # --- checks and encoding (off the event loop: tokenizers take their time on long prompts)
    def check_model(self, request: Sampling) -> None:
        if request.model is not None and request.model not in self.names:
            raise ApiError(404, f"model '{request.model}' is not served here; GET /v1/models lists '{self.model_id}'",
                           param="model", code="model_not_found")

    def prepare(self, request: ChatRequest | CompletionRequest) -> Prepared:
        with self._encoding:
            ids = self._encode(request)
            constraint = self._constraint(request)
        wanted = request.length() or self.max_tokens
        if self.pipeline.context_length is None and wanted > self.max_tokens:  # nothing else bounds its caches
            raise ApiError(400, f"max_tokens: {wanted} is above this server's {self.max_tokens} (its -n), and the "
                           "model states no context length to allow more", param="max_tokens")
        try:
            limit = token_limit(self.pipeline.context_length, len(ids), wanted)
        except ContextLengthError as exc:
            raise ApiError(400, str(exc), param="messages" if isinstance(request, ChatRequest) else "prompt",
                           code="context_length_exceeded") from None
        defaults = self.pipeline.profile.sampling
        sampling = SamplingSpec(
            temperature=defaults.temperature if request.temperature is None else request.temperature,
            top_k=defaults.top_k if request.top_k is None else request.top_k,
            top_p=defaults.top_p if request.top_p is None else request.top_p,
        )
        seed = new_seed() if request.seed is None else request.seed
        return Prepared(ids, limit, sampling, seed, request.stops(), constraint)

    def _constraint(self, request: ChatRequest | CompletionRequest) -> RowMatcher | None:
        """A matcher for response_format's constraint (none given: the profile's, as generate)."""
        try:
            wanted = "profile" if request.response_format is None else request.response_format.constraint()
            return self.pipeline.matcher(wanted)
        except (UsageError, ValueError) as exc:
            raise ApiError(400, one_line(str(exc)), param="response_format") from None

    def _encode(self, request: ChatRequest | CompletionRequest) -> list[int]:
        tokenizer = self.pipeline.tokenizer
        try:
            if isinstance(request, CompletionRequest):
                if isinstance(request.prompt, list):
                    return self.pipeline.checked_ids(request.prompt)
                return self.pipeline.encode(request.prompt, chat=False)
            if not getattr(tokenizer, "chat_template", None):
                raise ApiError(400, f"'{self.model_id}' has no chat template: use /v1/completions with the prompt's text",
                               param="messages", code="no_chat_template")
            messages = [{"role": m.role if m.role != "developer" else "system", "content": m.text()}
                        for m in request.messages]
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return self.pipeline.checked_ids(tokenizer(text, add_special_tokens=False)["input_ids"])
        except UsageError as exc:
            raise ApiError(400, one_line(str(exc)), param="prompt") from None
        except ApiError:
            raise
        except Exception as exc:  # a template that fails on these messages (e.g. roles out of order)
            raise ApiError(400, f"the messages cannot be put through the chat template: {one_line(str(exc))}",
                           param="messages") from None

    # --- a request's run
    async def start(self, request: ChatRequest | CompletionRequest) -> tuple[Hashable, asyncio.Queue, Prepared]:
        """Checked, encoded and queued: the row's key, its events' queue and what it runs."""
        self.check_model(request)
        prepared = await run_in_threadpool(self.prepare, request)
        check_stop = StopTexts(prepared.stops, self.pipeline.decode).check if prepared.stops else None
        events: asyncio.Queue = asyncio.Queue()

        def make(key: Hashable) -> Request:
            return Request(key, prepared.ids, prepared.limit, prepared.sampling, prepared.seed, check_stop,
                           prepared.constraint)

        try:
            key = self.engine.submit(make, asyncio.get_running_loop(), events)
        except QueueFull:
            raise ApiError(429, f"the queue is full ({self.engine.max_queue} requests wait): retry shortly",
                           code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        return key, events, prepared

    async def whole(self, shape: Shape, key: Hashable, events: asyncio.Queue, prepared: Prepared,
                    disconnected) -> dict[str, Any] | None:
        """The response once the row is done; None where the client went meanwhile (its row given up)."""
        finished = False
        try:
            while True:
                try:
                    event = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    if await disconnected():
                        return None
                    continue
                if isinstance(event, EngineFault):
                    finished = True
                    raise ApiError(500, event.message, code="engine_error")
                if isinstance(event, Finished):
                    finished = True
                    reason, counted, spec = self._ending(event, prepared)
                    return shape.whole(self.pipeline.text_of(event.token_ids, prepared.stops), reason, counted, spec)
        finally:
            if not finished:
                self.engine.cancel(key)

    async def chunks(self, shape: Shape, key: Hashable, events: asyncio.Queue, prepared: Prepared,
                     include_usage: bool) -> AsyncIterator[str]:
        """The stream's `data:` payloads as each step lands, ending "[DONE]"; a client gone (the
        task cancelled) gives up the row."""
        text = GrowingText(self.pipeline.decode, prepared.stops)
        finished = False
        first = True
        try:
            while True:
                event = await events.get()
                if isinstance(event, EngineFault):
                    finished = True
                    yield json.dumps(ApiError(500, event.message, code="engine_error").body())
                    break
                if isinstance(event, Verified):
                    new = text.add(event.emitted)
                    if new or first:
                        yield json.dumps(shape.chunk(new, first=first))
                        first = False
                elif isinstance(event, Finished):
                    finished = True
                    rest = text.finish(self.pipeline.text_of(event.token_ids, prepared.stops))
                    if rest or first:
                        yield json.dumps(shape.chunk(rest, first=first))
                    reason, counted, spec = self._ending(event, prepared)
                    yield json.dumps(shape.chunk("", finish_reason=reason, extra={"speculation": spec}))
                    if include_usage:
                        yield json.dumps(shape.chunk(None, extra={"usage": counted, "speculation": spec}))
                    break
            yield "[DONE]"
        finally:
            if not finished:
                self.engine.cancel(key)

    def _ending(self, event: Finished, prepared: Prepared) -> tuple[str, dict[str, int], dict[str, Any]]:
        """A finished row's finish reason as the API says it, its usage and its speculation."""
        return (FINISH_REASONS.get(event.finish_reason, event.finish_reason),
                usage(len(prepared.ids), len(event.token_ids)), speculation(event.stats, self.drafter, self.tree))
