"""`specdec bench --endpoint`: against local HTTP servers (127.0.0.1, port 0, a thread each) that
answer in each engine's documented formats: OpenAI SSE chunks for chat and completions, vLLM's
Prometheus /metrics (written by prometheus_client, as vLLM's is), llama.cpp's /metrics and per-response
`timings`, SGLang's `meta_info`; and broken ones: a closed port, an HTML 404, an HTTP 500 with a
message, a server slower than --timeout, a server with no speculation counters.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from cli_helpers import assert_one_line_error, run_cli
from specdec_cli.bench import endpoint as endpoint_module
from specdec_cli.serving.endpoint_client import normalize_url
from specdec_cli.serving.wire import SpecCounters, parse_metrics

MODEL = "Qwen/Qwen2.5-Coder-1.5B-Instruct"
PIECES = ["def", " add", "(a", ",", " b", "):", "\n", "   ", " return", " a", " +", " b", "\n", "\n", "print", "(add"]
TOKENS = len(PIECES)  # one token per piece; usage reports it
# per request, as a k=3 drafter with 9 of 12 drafted tokens kept over 4 drafts would count
DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POS = 4, 12, 9, (4, 3, 2)


class FakeServer:
    """One engine's HTTP surface. kind: vllm | vllm-plain | llamacpp | llamacpp-nometrics | sglang |
    html | error500 | slow."""

    def __init__(self, kind: str, delay: float = 0.002, fail_on: str | None = None, no_draft_on: str = "\0"):
        # no_draft_on: llama.cpp requests whose prompt contains it drafted nothing (no draft_n in timings)
        self.kind, self.delay, self.fail_on, self.no_draft_on = kind, delay, fail_on, no_draft_on
        self.requests: list[tuple[str, str, dict | None]] = []
        self.served = 0  # completed generation requests (the counters grow by one request's worth each)
        self.lock = threading.Lock()
        self.released = threading.Event()  # a slow server answers once set: by the test, or at close
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()  # each event leaves at once, as a real server's does (no Nagle batching)
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_GET(self):
                owner.requests.append(("GET", self.path, None))
                owner.handle_get(self)

            def do_POST(self):
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                owner.requests.append(("POST", self.path, body))
                owner.handle_post(self, body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        # a client that gave up (--timeout, Ctrl-C) leaves a broken pipe: not worth a traceback on stderr
        self.httpd.handle_error = lambda request, client_address: None
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    # --- responses
    @staticmethod
    def send(handler, status: int, body: bytes, content_type: str) -> None:
        handler.send_response(status)
        handler.send_header("content-type", content_type)
        handler.send_header("content-length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def send_json(self, handler, status: int, obj) -> None:
        self.send(handler, status, json.dumps(obj).encode(), "application/json")

    def html_404(self, handler) -> None:
        page = b"<html><head><title>404 Not Found</title></head><body><h1>Not Found</h1></body></html>"
        self.send(handler, 404, page, "text/html; charset=utf-8")

    def handle_get(self, handler) -> None:
        if self.kind == "html":
            return self.html_404(handler)
        if handler.path == "/v1/models":
            owner = {"llamacpp": "llamacpp", "llamacpp-nometrics": "llamacpp", "sglang": "sglang"}.get(self.kind, "vllm")
            return self.send_json(handler, 200, {"object": "list", "data": [
                {"id": MODEL, "object": "model", "created": 1767225600, "owned_by": owner, "root": MODEL,
                 "parent": None, "max_model_len": 32768}]})
        if handler.path == "/metrics":
            text = self.metrics_text()
            if text is None:
                if self.kind == "llamacpp-nometrics":  # llama-server started without --metrics
                    return self.send_json(handler, 501, {"error": {"code": 501, "message": "This server does not "
                                          "support metrics endpoint. Start it with `--metrics`", "type": "not_supported_error"}})
                return self.send_json(handler, 404, {"detail": "Not Found"})
            return self.send(handler, 200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
        return self.send_json(handler, 404, {"detail": "Not Found"})

    def metrics_text(self) -> str | None:
        n = self.served
        if self.kind in ("vllm", "vllm-plain"):
            # vLLM registers these with prometheus_client (vllm/v1/spec_decode/metrics.py): let it write them
            registry = CollectorRegistry()
            labels = {"engine": "0", "model_name": MODEL}
            Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", list(labels),
                    registry=registry).labels(**labels).inc(0)
            if self.kind == "vllm":
                for name, value in (("vllm:spec_decode_num_drafts", DRAFTS), ("vllm:spec_decode_num_draft_tokens", DRAFT_TOKENS),
                                    ("vllm:spec_decode_num_accepted_tokens", ACCEPTED)):
                    Counter(name, "Number of ...", list(labels), registry=registry).labels(**labels).inc(value * n)
                per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                                  [*labels, "position"], registry=registry)
                for position, value in enumerate(PER_POS):
                    per_pos.labels(**labels, position=str(position)).inc(value * n)
            return generate_latest(registry).decode()
        if self.kind == "llamacpp":  # tools/server: counters named with _total, no labels but position
            lines = [
                "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.",
                "# TYPE llamacpp:prompt_tokens_total counter",
                f"llamacpp:prompt_tokens_total {12 * n}",
                "# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.",
                "# TYPE llamacpp:tokens_predicted_total counter",
                f"llamacpp:tokens_predicted_total {TOKENS * n}",
            ]
            for name, value in (("drafts", DRAFTS), ("draft_tokens", DRAFT_TOKENS), ("accepted_tokens", ACCEPTED)):
                lines += [f"# HELP llamacpp:spec_decode_num_{name}_total Speculative decoding {name}.",
                          f"# TYPE llamacpp:spec_decode_num_{name}_total counter",
                          f"llamacpp:spec_decode_num_{name}_total {value * n}"]
            lines += ["# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per position.",
                      "# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter"]
            lines += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{p}"}} {v * n}'
                      for p, v in enumerate(PER_POS)]
            lines += ["# HELP llamacpp:requests_processing Number of requests processing.",
                      "# TYPE llamacpp:requests_processing gauge", "llamacpp:requests_processing 0"]
            return "\n".join(lines) + "\n"
        return None

    def handle_post(self, handler, body: dict) -> None:
        if self.kind == "html":
            return self.html_404(handler)
        text = json.dumps(body.get("messages") or body.get("prompt"))
        if self.kind == "error500" or (self.fail_on and self.fail_on in text):
            return self.send_json(handler, 500, {"error": {"message": "CUDA error: out of memory (tried to allocate "
                                  "2.00 GiB)", "type": "InternalServerError", "param": None, "code": 500}})
        if self.kind == "slow":
            self.released.wait(timeout=60)  # the bound is a hang guard only
        chat = handler.path == "/v1/chat/completions"
        if not chat and handler.path != "/v1/completions":
            return self.send_json(handler, 404, {"detail": "Not Found"})
        if self.kind == "sglang" and body.get("return_meta_info"):
            if body.get("stream"):  # serving_chat.py refuses it
                return self.send_json(handler, 400, {"object": "error", "message": "return_meta_info is not "
                                      "supported with streaming. Please set stream=false when using return_meta_info=true.",
                                      "type": "BadRequestError", "param": None, "code": 400})
            return self.send_json(handler, 200, self.sglang_full_response(body))
        self.stream(handler, body, chat)

    def sglang_full_response(self, body: dict) -> dict:
        return {"id": "abc", "object": "chat.completion", "created": 1767225600, "model": MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(PIECES)},
                             "finish_reason": "length", "matched_stop": None,
                             "meta_info": {"id": "abc", "finish_reason": {"type": "length", "length": TOKENS},
                                           "prompt_tokens": 12, "completion_tokens": TOKENS, "cached_tokens": 0,
                                           "spec_verify_ct": TOKENS - ACCEPTED, "spec_accept_length": TOKENS / (TOKENS - ACCEPTED),
                                           "spec_accept_token_num": ACCEPTED, "spec_draft_token_num": DRAFT_TOKENS,
                                           "e2e_latency": 0.05}}],
                "usage": {"prompt_tokens": 12, "completion_tokens": TOKENS, "total_tokens": 12 + TOKENS}}

    def stream(self, handler, body: dict, chat: bool) -> None:
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.send_header("cache-control", "no-cache")
        handler.send_header("connection", "close")
        handler.end_headers()
        handler.close_connection = True
        created, ident = 1767225600, "chatcmpl-1" if chat else "cmpl-1"
        kind = "chat.completion.chunk" if chat else "text_completion"

        def emit(obj) -> None:
            handler.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
            handler.wfile.flush()

        if chat:
            emit({"id": ident, "object": kind, "created": created, "model": MODEL,
                  "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]})
        if self.kind.startswith("llamacpp"):
            handler.wfile.write(b": ping\n\n")  # an SSE comment, as a keep-alive
        for piece in PIECES[: body.get("max_tokens", TOKENS)]:
            time.sleep(self.delay)
            choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            emit({"id": ident, "object": kind, "created": created, "model": MODEL,
                  "choices": [choice | {"logprobs": None, "finish_reason": None}]})
        last = {"index": 0, "delta": {}} if chat else {"index": 0, "text": ""}
        final = {"id": ident, "object": kind, "created": created, "model": MODEL,
                 "choices": [last | {"logprobs": None, "finish_reason": "length"}]}
        n = min(TOKENS, body.get("max_tokens", TOKENS))
        usage = {"prompt_tokens": 12, "completion_tokens": n, "total_tokens": 12 + n}
        # with stream_options.include_usage, a last chunk with empty choices carries the usage (all three);
        # llama-server (server-task.cpp, to_json_oaicompat_chat_stream) adds its timings to the very last chunk
        events = [final]
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({"id": ident, "object": kind, "created": created, "model": MODEL, "choices": [], "usage": usage})
        if self.kind.startswith("llamacpp"):
            for event in events:
                event["system_fingerprint"] = "b11434-00dc805"
            events[-1]["timings"] = {"cache_n": 0, "prompt_n": 12, "prompt_ms": 4.2, "prompt_per_token_ms": 0.35,
                                     "prompt_per_second": 2857.1, "predicted_n": n, "predicted_ms": 30.0,
                                     "predicted_per_token_ms": 1.9, "predicted_per_second": 533.3}
            # server_slot_stats::to_json writes the draft counts only when the request drafted a token
            if self.no_draft_on not in json.dumps(body.get("messages") or body.get("prompt")):
                events[-1]["timings"] |= {"draft_n": DRAFT_TOKENS, "draft_n_accepted": ACCEPTED}
        for event in events:
            emit(event)
        with self.lock:  # counted before the stream ends, as the engines count a finished request:
            self.served += 1  # a client that reads /metrics on [DONE] must see it (else a race)
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.wfile.flush()


@pytest.fixture
def servers():
    started: list[FakeServer] = []

    def start(kind: str, **options) -> FakeServer:
        server = FakeServer(kind, **options)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


@pytest.fixture
def prompt_file(tmp_path) -> Path:
    path = tmp_path / "prompts.jsonl"
    rows = [{"question_id": "q1", "category": "coding", "turns": ["Write add(a, b)."]},
            {"question_id": "q2", "category": "coding", "turns": ["Write sub(a, b)."]},
            {"question_id": "q3", "category": "summarization", "turns": ["Summarise: add adds."]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def bench(capsys, *args: str) -> tuple[int, str, str]:
    return run_cli(capsys, "bench", "--repeats", "1", "--warmup", "0", *args)


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def endpoint_row(report: dict) -> dict:
    return next(r for r in report["results"] if r["method"] == "endpoint")


# --------------------------------------------------------------------------- parsing


def test_parse_metrics_reads_vllm_counters_with_total_and_created_samples():
    registry = CollectorRegistry()
    for name, value in (("vllm:spec_decode_num_drafts", 10), ("vllm:spec_decode_num_draft_tokens", 30),
                        ("vllm:spec_decode_num_accepted_tokens", 20)):
        counter = Counter(name, "x", ["engine", "model_name"], registry=registry)
        counter.labels("0", "m").inc(value)
        counter.labels("1", "m").inc(value)  # two engines: summed
    per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "x", ["engine", "model_name", "position"], registry=registry)
    per_pos.labels("0", "m", "0").inc(9)
    per_pos.labels("0", "m", "1").inc(7)
    reading = parse_metrics(generate_latest(registry).decode())
    assert reading.engine == "vllm"
    c = reading.counters
    assert (c.drafts, c.draft_tokens, c.accepted) == (20, 60, 40)  # not the _created timestamps
    assert c.per_position == {0: 9, 1: 7}


def test_parse_metrics_without_speculation_counters_and_non_prometheus_text():
    assert parse_metrics("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n").counters is None
    with pytest.raises(ValueError):
        parse_metrics("<html><body>Not Found</body></html>")


def test_counter_differences():
    before = SpecCounters(1, 3, 2, {0: 1, 1: 1})
    after = SpecCounters(5, 15, 11, {0: 5, 1: 4, 2: 2})
    assert after.minus(before) == SpecCounters(4, 12, 9, {0: 4, 1: 3, 2: 2})


@pytest.mark.parametrize("given, expected", [
    ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
    ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
    ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080"),
    ("https://gpu-box/api/v1/", "https://gpu-box/api"),
])
def test_normalize_url(given, expected):
    assert normalize_url(given, "--endpoint") == expected


# --------------------------------------------------------------------------- engines


def test_vllm_metrics_give_acceptance_tau_and_per_position(servers, prompt_file, capsys):
    server = servers("vllm")
    code, out, err = bench(capsys, "--endpoint", server.url, "--prompts", str(prompt_file), "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    row = endpoint_row(report)
    assert report["endpoint"]["engine"] == "vllm" and report["endpoint"]["model"] == MODEL
    assert row["speculation_source"] == "vllm /metrics"
    assert row["acceptance_rate"] == pytest.approx(ACCEPTED / DRAFT_TOKENS)
    assert row["mean_accepted_length"] == pytest.approx(TOKENS / (TOKENS - ACCEPTED))
    assert row["target_forwards"] == pytest.approx(TOKENS - ACCEPTED)
    assert row["per_position_acceptance"] == pytest.approx([p / DRAFTS for p in PER_POS])
    assert row["tokens_per_second"] > 0 and row["ttft_seconds"] > 0
    assert row["speedup"] is None  # no baseline
    assert set(row["per_category"]) == {"coding", "summarization"}
    assert row["per_category"]["coding"]["acceptance_rate"] == pytest.approx(0.75)
    # what went over the wire: streamed chat requests with usage, greedy, the model it serves
    posts = [body for method, path, body in server.requests if method == "POST"]
    assert len(posts) == 3 and all(p["stream"] and p["stream_options"] == {"include_usage": True} for p in posts)
    assert posts[0]["messages"] == [{"role": "user", "content": "Write add(a, b)."}]
    assert posts[0]["temperature"] == 0.0 and posts[0]["max_tokens"] == 128 and posts[0]["model"] == MODEL
    assert sum(1 for method, path, _ in server.requests if path == "/metrics") == 1 + 1 + 3  # probe, start, per prompt


def test_llamacpp_metrics_and_completions_api(servers, prompt_file, capsys):
    server = servers("llamacpp")
    code, out, err = bench(capsys, "--endpoint", server.url + "/v1/", "--prompts", str(prompt_file), "--api",
                           "completions", "--limit", "1", "--format", "json", "-n", "16")
    assert code == 0, err
    report = json.loads(out)
    row = endpoint_row(report)
    assert report["endpoint"]["engine"] == "llama.cpp"
    assert row["speculation_source"] == "llama.cpp /metrics"
    assert row["per_position_acceptance"] == pytest.approx([p / DRAFTS for p in PER_POS])
    posts = [(path, body) for method, path, body in server.requests if method == "POST"]
    assert posts[0][0] == "/v1/completions" and posts[0][1]["prompt"] == "Write add(a, b)."
    assert report["runs"][0]["tokens_from"] == "usage" and report["runs"][0]["completion_tokens"] == TOKENS


def test_llamacpp_timings_when_metrics_are_off(servers, prompt_file, capsys):
    server = servers("llamacpp-nometrics")
    code, out, err = bench(capsys, "--endpoint", server.url, "--prompts", str(prompt_file), "--format", "json")
    assert code == 0, err
    row = endpoint_row(json.loads(out))
    assert row["speculation_source"] == "llama.cpp timings"
    assert row["acceptance_rate"] == pytest.approx(ACCEPTED / DRAFT_TOKENS)
    assert row["mean_accepted_length"] == pytest.approx(TOKENS / (TOKENS - ACCEPTED))
    assert row["per_position_acceptance"] is None  # timings have no positions


def test_llamacpp_request_that_drafted_nothing_counts_zero_without_metrics(servers, prompt_file, capsys):
    """llama-server leaves timings.draft_n out when a request drafted nothing (an n-gram drafter with no
    match): that request counts 0 drafted, not the whole run's acceptance unknown."""
    server = servers("llamacpp-nometrics", no_draft_on="Summarise")
    code, out, err = bench(capsys, "--endpoint", server.url, "--prompts", str(prompt_file), "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    row = endpoint_row(report)
    assert row["speculation_source"] == "llama.cpp timings"
    assert row["acceptance_rate"] == pytest.approx(ACCEPTED / DRAFT_TOKENS)  # 2 prompts drafted, 1 did not
    assert row["mean_accepted_length"] == pytest.approx(3 * TOKENS / (3 * TOKENS - 2 * ACCEPTED))
    assert row["speculation_counters"] == {"draft_tokens": 2 * DRAFT_TOKENS, "accepted_tokens": 2 * ACCEPTED}
    assert row["per_category"]["summarization"]["acceptance_rate"] is None  # drafted 0: no rate
    assert row["per_category"]["summarization"]["mean_accepted_length"] == pytest.approx(1.0)
    assert [(r["prompt"], r["drafted"], r["accepted"]) for r in report["runs"]] == [
        ("q1", DRAFT_TOKENS, ACCEPTED), ("q2", DRAFT_TOKENS, ACCEPTED), ("q3", 0, 0)]
    assert not any("acceptance unknown" in note or "drafted no tokens" in note for note in report["notes"])


def test_llamacpp_without_speculation_says_it_drafted_nothing(servers, prompt_file, capsys):
    server = servers("llamacpp-nometrics", no_draft_on="")  # no request drafted: a server without --spec-type
    code, out, err = bench(capsys, "--endpoint", server.url, "--prompts", str(prompt_file), "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    row = endpoint_row(report)
    assert row["speculation_source"] == "llama.cpp timings" and row["acceptance_rate"] is None
    assert row["mean_accepted_length"] == pytest.approx(1.0)
    assert any("drafted no tokens during the run: is speculation on" in note for note in report["notes"])
    assert not any(note.startswith("acceptance unknown") for note in report["notes"])


def test_vllm_per_request_stats_when_metrics_are_hidden(servers, prompt_file, capsys, monkeypatch):
    """vLLM with --per-request-spec-decode-stats: counts on the terminal chunk's choice."""
    server = servers("vllm-plain")
    original = server.stream

    def with_stats(handler, body, chat):
        real_emit_writes = handler.wfile.write

        def write(data: bytes):
            if b'"finish_reason": "length"' in data:
                event = json.loads(data.decode()[len("data: "):])
                event["choices"][0]["speculative_decoding_stats"] = {
                    "mean_acceptance_length": TOKENS / (TOKENS - ACCEPTED), "draft_acceptance_rate": ACCEPTED / DRAFT_TOKENS,
                    "acceptance_histogram": {"1": 1, "2": 1, "3": 2}, "num_spec_steps": DRAFTS,
                    "num_accepted_draft_tokens": ACCEPTED, "num_draft_tokens": DRAFT_TOKENS, "num_spec_tokens": 3}
                data = f"data: {json.dumps(event)}\n\n".encode()
            return real_emit_writes(data)

        handler.wfile.write = write
        return original(handler, body, chat)

    monkeypatch.setattr(server, "stream", with_stats)
    code, out, err = bench(capsys, "--endpoint", server.url, "--prompts", str(prompt_file), "--format", "json")
    assert code == 0, err
    row = endpoint_row(json.loads(out))
    assert row["speculation_source"] == "vllm speculative_decoding_stats"
    assert row["acceptance_rate"] == pytest.approx(0.75)
    assert row["mean_accepted_length"] == pytest.approx(TOKENS / (TOKENS - ACCEPTED))


def test_sglang_meta_info_from_an_untimed_non_streaming_copy(servers, prompt_file, capsys):
    server = servers("sglang")
    code, out, err = bench(capsys, "--endpoint", server.url, "--prompts", str(prompt_file), "--format", "json")
    assert code == 0, err
    row = endpoint_row(json.loads(out))
    assert row["speculation_source"] == "sglang meta_info"
    assert row["mean_accepted_length"] == pytest.approx(TOKENS / (TOKENS - ACCEPTED))  # completion / spec_verify_ct
    assert row["acceptance_rate"] == pytest.approx(ACCEPTED / DRAFT_TOKENS)
    posts = [body for method, _, body in server.requests if method == "POST"]
    streamed = [b for b in posts if b["stream"]]
    meta = [b for b in posts if not b["stream"]]
    assert len(streamed) == len(meta) == 3
    assert all("return_meta_info" not in b for b in streamed) and all(b["return_meta_info"] for b in meta)


def test_no_speculation_counters_reports_speed_and_unknown_acceptance(servers, prompt_file, capsys):
    server = servers("vllm-plain")
    code, out, err = bench(capsys, "--endpoint", server.url, "--prompts", str(prompt_file))
    assert code == 0, err
    assert "acceptance unknown" in out and "endpoint" in out
    code, out, err = bench(capsys, "--endpoint", server.url, "--prompts", str(prompt_file), "--format", "json")
    report = json.loads(out)
    row = endpoint_row(report)
    assert row["tokens_per_second"] > 0
    assert row["acceptance_rate"] is None and row["mean_accepted_length"] is None and row["speculation_source"] is None
    assert any(note.startswith("acceptance unknown") for note in report["notes"])


def test_plain_endpoint_bench_with_no_other_option_runs(servers, capsys):
    """`specdec bench --endpoint URL` alone: the built-in prompts, the defaults, past the option check
    (once refused with "--methods has no effect" when the local methods' default changed)."""
    server = servers("vllm", delay=0.0005)
    code, out, err = run_cli(capsys, "bench", "--endpoint", server.url)
    assert code == 0, err
    assert "has no effect" not in err and "tok/s" in out and "speculation counters: vllm /metrics" in out
    posts = [body for method, _, body in server.requests if method == "POST"]
    assert len(posts) > 1 and all(p["temperature"] == 0.0 and p["max_tokens"] in (16, 128) for p in posts)


def test_report_names_the_profile_only_when_it_shaped_the_requests(servers, prompt_file, capsys, tmp_path):
    """A server's model and speculation are its own: -p lends it sampling settings at most."""
    server = servers("vllm")
    code, out, err = bench(capsys, "--endpoint", server.url, "--prompts", str(prompt_file), "--format", "json")
    assert code == 0, err
    assert json.loads(out)["profile"] is None  # the default profile's greedy sampling: nothing of its own
    shipped = Path(__file__).resolve().parents[2] / "profiles" / "smollm2-demo.yaml"
    custom = tmp_path / "nucleus.yaml"
    custom.write_text(shipped.read_text(encoding="utf-8").replace("name: smollm2-demo", "name: nucleus").replace(
        "sampling: {temperature: 0.0, top_k: 0, top_p: 1.0}", "sampling: {temperature: 0.7, top_k: 0, top_p: 0.9}"),
        encoding="utf-8")
    code, out, err = bench(capsys, "-p", str(custom), "--endpoint", server.url, "--prompts", str(prompt_file),
                           "--limit", "1", "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert report["profile"] == "nucleus" and report["settings"]["top_p"] == 0.9
    assert [b for m, _, b in server.requests if m == "POST"][-1]["top_p"] == 0.9
    code, out, err = bench(capsys, "-p", str(custom), "--endpoint", server.url, "--prompts", str(prompt_file),
                           "--limit", "1")
    assert code == 0, err
    assert "temperature 0.7, top-p 0.9 (sampling from profile nucleus)" in " ".join(out.split())


def test_baseline_endpoint_gives_paired_speedups(servers, prompt_file, capsys):
    fast = servers("vllm", delay=0.002)
    slow = servers("vllm-plain", delay=0.008)
    code, out, err = bench(capsys, "--endpoint", fast.url, "--baseline-endpoint", slow.url,
                           "--prompts", str(prompt_file), "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert [r["method"] for r in report["results"]] == ["baseline", "endpoint"]
    baseline, row = report["results"]
    assert baseline["speedup"] == pytest.approx(1.0)
    assert row["speedup"] > 1.5  # the same chunks at a quarter of the delay
    assert report["outputs_identical"] is True and report["differences"] == []
    # interleaved per prompt: endpoint then baseline, never both at once
    order = [(server.url, p) for server in (fast, slow) for m, p, _ in server.requests if m == "POST"]
    assert len(order) == 6
    # CSV and --output, as bench writes them
    out_file = prompt_file.parent / "endpoint.csv"
    code, out, err = bench(capsys, "--endpoint", fast.url, "--baseline-endpoint", slow.url,
                           "--prompts", str(prompt_file), "--format", "csv", "--output", str(out_file))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == ("category,method,tokens_per_second,speedup,speedup_min,speedup_max,speedup_flags,acceptance_rate,"
                        "mean_accepted_length,target_forwards")
    assert [line.split(",")[:2] for line in lines[1:]] == [
        ["all", "baseline"], ["coding", "baseline"], ["summarization", "baseline"],
        ["all", "endpoint"], ["coding", "endpoint"], ["summarization", "endpoint"]]
    assert out_file.read_text(encoding="utf-8").splitlines() == out.splitlines()


def test_human_report_is_the_bench_table(servers, prompt_file, capsys):
    fast, slow = servers("llamacpp"), servers("vllm-plain", delay=0.006)
    code, out, err = bench(capsys, "--endpoint", fast.url, "--baseline-endpoint", slow.url, "--prompts", str(prompt_file))
    assert code == 0, err
    for fragment in ("tok/s", "speedup", "acceptance", "tau", "75.0%", "2.29", "per-position acceptance",
                     "0: 100%  1: 75%  2: 50%", "speculation counters: llama.cpp /metrics",
                     "equals the baseline's on every prompt"):
        assert fragment in out, (fragment, out)


def test_concurrency_uses_whole_run_counters(servers, prompt_file, capsys):
    server = servers("vllm")
    code, out, err = bench(capsys, "--endpoint", server.url, "--prompts", str(prompt_file), "--concurrency", "3",
                           "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    row = endpoint_row(report)
    assert report["settings"]["concurrency"] == 3
    assert row["acceptance_rate"] == pytest.approx(0.75)
    assert row["per_category"]["coding"]["acceptance_rate"] is None  # no per-request counters under load
    assert sum(1 for m, p, _ in server.requests if p == "/metrics") == 3  # probe, before, after


def test_ctrl_c_keeps_finished_prompts(servers, prompt_file, capsys, monkeypatch):
    server = servers("vllm")
    real = endpoint_module.stream_once

    def interrupted(client, srv, text, settings, max_tokens):
        if text == "Write sub(a, b).":
            raise KeyboardInterrupt
        return real(client, srv, text, settings, max_tokens)

    monkeypatch.setattr(endpoint_module, "stream_once", interrupted)
    out_file = prompt_file.parent / "never.json"
    code, out, err = bench(capsys, "--endpoint", server.url, "--prompts", str(prompt_file), "--format", "json",
                           "--output", str(out_file))
    assert code == 130
    report = json.loads(out)
    assert report["settings"]["prompts"] == 1 and report["settings"]["prompts_planned"] == 3
    assert endpoint_row(report)["acceptance_rate"] == pytest.approx(0.75)
    assert "interrupted" in err and not out_file.exists()


def test_ctrl_c_under_concurrency(servers, prompt_file, capsys, monkeypatch):
    server = servers("vllm")
    real = endpoint_module.stream_once

    def interrupted(client, srv, text, settings, max_tokens):
        if text == "Write sub(a, b).":
            time.sleep(0.6)  # after the other two finished
            raise KeyboardInterrupt
        return real(client, srv, text, settings, max_tokens)

    monkeypatch.setattr(endpoint_module, "stream_once", interrupted)
    code, out, err = bench(capsys, "--endpoint", server.url, "--prompts", str(prompt_file), "--concurrency", "3",
                           "--format", "json")
    assert code == 130
    assert json.loads(out)["settings"]["prompts"] == 2


def test_a_server_failing_mid_run_reports_the_finished_prompts_then_its_error(servers, prompt_file, capsys):
    server = servers("vllm", fail_on="Write sub")
    code, out, err = bench(capsys, "--endpoint", server.url, "--prompts", str(prompt_file), "--format", "json")
    assert code == 1
    assert json.loads(out)["settings"]["prompts"] == 1
    lines = err.strip().splitlines()
    assert "stopped by a server error: the 1 prompts that finished" in lines[0]
    assert lines[-1].startswith("specdec: error: ") and "HTTP 500 from POST /v1/chat/completions" in lines[-1]


# --------------------------------------------------------------------------- broken servers: one line each


def test_refused_connection(prompt_file, capsys):
    code, out, err = bench(capsys, "--endpoint", closed_port_url(), "--prompts", str(prompt_file))
    assert code == 1 and out == ""
    assert_one_line_error(err, "cannot connect to http://127.0.0.1:", "connection refused")


def test_not_an_openai_server(servers, prompt_file, capsys):
    server = servers("html")
    code, out, err = bench(capsys, "--endpoint", server.url, "--prompts", str(prompt_file))
    assert code == 1 and out == ""
    assert_one_line_error(err, "is not an OpenAI-compatible server", "GET /v1/models answered HTTP 404 (text/html)")


def test_http_500_shows_the_servers_message(servers, prompt_file, capsys):
    server = servers("error500")
    code, out, err = bench(capsys, "--endpoint", server.url, "--prompts", str(prompt_file))
    assert code == 1 and out == ""
    assert_one_line_error(err, "HTTP 500 from POST /v1/chat/completions", "CUDA error: out of memory")


def test_slow_server_hits_timeout(servers, prompt_file, capsys):
    """The server holds the request until the test ends: the client gives up at --timeout, at its
    first request, without retrying."""
    server = servers("slow")
    code, out, err = bench(capsys, "--endpoint", server.url, "--prompts", str(prompt_file), "--timeout", "0.2")
    assert code == 1 and out == ""
    assert_one_line_error(err, "did not answer POST /v1/chat/completions within 0.2 s", "--timeout")
    assert [method for method, _, _ in server.requests].count("POST") == 1


# --------------------------------------------------------------------------- usage: checked before any request


@pytest.mark.parametrize("args, fragment", [
    (["--model", "x"], "--model needs --endpoint"),
    (["--baseline-endpoint", "http://127.0.0.1:1"], "--baseline-endpoint needs --endpoint"),
    (["--endpoint", "127.0.0.1:8080"], "is not an http(s) URL"),
    (["--endpoint", "ftp://127.0.0.1"], "is not an http(s) URL"),
    (["--endpoint", "{url}", "--concurrency", "0"], "--concurrency: 0 must be between 1 and 256"),
    (["--endpoint", "{url}", "--timeout", "0"], "--timeout: 0.0 must be a positive number"),
    (["--endpoint", "{url}", "--api", "responses"], "--api: 'responses' is not one of chat, completions"),
    (["--endpoint", "{url}", "--k", "4"], "--k has no effect with --endpoint"),
    (["--endpoint", "{url}", "--methods", "plain,specdec"], "--methods has no effect with --endpoint"),
    (["--endpoint", "{url}", "--dtype", "float16"], "--dtype has no effect with --endpoint"),
    (["--endpoint", "{url}", "--baseline-endpoint", "{url}/v1"], "same server"),
    (["--endpoint", "{url}", "--limit", "0"], "--limit"),
    (["--endpoint", "{url}", "--repeats", "0"], "--repeats must be at least 1"),
])
def test_bad_usage_exits_2_before_any_request(servers, prompt_file, capsys, args, fragment):
    server = servers("vllm")
    argv = [a.replace("{url}", server.url) for a in args]
    code, out, err = bench(capsys, *argv, "--prompts", str(prompt_file))
    assert code == 2 and out == ""
    assert_one_line_error(err, fragment)
    assert server.requests == []


def test_several_models_need_model(servers, prompt_file, capsys, monkeypatch):
    server = servers("vllm")
    original = server.handle_get

    def two_models(handler):
        if handler.path == "/v1/models":
            return server.send_json(handler, 200, {"object": "list", "data": [
                {"id": "a", "object": "model", "owned_by": "vllm"}, {"id": "b", "object": "model", "owned_by": "vllm"}]})
        return original(handler)

    monkeypatch.setattr(server, "handle_get", two_models)
    code, out, err = bench(capsys, "--endpoint", server.url, "--prompts", str(prompt_file))
    assert code == 2
    assert_one_line_error(err, "serves 2 models (a, b): name one with --model")


def test_a_speedup_above_what_tau_allows_is_marked_and_the_spread_reported():
    """Paired per prompt and repeat, as a local bench: a speculating server 5x its own baseline at
    tau 2 did not get there by decoding; two repeats that disagree 1.5x are a noisy machine."""
    from specdec_cli.bench.endpoint import EndpointBench, RunResult
    from specdec_cli.serving.endpoint_client import EndpointSettings, Server
    from specdec_cli.cli.tables import mark_notes
    from specdec_cli.bench.workload import BenchPrompt

    prompts = [BenchPrompt("q1", "a"), BenchPrompt("q2", "b")]
    endpoint = Server("endpoint", "http://e", "m", "llama.cpp", metrics=False)
    baseline = Server("baseline", "http://b", "m", "llama.cpp", metrics=False)
    bench = EndpointBench(None, endpoint, baseline, prompts, EndpointSettings(repeats=2, concurrency=1))

    def run(target, prompt, repeat, seconds, drafted=None, accepted=None):
        # 21 tokens: 20 after the first, over `seconds`
        return RunResult(target, prompt, repeat, "x", 21, "usage", 0.1, 0.1 + seconds, 0.1, 0.1 + seconds,
                         drafted=drafted, accepted=accepted, drafted_from="llama.cpp timings" if drafted else None)

    for prompt in prompts:
        for repeat, (fast, slow) in enumerate([(1.0, 5.0), (1.0, 7.5)]):
            bench.results += [run("endpoint", prompt, repeat, fast, drafted=20, accepted=10),
                              run("baseline", prompt, repeat, slow)]
    row = bench.summary(None)["results"][-1]
    assert row["mean_accepted_length"] == pytest.approx(21 / 11)
    assert row["speedup"] == pytest.approx(6.25) and (row["speedup_min"], row["speedup_max"]) == (5.0, 7.5)
    assert row["speedup_flags"] == ["above_tau_bound", "wide_spread"]
    notes = [str(line) for line in mark_notes([row], lambda r: r["method"])]
    assert notes[0].startswith("? endpoint 6.25x: above what tau 1.91 allows (at most 2.39x)")
    assert notes[1].startswith("~ endpoint 6.25x: its repeats disagree by up to 1.50x (paired ratios 5.00-7.50x")
