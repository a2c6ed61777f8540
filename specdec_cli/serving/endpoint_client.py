"""An OpenAI-compatible server as the endpoint bench talks to it: the request settings, an httpx
client whose every failure is one line naming the server, the probe (what it serves, which counters
it offers) and one streamed, timed request.

The engines' own speculation fields are read by wire.py.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from ..errors import SpecdecError, UsageError
from ..specs import SamplingSpec
from .wire import ENGINE_PREFIXES, MetricsReading, parse_metrics, response_counts, sglang_counts

DEFAULT_TIMEOUT = 60.0
DEFAULT_CONCURRENCY = 1
MAX_CONCURRENCY = 256
APIS = ("chat", "completions")


class EndpointError(SpecdecError):
    """A server that cannot be reached or answers wrongly: one line, exit 1."""


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class EndpointSettings:
    max_new_tokens: int = 128
    repeats: int = 1
    warmup: int = 0
    sampling: SamplingSpec = SamplingSpec()
    seed: int = 0
    api: str = "chat"
    concurrency: int = DEFAULT_CONCURRENCY
    timeout: float = DEFAULT_TIMEOUT


def normalize_url(value: str, option: str) -> str:
    """The server's base URL (scheme://host:port[/prefix]) without a trailing /v1."""
    text = value.strip()
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{option}: '{value}' is not an http(s) URL (e.g. http://127.0.0.1:8080)")
    try:
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        raise UsageError(f"{option}: '{value}' has an invalid port") from None
    path = parts.path.rstrip("/")
    path = path[: -len("/v1")] if path.endswith("/v1") else path
    return f"{parts.scheme}://{parts.netloc}{path}"


def check_settings(api: str | None, concurrency: int | None, timeout: float | None) -> tuple[str, int, float]:
    api = (api or "chat").strip().lower()
    if api not in APIS:
        raise UsageError(f"--api: '{api}' is not one of {', '.join(APIS)}")
    concurrency = DEFAULT_CONCURRENCY if concurrency is None else concurrency
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise UsageError(f"--concurrency: {concurrency} must be between 1 and {MAX_CONCURRENCY}")
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    if not (timeout > 0) or timeout == float("inf"):
        raise UsageError(f"--timeout: {timeout} must be a positive number of seconds")
    return api, concurrency, float(timeout)


# --------------------------------------------------------------------------- errors as one line


def one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def server_message(response: httpx.Response) -> str:
    """The server's own error message: OpenAI's {"error": {"message"}}, vLLM's older {"message"},
    FastAPI's {"detail"}, or the start of the body."""
    try:
        body = response.json()
    except (ValueError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return one_line(error["message"])
        if isinstance(error, str) and error:
            return one_line(error)
        for key in ("message", "detail"):
            if body.get(key):
                return one_line(body[key] if isinstance(body[key], str) else json.dumps(body[key]))
    text = response.text.strip()
    if "<html" in text[:200].lower():
        title = re.search(r"<title>(.*?)</title>", text, re.I | re.S)
        return one_line(title.group(1)) if title else "an HTML page"
    return one_line(text) or "(empty body)"


def describe_transport_error(exc: httpx.HTTPError, base: str, what: str, timeout: float) -> str:
    if isinstance(exc, httpx.ConnectError):
        reason = str(exc)
        if "refused" in reason.lower():
            return f"cannot connect to {base}: connection refused (is the server running, on this port?)"
        return f"cannot connect to {base}: {one_line(reason) or type(exc).__name__}"
    if isinstance(exc, httpx.TimeoutException):
        return f"{base} did not answer {what} within {timeout:g} s (raise --timeout for a slow server)"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"{base} broke the connection during {what} ({one_line(str(exc)) or 'protocol error'})"
    return f"{what} to {base} failed: {one_line(str(exc)) or type(exc).__name__}"


# --------------------------------------------------------------------------- one server


@dataclass
class Server:
    """A probed server: where it is, what it serves, and which counters it offers."""

    role: str  # endpoint or baseline
    url: str
    model: str
    engine: str  # vllm, llama.cpp, sglang or unknown
    metrics: bool  # /metrics exposes speculation counters
    served: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {"url": self.url, "model": self.model, "engine": self.engine, "speculation_metrics": self.metrics}


class Client:
    """httpx with every failure turned into one line naming the server."""

    def __init__(self, timeout: float, concurrency: int = 1):
        """$OPENAI_API_KEY, where set, goes with every request as its bearer key (as OpenAI's own
        clients send it): a server started with an API key (specdec serve --api-key) lets it in."""
        limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
        self.timeout = timeout
        headers = {"User-Agent": "specdec-bench"}
        if os.environ.get("OPENAI_API_KEY"):
            headers["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"
        self.http = httpx.Client(timeout=httpx.Timeout(timeout), limits=limits, follow_redirects=True, headers=headers)

    def close(self) -> None:
        self.http.close()

    def get(self, base: str, path: str) -> httpx.Response:
        try:
            return self.http.get(base + path)
        except httpx.HTTPError as exc:
            raise EndpointError(describe_transport_error(exc, base, f"GET {path}", self.timeout)) from None

    def post(self, base: str, path: str, body: dict[str, Any]) -> httpx.Response:
        try:
            return self.http.post(base + path, json=body)
        except httpx.HTTPError as exc:
            raise EndpointError(describe_transport_error(exc, base, f"POST {path}", self.timeout)) from None

    def read_metrics(self, base: str) -> MetricsReading:
        """The counters now; no counters (not an error) when /metrics is missing or not Prometheus text."""
        try:
            response = self.http.get(base + "/metrics")
        except httpx.HTTPError:
            return MetricsReading(None, None)
        if response.status_code != 200:
            return MetricsReading(None, None)
        try:
            return parse_metrics(response.text)
        except (ValueError, TypeError, IndexError):
            return MetricsReading(None, None)


def probe(client: Client, role: str, base: str, model: str | None) -> tuple[Server, list[str]]:
    """GET /v1/models (is it an OpenAI-compatible server, and what does it serve?) and /metrics.
    Returns the server and notes for the report."""
    response = client.get(base, "/v1/models")
    kind = response.headers.get("content-type", "").split(";")[0].strip() or "no content type"
    if response.status_code == 404:
        raise EndpointError(f"{base} is not an OpenAI-compatible server: GET /v1/models answered HTTP 404 ({kind})")
    if response.status_code >= 400:
        raise EndpointError(f"{base}: HTTP {response.status_code} from GET /v1/models: {server_message(response)}")
    try:
        listing = response.json()
        entries = [m for m in listing["data"] if isinstance(m, dict)]
    except (ValueError, KeyError, TypeError):
        raise EndpointError(f"{base} is not an OpenAI-compatible server: GET /v1/models answered {kind}, "
                            "not a model list") from None
    served = [str(m["id"]) for m in entries if m.get("id") is not None]
    owners = {str(m.get("owned_by", "")).lower() for m in entries}
    notes = []
    if model is None:
        if len(served) != 1:
            listed = ", ".join(served) or "none"
            raise UsageError(f"{base} serves {len(served)} models ({listed}): name one with --model")
        model = served[0]
    elif served and model not in served:
        notes.append(f"{role}: --model '{model}' is not in {base}'s model list ({', '.join(served)}); sent anyway")
    reading = client.read_metrics(base)
    engine = next((ENGINE_PREFIXES[o] for o in owners if o in ENGINE_PREFIXES), None) or reading.engine or "unknown"
    return Server(role, base, model, engine, reading.counters is not None, served), notes


# --------------------------------------------------------------------------- one request


def request_body(server: Server, text: str, settings: EndpointSettings, max_tokens: int, stream: bool) -> dict[str, Any]:
    s = settings.sampling
    body: dict[str, Any] = {"model": server.model, "max_tokens": max_tokens, "temperature": s.temperature,
                            "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if settings.api == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    if s.top_k:
        body["top_k"] = s.top_k
    if s.top_p < 1.0:
        body["top_p"] = s.top_p
    if not s.greedy:
        body["seed"] = settings.seed
    return body


def api_path(settings: EndpointSettings) -> str:
    return "/v1/chat/completions" if settings.api == "chat" else "/v1/completions"


def chunk_text(choice: dict[str, Any], api: str) -> str:
    if api == "chat":
        delta = choice.get("delta") or {}
        parts = [delta.get(key) for key in ("content", "reasoning_content", "reasoning")]
        return "".join(p for p in parts if isinstance(p, str))
    text = choice.get("text")
    return text if isinstance(text, str) else ""


def stream_once(client: Client, server: Server, text: str, settings: EndpointSettings,
                max_tokens: int) -> dict[str, Any]:
    """Send one streamed request and time it; the RunResult fields other than target/prompt/repeat."""
    path = api_path(settings)
    body = request_body(server, text, settings, max_tokens, stream=True)
    what = f"POST {path}"
    started = time.perf_counter()
    first_at = last_at = None
    pieces: list[str] = []
    chunks = 0
    usage = timings = meta = stats = speculation = None
    finish = None
    try:
        with client.http.stream("POST", server.url + path, json=body) as response:
            if response.status_code >= 400:
                response.read()
                if response.status_code == 404 and "json" not in response.headers.get("content-type", ""):
                    raise EndpointError(f"{server.url} is not an OpenAI-compatible server: {what} answered HTTP 404")
                raise EndpointError(f"{server.url}: HTTP {response.status_code} from {what}: {server_message(response)}")
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue  # SSE comments (keep-alive pings), event names, blank separators
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                try:
                    event = json.loads(payload)
                except ValueError:
                    raise EndpointError(f"{server.url} is not an OpenAI-compatible server: {what} streamed a "
                                        f"line that is not JSON ({one_line(payload, 80)})") from None
                if not isinstance(event, dict):
                    continue
                if event.get("error"):
                    error = event["error"]
                    message = error.get("message") if isinstance(error, dict) else error
                    raise EndpointError(f"{server.url}: error in the {what} stream: {one_line(str(message))}")
                now = time.perf_counter()
                for choice in event.get("choices") or []:
                    if not isinstance(choice, dict):
                        continue
                    piece = chunk_text(choice, settings.api)
                    if piece:
                        pieces.append(piece)
                        chunks += 1
                        first_at = now if first_at is None else first_at
                        last_at = now
                    finish = choice.get("finish_reason") or finish
                    meta = choice.get("meta_info") or meta
                    stats = choice.get("speculative_decoding_stats") or stats
                usage = event.get("usage") or usage
                timings = event.get("timings") or timings
                meta = event.get("meta_info") or meta
                speculation = event.get("speculation") or speculation
    except httpx.HTTPError as exc:
        raise EndpointError(describe_transport_error(exc, server.url, what, settings.timeout)) from None
    ended = time.perf_counter()
    if first_at is None:
        raise EndpointError(f"{server.url}: {what} streamed no text for prompt (finish reason {finish or 'none'}); "
                            "is --api right for this server?")
    tokens, source = chunks, "chunks"
    if isinstance(timings, dict) and isinstance(timings.get("predicted_n"), int):
        tokens, source = timings["predicted_n"], "timings"
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        tokens, source = usage["completion_tokens"], "usage"
    measured: dict[str, Any] = {
        "text": "".join(pieces), "completion_tokens": tokens, "tokens_from": source,
        "ttft_seconds": first_at - started, "total_seconds": ended - started,
        "first_at": first_at, "last_at": last_at, "finish_reason": finish,
    }
    measured.update(response_counts(timings, stats, meta, speculation))
    return measured


def sglang_meta(client: Client, server: Server, text: str, settings: EndpointSettings, max_tokens: int) -> dict[str, Any]:
    """SGLang's per-request speculation counts, from an untimed non-streaming copy of the request
    (SGLang answers `return_meta_info` only when not streaming)."""
    path = api_path(settings)
    body = request_body(server, text, settings, max_tokens, stream=False) | {"return_meta_info": True}
    response = client.post(server.url, path, body)
    if response.status_code >= 400:
        raise EndpointError(f"{server.url}: HTTP {response.status_code} from POST {path} (return_meta_info): "
                            f"{server_message(response)}")
    try:
        choice = response.json()["choices"][0]
        meta = choice.get("meta_info") or {}
    except (ValueError, KeyError, IndexError, TypeError):
        return {}
    return sglang_counts(meta) if isinstance(meta, dict) else {}
