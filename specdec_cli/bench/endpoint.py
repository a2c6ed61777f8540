"""`specdec bench --endpoint URL`: a running OpenAI-compatible server's speed and speculation.

The same prompts go through `/v1/chat/completions` (or `/v1/completions`), streamed, one request at
a time unless `--concurrency N`. Per request: TTFT (until the first content chunk) and the decode
rate after it, (completion tokens - 1) / (last chunk - first chunk), the same split as a local bench.
With `--baseline-endpoint` (the same model served without speculation) each prompt's rate is paired
with the baseline's: speedup = median over prompts of endpoint rate / baseline rate.

Speculation comes from the server's own counters, in this order of preference:
- Prometheus `/metrics` (vLLM, and llama.cpp with `--metrics`, which adopted vLLM's schema):
  `<prefix>:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens`,
  `..._num_accepted_tokens_per_pos{position}`, read before and after (after every request at
  concurrency 1, so each prompt has its own difference) and subtracted;
- per response: llama.cpp's `timings.draft_n` / `timings.draft_n_accepted` (on the last streamed chunk;
  llama-server leaves both out when a request drafted nothing, so `timings` without them counts 0),
  or vLLM's `speculative_decoding_stats` (on the terminal chunk's choice, when the server runs with
  `--per-request-spec-decode-stats`);
- SGLang's `meta_info.spec_verify_ct` (verify passes): SGLang refuses `return_meta_info` on a
  streamed request, so after each timed request an untimed non-streaming copy of it asks for it.
A server with none of these still gets its speed measured; acceptance is then reported unknown.

Derived as for a local run: acceptance = accepted drafts / drafted tokens; tau (mean accepted length)
= tokens per target forward = completion tokens / (completion tokens - accepted drafts), every
forward emitting one token of the target's own (SGLang: completion tokens / spec_verify_ct);
per-position acceptance i = drafts whose token i was kept / drafts.

HTTP is httpx; the Prometheus text is parsed by prometheus_client's parser.
"""

from __future__ import annotations

import json
import queue
import re
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ..errors import SpecdecError, UsageError
from ..specs import SamplingSpec
from .paired import PairedRatios, pair_runs, speedup_fields
from .workload import BenchPrompt

DEFAULT_TIMEOUT = 60.0
DEFAULT_CONCURRENCY = 1
MAX_CONCURRENCY = 256
APIS = ("chat", "completions")
ENDPOINT_NAME, BASELINE_NAME = "endpoint", "baseline"
ENGINE_PREFIXES = {"vllm": "vllm", "llamacpp": "llama.cpp", "sglang": "sglang"}
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


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


# --------------------------------------------------------------------------- /metrics


@dataclass
class SpecCounters:
    """Cumulative speculation counters of one server (summed over its engines and models)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: dict[int, float] = field(default_factory=dict)

    def minus(self, earlier: "SpecCounters") -> "SpecCounters":
        positions = set(self.per_position) | set(earlier.per_position)
        return SpecCounters(
            self.drafts - earlier.drafts,
            self.draft_tokens - earlier.draft_tokens,
            self.accepted - earlier.accepted,
            {p: self.per_position.get(p, 0.0) - earlier.per_position.get(p, 0.0) for p in sorted(positions)},
        )

    def plus(self, other: "SpecCounters") -> "SpecCounters":
        positions = set(self.per_position) | set(other.per_position)
        return SpecCounters(
            self.drafts + other.drafts,
            self.draft_tokens + other.draft_tokens,
            self.accepted + other.accepted,
            {p: self.per_position.get(p, 0.0) + other.per_position.get(p, 0.0) for p in sorted(positions)},
        )

    def to_dict(self) -> dict[str, Any]:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted,
                "accepted_per_position": [self.per_position[p] for p in sorted(self.per_position)]}


@dataclass(frozen=True)
class MetricsReading:
    engine: str | None  # from the metric names' prefix
    counters: SpecCounters | None  # None: the server exposes no speculation counters


SPEC_NAME = re.compile(r"^(?P<prefix>[a-zA-Z_][a-zA-Z0-9_]*):spec_decode_(?P<what>num_drafts|num_draft_tokens|"
                       r"num_accepted_tokens|num_accepted_tokens_per_pos)(?:_total)?$")


def parse_metrics(text: str) -> MetricsReading:
    """The speculation counters in a Prometheus text exposition (raises ValueError if it is none).

    Samples are matched by name, with or without the `_total` suffix (vLLM's counters expose
    `_total` samples and `_created` timestamps, which are skipped), whatever the family grouping."""
    engine, found = None, False
    counters = SpecCounters()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if engine is None and ":" in sample.name:
                engine = ENGINE_PREFIXES.get(sample.name.split(":", 1)[0])
            match = SPEC_NAME.match(sample.name)
            if not match or sample.name.endswith("_created"):
                continue
            found = True
            what, value = match.group("what"), float(sample.value)
            if what == "num_accepted_tokens_per_pos":
                try:
                    position = int(sample.labels.get("position", ""))
                except ValueError:
                    continue
                counters.per_position[position] = counters.per_position.get(position, 0.0) + value
            elif what == "num_drafts":
                counters.drafts += value
            elif what == "num_draft_tokens":
                counters.draft_tokens += value
            else:
                counters.accepted += value
    return MetricsReading(engine, counters if found else None)


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
        limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
        self.timeout = timeout
        self.http = httpx.Client(timeout=httpx.Timeout(timeout), limits=limits, follow_redirects=True,
                                 headers={"User-Agent": "specdec-bench"})

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


@dataclass
class RunResult:
    """One prompt through one server: its timings and whatever speculation counts the server gave."""

    target: str  # endpoint or baseline
    prompt: BenchPrompt
    repeat: int
    text: str
    completion_tokens: int
    tokens_from: str  # usage, timings or chunks
    ttft_seconds: float
    total_seconds: float
    first_at: float
    last_at: float
    finish_reason: str | None = None
    drafted: int | None = None  # per-response counts: llama.cpp timings, vLLM speculative_decoding_stats
    accepted: int | None = None
    drafted_from: str | None = None
    verify_steps: int | None = None  # SGLang meta_info
    sglang_accepted: int | None = None
    sglang_drafted: int | None = None
    counters: SpecCounters | None = None  # /metrics difference over this request (concurrency 1)

    @property
    def decode_tokens(self) -> int:
        return self.completion_tokens - 1

    @property
    def decode_seconds(self) -> float:
        return self.last_at - self.first_at

    @property
    def tokens_per_second(self) -> float | None:
        seconds = self.decode_seconds
        return self.decode_tokens / seconds if self.decode_tokens > 0 and seconds > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target, "prompt": self.prompt.id, "category": self.prompt.category, "repeat": self.repeat,
            "completion_tokens": self.completion_tokens, "tokens_from": self.tokens_from,
            "ttft_seconds": self.ttft_seconds, "total_seconds": self.total_seconds,
            "tokens_per_second": self.tokens_per_second, "finish_reason": self.finish_reason,
            "drafted": self.drafted, "accepted": self.accepted, "drafted_from": self.drafted_from,
            "verify_steps": self.verify_steps,
            "counters": self.counters.to_dict() if self.counters else None,
        }


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
    usage = timings = meta = stats = None
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
    if isinstance(timings, dict) and isinstance(timings.get("draft_n"), int):
        measured.update(drafted=timings["draft_n"], accepted=int(timings.get("draft_n_accepted") or 0),
                        drafted_from="llama.cpp timings")
    elif isinstance(timings, dict) and isinstance(timings.get("predicted_n"), int) and timings.get("draft_n") is None:
        # llama-server writes draft_n / draft_n_accepted only for a request that drafted at least one token
        # (server_slot_stats::to_json): a llama.cpp response without them drafted nothing
        measured.update(drafted=0, accepted=0, drafted_from="llama.cpp timings")
    elif isinstance(stats, dict) and isinstance(stats.get("num_draft_tokens"), int):
        measured.update(drafted=stats["num_draft_tokens"], accepted=int(stats.get("num_accepted_draft_tokens") or 0),
                        drafted_from="vllm speculative_decoding_stats")
    if isinstance(meta, dict):
        measured.update(sglang_counts(meta))
    return measured


def sglang_counts(meta: dict[str, Any]) -> dict[str, Any]:
    counts: dict[str, Any] = {}
    if isinstance(meta.get("spec_verify_ct"), (int, float)):
        counts["verify_steps"] = int(meta["spec_verify_ct"])
    if isinstance(meta.get("spec_accept_token_num"), (int, float)) and isinstance(meta.get("spec_draft_token_num"), (int, float)):
        counts["sglang_accepted"] = int(meta["spec_accept_token_num"])
        counts["sglang_drafted"] = int(meta["spec_draft_token_num"])
    return counts


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


# --------------------------------------------------------------------------- the run


@dataclass
class EndpointBench:
    client: Client
    endpoint: Server
    baseline: Server | None
    prompts: list[BenchPrompt]
    settings: EndpointSettings
    notes: list[str] = field(default_factory=list)
    results: list[RunResult] = field(default_factory=list)
    run_counters: SpecCounters | None = None  # whole-run /metrics difference (concurrency > 1)
    _last_reading: SpecCounters | None = None

    @property
    def servers(self) -> list[Server]:
        return [self.endpoint] + ([self.baseline] if self.baseline else [])

    @property
    def total_runs(self) -> int:
        return len(self.prompts) * self.settings.repeats * len(self.servers)

    def run(self, on_progress: Callable[[str], None] | None = None) -> None:
        s = self.settings
        for _ in range(s.warmup):  # untimed: connections, caches, CUDA graphs; not recorded
            for server in self.servers:
                stream_once(self.client, server, self.prompts[0].text, s, min(16, s.max_new_tokens))
        if self.endpoint.metrics:
            self._last_reading = self.client.read_metrics(self.endpoint.url).counters
        start_counters = self._last_reading
        interrupted = False
        try:
            if s.concurrency == 1:
                for prompt in self.prompts:
                    for repeat in range(s.repeats):
                        for server in self.servers:  # interleaved per prompt, never two servers at once
                            self.results.append(self.run_one(server, prompt, repeat))
                            if on_progress:
                                on_progress(f"{prompt.id} · {server.role}")
            else:
                for server in self.servers:  # one server at a time, N requests in flight
                    for repeat in range(s.repeats):
                        self.run_concurrently(server, repeat, on_progress)
        except KeyboardInterrupt:
            interrupted = True  # no more requests, not even to /metrics: Ctrl-C means now
            raise
        finally:
            if not interrupted and s.concurrency > 1 and self.endpoint.metrics and start_counters is not None:
                after = self.client.read_metrics(self.endpoint.url).counters
                if after is not None:
                    self.run_counters = after.minus(start_counters)

    def run_one(self, server: Server, prompt: BenchPrompt, repeat: int) -> RunResult:
        s = self.settings
        measured = stream_once(self.client, server, prompt.text, s, s.max_new_tokens)
        if server.engine == "sglang" and server is self.endpoint and "verify_steps" not in measured:
            measured.update(sglang_meta(self.client, server, prompt.text, s, s.max_new_tokens))
        result = RunResult(server.role, prompt, repeat, **measured)
        if server is self.endpoint and server.metrics and s.concurrency == 1:
            now = self.client.read_metrics(server.url).counters
            if now is not None and self._last_reading is not None:
                result.counters = now.minus(self._last_reading)
            self._last_reading = now
        return result

    def run_concurrently(self, server: Server, repeat: int, on_progress: Callable[[str], None] | None) -> None:
        """Every prompt through one server, `concurrency` requests at a time, on daemon threads (so
        that Ctrl-C is never held up by a request still streaming); the first failure stops the rest."""
        jobs: queue.Queue = queue.Queue()
        for prompt in self.prompts:
            jobs.put(prompt)
        done: queue.Queue = queue.Queue()
        stop = threading.Event()

        def work() -> None:
            while not stop.is_set():
                try:
                    prompt = jobs.get_nowait()
                except queue.Empty:
                    return
                try:
                    done.put(("ok", self.run_one(server, prompt, repeat)))
                except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                    done.put(("error", exc))
                    return

        threads = [threading.Thread(target=work, daemon=True, name=f"specdec-endpoint-{i}")
                   for i in range(min(self.settings.concurrency, len(self.prompts)))]
        for thread in threads:
            thread.start()
        try:
            remaining = len(self.prompts)
            while remaining:
                try:
                    status, value = done.get(timeout=0.1)
                except queue.Empty:
                    if not any(t.is_alive() for t in threads) and done.empty():
                        break
                    continue
                if status == "error":
                    raise value
                remaining -= 1
                self.results.append(value)
                if on_progress:
                    on_progress(f"{value.prompt.id} · {server.role}")
        finally:
            stop.set()

    # --- aggregation
    def complete_prompts(self) -> list[BenchPrompt]:
        """Prompts that every server finished every repeat of (all of them, unless interrupted)."""
        done: dict[str, int] = {}
        for r in self.results:
            done[r.prompt.id] = done.get(r.prompt.id, 0) + 1
        need = self.settings.repeats * len(self.servers)
        return [p for p in self.prompts if done.get(p.id, 0) == need]

    def runs(self, target: str, prompts: Sequence[BenchPrompt]) -> list[RunResult]:
        ids = {p.id for p in prompts}
        return [r for r in self.results if r.target == target and r.prompt.id in ids]

    def prompt_rate(self, target: str, prompt: BenchPrompt) -> float | None:
        rates = [r.tokens_per_second for r in self.runs(target, [prompt]) if r.tokens_per_second]
        return statistics.median(rates) if rates else None

    def paired(self, target: str, prompts: Sequence[BenchPrompt]) -> PairedRatios:
        """Each run against the baseline's run of the same prompt and repeat (none without a baseline)."""
        if self.baseline is None:
            return PairedRatios()
        return pair_runs(self.runs(target, prompts), self.runs(BASELINE_NAME, prompts))

    def speculation(self, prompts: Sequence[BenchPrompt], whole_run: bool) -> dict[str, Any]:
        """Drafted / accepted counts over these prompts' endpoint runs, from the best source there is."""
        runs = self.runs(ENDPOINT_NAME, prompts)
        tokens = sum(r.completion_tokens for r in runs)
        engine = self.endpoint.engine
        result: dict[str, Any] = {"source": None, "acceptance_rate": None, "mean_accepted_length": None,
                                  "target_forwards": None, "per_position_acceptance": None, "counters": None}
        counters = None
        if runs and all(r.counters is not None for r in runs):
            counters = SpecCounters()
            for r in runs:
                counters = counters.plus(r.counters)
        elif whole_run and self.run_counters is not None:
            counters = self.run_counters
        if counters is not None:
            result["source"] = f"{engine} /metrics" if engine != "unknown" else "/metrics"
            result["counters"] = counters.to_dict()
            result["acceptance_rate"] = counters.accepted / counters.draft_tokens if counters.draft_tokens else None
            if counters.drafts:
                result["per_position_acceptance"] = [counters.per_position[p] / counters.drafts
                                                     for p in sorted(counters.per_position)]
            accepted = counters.accepted
        elif runs and all(r.drafted is not None for r in runs):
            drafted, accepted = sum(r.drafted for r in runs), sum(r.accepted for r in runs)
            result["source"] = " + ".join(sorted({r.drafted_from for r in runs if r.drafted_from}))
            result["counters"] = {"draft_tokens": drafted, "accepted_tokens": accepted}
            result["acceptance_rate"] = accepted / drafted if drafted else None
        elif runs and all(r.verify_steps is not None for r in runs):
            steps = sum(r.verify_steps for r in runs)
            result["source"] = "sglang meta_info"
            result["counters"] = {"verify_steps": steps}
            if all(r.sglang_drafted is not None for r in runs):
                drafted, accepted = sum(r.sglang_drafted for r in runs), sum(r.sglang_accepted for r in runs)
                result["counters"] |= {"draft_tokens": drafted, "accepted_tokens": accepted}
                result["acceptance_rate"] = accepted / drafted if drafted else None
            if steps:
                result["mean_accepted_length"] = tokens / steps
                result["target_forwards"] = steps / len(runs)
            return result
        else:
            return result
        forwards = tokens - accepted
        if forwards > 0:
            result["mean_accepted_length"] = tokens / forwards
            result["target_forwards"] = forwards / len(runs)
        return result

    def target_summary(self, target: str, prompts: Sequence[BenchPrompt], whole_run: bool) -> dict[str, Any]:
        rates = [rate for prompt in prompts if (rate := self.prompt_rate(target, prompt))]
        runs = self.runs(target, prompts)
        row: dict[str, Any] = {
            "method": target,
            "tokens_per_second": statistics.median(rates) if rates else None,
            **speedup_fields(self.paired(target, prompts), None),
            "acceptance_rate": None,
            "mean_accepted_length": None,
            "target_forwards": None,
            "ttft_seconds": statistics.median([r.ttft_seconds for r in runs]) if runs else None,
            "new_tokens": statistics.mean([r.completion_tokens for r in runs]) if runs else None,
            "prompts": len(prompts),
        }
        if target == ENDPOINT_NAME:
            spec = self.speculation(prompts, whole_run)
            row.update(acceptance_rate=spec["acceptance_rate"], mean_accepted_length=spec["mean_accepted_length"],
                       target_forwards=spec["target_forwards"])
            row["per_position_acceptance"] = spec["per_position_acceptance"]
            row["speculation_source"] = spec["source"]
            row["speculation_counters"] = spec["counters"]
            # the same model served without speculation: its tau bounds the speedup as it does locally
            row.update(speedup_fields(self.paired(target, prompts), spec["mean_accepted_length"]))
        return row

    def differences(self, prompts: Sequence[BenchPrompt]) -> list[dict[str, Any]]:
        """At temperature 0 with a baseline: prompts whose text differs from the baseline's."""
        found = []
        for prompt in prompts:
            reference = next((r for r in self.runs(BASELINE_NAME, [prompt])), None)
            if reference is None:
                continue
            for r in self.runs(ENDPOINT_NAME, [prompt]):
                if r.text != reference.text:
                    position = next((i for i, (a, b) in enumerate(zip(r.text, reference.text)) if a != b),
                                    min(len(r.text), len(reference.text)))
                    found.append({"prompt": prompt.id, "category": prompt.category, "repeat": r.repeat,
                                  "character": position})
                    break
        return found

    def summary(self, profile_name: str | None) -> dict[str, Any]:
        """The report. profile_name: the profile whose sampling settings the requests carried, or None
        when they are the defaults (greedy, no top-k/top-p): a server's model and speculation are its own."""
        prompts = self.complete_prompts()
        targets = ([BASELINE_NAME] if self.baseline else []) + [ENDPOINT_NAME]
        results = [self.target_summary(t, prompts, whole_run=True) for t in targets]
        categories = sorted({p.category for p in prompts if p.category})
        if categories:
            for row in results:
                row["per_category"] = {
                    c: self.target_summary(row["method"], [p for p in prompts if p.category == c], whole_run=False)
                    for c in categories
                }
        endpoint_row = results[-1]
        notes = list(self.notes)
        if endpoint_row["speculation_source"] is None:
            notes.append(f"acceptance unknown: {self.endpoint.url} gave no speculation counters (no spec_decode_* "
                         "in /metrics, no timings.draft_n, no speculative_decoding_stats, no meta_info.spec_verify_ct); "
                         "speed only")
        elif endpoint_row["speculation_source"].endswith("/metrics"):
            notes.append("the /metrics counters include any other traffic the server had during the run")
        counted = endpoint_row.get("speculation_counters") or {}
        if counted.get("draft_tokens") == 0:
            note = f"{self.endpoint.url} drafted no tokens during the run: is speculation on for this model?"
            if endpoint_row["speculation_source"] == "llama.cpp timings":
                note += (" (llama.cpp writes timings.draft_n only for a request that drafted; builds older than "
                         "its PR #12603, 2025, never write it)")
            notes.append(note)
        if any(r.tokens_from == "chunks" for r in self.results):
            notes.append("some responses carried no usage: their token counts are streamed chunks, which "
                         "undercounts when a chunk carries several tokens")
        greedy = self.settings.sampling.greedy
        differences = self.differences(prompts) if greedy and self.baseline else []
        s = self.settings
        return {
            "profile": profile_name,
            "endpoint": self.endpoint.describe(),
            "baseline_endpoint": self.baseline.describe() if self.baseline else None,
            "settings": {
                "prompts": len(prompts),
                "prompts_planned": len(self.prompts),
                "max_new_tokens": s.max_new_tokens,
                "repeats": s.repeats,
                "warmup": s.warmup,
                "temperature": s.sampling.temperature,
                "top_k": s.sampling.top_k,
                "top_p": s.sampling.top_p,
                "seed": s.seed,
                "api": s.api,
                "concurrency": s.concurrency,
                "timeout_seconds": s.timeout,
            },
            "outputs_identical": (not differences) if greedy and self.baseline else None,
            "differences": differences,
            "notes": notes,
            "results": results,
            "runs": [r.to_dict() for r in self.results if r.prompt in prompts],
        }
