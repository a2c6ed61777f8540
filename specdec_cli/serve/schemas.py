"""The requests the server reads, as the OpenAI API shapes them, checked by pydantic (strict:
"0.5" is not a number) before anything reaches the engine. A field specdec cannot honour
exactly (n > 1, penalties, logprobs, tools) is refused with a 400 that names it, never silently
ignored; fields it does not know are ignored, as OpenAI-compatible servers do."""

from __future__ import annotations

import json
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, field_validator

from ..specs import ConstraintSpec
from .errors import ApiError

MAX_STOPS = 4  # as the OpenAI API
MAX_SEED = 2**63 - 1
GREEDY_BELOW = 1e-5  # logits divided by less overflow float32: the greedy choice is that limit


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Strict):
    type: Literal["text"]
    text: StrictStr


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[StrictStr, list[TextPart], None] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False


class JsonSchemaFormat(_Strict):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)

    name: StrictStr | None = None
    schema_: dict = Field(alias="schema")
    strict: bool | None = None  # specdec always holds the text to the schema


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def constraint(self) -> ConstraintSpec | None | str:
        """The constraint asked for; "profile" (text): the profile's, as when no format is given."""
        if self.type == "json_object":
            return ConstraintSpec("json", origin="response_format")
        if self.type == "json_schema":
            if self.json_schema is None:
                raise ValueError("json_schema: give {\"name\": ..., \"schema\": {...}} with type json_schema")
            return ConstraintSpec("json_schema", json.dumps(self.json_schema.schema_), "response_format.json_schema.schema")
        return "profile"


class Sampling(_Strict):
    """What both endpoints share: the model, the length, the sampling and the stream."""

    model: StrictStr | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)  # llama-server's and vLLM's extension
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    stop: Union[StrictStr, list[StrictStr], None] = None
    stream: bool | None = False  # null is the default, as many clients send it
    stream_options: StreamOptions | None = None
    # what specdec cannot honour exactly: refused where set to anything but the default (refused())
    n: int | None = None
    best_of: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    logit_bias: dict | None = None
    logprobs: bool | int | None = None  # chat: a bool; completions: how many (an int)
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None

    def refused(self) -> str | None:
        """The first field set to what specdec cannot honour exactly, or None."""
        for name, honoured in (("n", self.n in (None, 1)), ("best_of", self.best_of in (None, 1)),
                               ("presence_penalty", not self.presence_penalty),
                               ("frequency_penalty", not self.frequency_penalty),
                               ("repetition_penalty", self.repetition_penalty in (None, 1)),
                               ("min_p", not self.min_p), ("logit_bias", not self.logit_bias),
                               ("logprobs", not self.logprobs), ("top_logprobs", not self.top_logprobs)):
            if not honoured:
                return name
        return None


    @field_validator("temperature")
    @classmethod
    def _vanishing_is_greedy(cls, value):
        """A temperature too small to divide by (below GREEDY_BELOW) is greedy, its limit."""
        return 0.0 if value is not None and value < GREEDY_BELOW else value

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop texts")
        if any(not stop for stop in stops):
            raise ValueError("a stop text must not be empty")
        return stops

    def stops(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.stop or ()))

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list | None = None

    def refused(self) -> str | None:
        return "tools" if self.tools else super().refused()

    def length(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(Sampling):
    prompt: Union[StrictStr, list[StrictStr], list[int]]
    echo: bool | None = False
    suffix: StrictStr | None = None

    def refused(self) -> str | None:
        return "echo" if self.echo else "suffix" if self.suffix else super().refused()

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list) and value and isinstance(value[0], str):
            if len(value) != 1:
                raise ValueError("one prompt a request (n = 1); send each prompt as its own request")
            return value[0]
        if isinstance(value, list) and not value:
            raise ValueError("the prompt has no tokens")
        return value

    def length(self) -> int | None:
        return self.max_tokens


def parse(model: type[Sampling], body: bytes) -> Sampling:
    """The request in `body`, or an ApiError (400) that says what is wrong and where."""
    try:
        request = model.model_validate_json(body)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        if error["type"] == "json_invalid":
            raise ApiError(400, f"the body is not valid JSON: {error['msg'].removeprefix('Invalid JSON: ')}") from None
        where = ".".join(str(part) for part in error["loc"])
        param = str(error["loc"][0]) if error["loc"] else None
        if param == "response_format" and error["type"] == "literal_error":
            raise ApiError(400, f"{param}: {UNSUPPORTED[param]}", param=param, code="unsupported_parameter") from None
        message = error["msg"].removeprefix("Value error, ")
        raise ApiError(400, f"{where}: {message}" if where else f"the body: {message}", param=param) from None
    refused = request.refused()
    if refused is not None:
        raise ApiError(400, f"{refused}: {UNSUPPORTED[refused]}", param=refused, code="unsupported_parameter")
    return request


UNSUPPORTED = {
    "n": "specdec serve gives one choice a request; send the request n times (each with its own seed)",
    "best_of": "specdec serve gives one choice a request; send the request several times",
    "repetition_penalty": "penalties change the model's distribution, which specdec keeps exact; leave it 1",
    "min_p": "min_p is not supported; use top_p or top_k",
    "logit_bias": "logit_bias changes the model's distribution, which specdec keeps exact; leave it out",
    "top_logprobs": "log-probabilities are not returned yet",
    "presence_penalty": "penalties change the model's distribution, which specdec keeps exact; leave it 0",
    "frequency_penalty": "penalties change the model's distribution, which specdec keeps exact; leave it 0",
    "logprobs": "log-probabilities are not returned yet",
    "tools": "tool calls are not supported yet",
    "response_format": "give type text, json_object or json_schema (with json_schema: {\"name\", \"schema\"})",
    "echo": "echo is not supported",
    "suffix": "suffix (insertion) is not supported",
}
