"""`specdec serve` over real HTTP on the loopback, as clients reach it: the official openai client
for chat and completions, streamed and not, each answer equal to `specdec generate`'s for the same
prompt and settings, alone or beside other requests; the API key; every bad input as a 4xx with an
OpenAI-style body and the server still right after it; a client leaving mid-stream; /metrics read
by `specdec bench --endpoint`'s own parser; SIGTERM with a request in flight."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from cli_helpers import default_sigint, run_cli
from profile_helpers import model_profile

from specdec_cli.serving.wire import parse_metrics

REPO = Path(__file__).resolve().parents[2]
KEY = "test-key"
PROMPTS = ["def add(a, b):", "The quick brown fox jumps over", "import os", "class Node:", "for i in range(10):"]
START_TIMEOUT_S = 120


class Server:
    """`python -m specdec_cli serve ... --port 0` with stderr drained by a thread; its URL from
    the "listening on" line."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "specdec_cli", "serve", "--port", "0", *args], cwd=REPO,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     preexec_fn=default_sigint)
        self.err = ""
        self.url: str | None = None
        self.bound: str | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def _drain(self) -> None:
        for raw in iter(self.proc.stderr.readline, b""):
            line = raw.decode("utf-8", "replace")
            self.err += line
            found = re.search(r"on (http://[^\s:]+:\d+)", line)
            if found and self.bound is None:
                self.bound = found.group(1)
            if "listening on" in line:
                self.url = re.search(r"listening on (http://[^\s:]+:\d+)", line).group(1)
                self._ready.set()
        self._ready.set()

    def wait_ready(self) -> str:
        assert self._ready.wait(START_TIMEOUT_S), self.err
        assert self.url is not None, self.err
        return self.url

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


@pytest.fixture(scope="module")
def profile(tmp_path_factory, llama_pair) -> Path:
    return model_profile(tmp_path_factory.mktemp("serve"), llama_pair, max_new_tokens=16)


@pytest.fixture(scope="module")
def server(profile):
    """Three rows at once, behind an API key."""
    running = Server("-p", str(profile), "--batch-size", "3", "--api-key", KEY)
    running.wait_ready()
    yield running
    assert running.stop() == 0, running.err


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def generated(capsys, profile: Path, prompt: str, *extra: str) -> dict:
    """`specdec generate -f json`'s answer for the prompt."""
    code, out, err = run_cli(capsys, "generate", prompt, "-p", str(profile), "-f", "json", *extra)
    assert code == 0, err
    return json.loads(out)


def post(server: Server, path: str, body, *, key: str | None = KEY, raw: bytes | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if raw is not None:
        return httpx.post(server.url + path, content=raw, headers={**headers, "content-type": "application/json"},
                          timeout=60)
    return httpx.post(server.url + path, json=body, headers=headers, timeout=60)


def assert_api_error(response: httpx.Response, status: int, *fragments: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}, error
    for fragment in fragments:
        assert fragment in error["message"], (fragment, error)
    return error


def metrics(server: Server) -> str:
    response = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert response.status_code == 200
    return response.text


def counter(text: str, name: str, **labels: str) -> float:
    pattern = re.escape(name) + (r"\{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + r"\}" if labels else "")
    found = re.search(r"^" + pattern + r" ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


# --------------------------------------------------------------------------- answers


def test_chat_equals_generate_streamed_and_not(capsys, server, client, profile):
    expected = generated(capsys, profile, PROMPTS[0])
    whole = client.chat.completions.create(model="test", messages=[{"role": "user", "content": PROMPTS[0]}])
    assert whole.choices[0].message.content == expected["text"]
    assert whole.choices[0].finish_reason == ("length" if expected["finish_reason"] == "length" else "stop")
    assert whole.usage.completion_tokens == expected["new_tokens"]
    assert whole.usage.prompt_tokens == expected["prompt_tokens"]
    spec = whole.model_extra["speculation"]
    assert spec["drafted"] == expected["stats"]["drafted"] and spec["accepted"] == expected["stats"]["accepted"]
    assert spec["tau"] == pytest.approx(expected["stats"]["mean_accepted_length"])

    stream = client.chat.completions.create(model="test", messages=[{"role": "user", "content": PROMPTS[0]}],
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected["text"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == expected["new_tokens"]
    assert chunks[-1].model_extra["speculation"]["drafted"] == expected["stats"]["drafted"]


def test_completions_equal_generate_without_the_chat_template(capsys, server, client, profile):
    expected = generated(capsys, profile, PROMPTS[1], "--no-chat")
    whole = client.completions.create(model="test", prompt=PROMPTS[1])
    assert whole.choices[0].text == expected["text"]
    streamed = "".join(c.choices[0].text for c in client.completions.create(model="test", prompt=PROMPTS[1],
                                                                             stream=True) if c.choices)
    assert streamed == expected["text"]


def test_concurrent_requests_each_equal_its_own_generate(capsys, server, client, profile):
    """Five requests on three rows: requests join as rows free up, each with its own length and seed."""
    settings = [dict(max_tokens=4 + 3 * i, temperature=0.0 if i % 2 else 1.0, seed=100 + i) for i in range(len(PROMPTS))]
    expected = [generated(capsys, profile, p, "-n", str(s["max_tokens"]), "-t", str(s["temperature"]),
                          "--seed", str(s["seed"]))["text"] for p, s in zip(PROMPTS, settings)]

    def ask(i: int) -> str:
        answer = client.chat.completions.create(model="test", messages=[{"role": "user", "content": PROMPTS[i]}],
                                                **settings[i])
        return answer.choices[0].message.content

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(ask, range(len(PROMPTS))))
    assert answers == expected


def test_stop_texts_end_the_answer_before_them(capsys, server, client, profile):
    full = generated(capsys, profile, PROMPTS[3], "--no-chat")["text"]
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    expected = generated(capsys, profile, PROMPTS[3], "--no-chat", "--stop", stop)
    answer = client.completions.create(model="test", prompt=PROMPTS[3], stop=[stop])
    assert answer.choices[0].text == expected["text"] and stop not in answer.choices[0].text
    assert answer.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(model="test", prompt=PROMPTS[3],
                                                                             stop=stop, stream=True) if c.choices)
    assert streamed == expected["text"]


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == ["test"]
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200  # no key needed
    client.completions.create(model="test", prompt=PROMPTS[2], max_tokens=8)
    text = metrics(server)
    reading = parse_metrics(text)  # `specdec bench --endpoint`'s own reader
    assert reading.engine == "specdec" and reading.counters.draft_tokens > 0
    assert reading.counters.accepted <= reading.counters.draft_tokens
    assert counter(text, "specdec:generation_tokens_total") >= 8
    assert counter(text, "specdec:tokens_per_target_forward") >= 1.0
    assert "specdec:num_requests_waiting" in text and "specdec:step_seconds_bucket" in text


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("path, body, status, fragment", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400,
     "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "role"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n:"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "the fox " * 400}, 400, "context"),
    ("/v1/completions", {"prompt": "hi", "model": "gpt-4"}, 404, "gpt-4"),
    ("/v1/completions", {"prompt": "hi", "stop": ""}, 400, "stop"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": 10}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 2}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "seed": -1}, 400, "seed"),
    ("/v1/nothing", {}, 404, "/v1/nothing"),
])
def test_bad_requests_get_an_openai_error_and_the_server_goes_on(server, client, path, body, status, fragment):
    assert_api_error(post(server, path, body), status, fragment)
    assert client.completions.create(model="test", prompt="hi", max_tokens=2).usage.completion_tokens >= 1


def test_nulls_mean_defaults_and_a_vanishing_temperature_is_greedy(capsys, server, profile):
    """What LangChain and other clients send: every optional field null."""
    expected = generated(capsys, profile, PROMPTS[2], "--no-chat")["text"]
    body = {"prompt": PROMPTS[2], "n": None, "stream": None, "presence_penalty": None, "echo": None,
            "logprobs": None, "max_tokens": None, "temperature": 1e-300, "seed": 3}
    answer = post(server, "/v1/completions", body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"] == expected


def test_malformed_json_oversized_bodies_and_a_missing_key(server, client):
    assert_api_error(post(server, "/v1/completions", None, raw=b'{"prompt": "hi"'), 400, "not valid JSON")
    assert_api_error(post(server, "/v1/completions", None, raw=b'[1, 2]'), 400)
    assert_api_error(post(server, "/v1/completions", None, raw=b"x" * (5 * 1024 * 1024)), 413)
    assert_api_error(post(server, "/v1/completions", {"prompt": "hi"}, key=None), 401, "API key")
    assert_api_error(post(server, "/v1/completions", {"prompt": "hi"}, key="wrong"), 401)
    assert httpx.get(server.url + "/metrics", timeout=10).status_code == 401
    assert httpx.get(server.url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                     timeout=10).status_code == 405
    assert client.completions.create(model="test", prompt="hi", max_tokens=2).usage.completion_tokens >= 1


# --------------------------------------------------------------------------- clients that leave, full queues, SIGTERM


@pytest.fixture(scope="module")
def endless_profile(tmp_path_factory, tokenizer) -> Path:
    """A model that never emits EOS (tiny_models.build_endless_model): requests last as long as asked."""
    from tiny_models import build_endless_model

    root = tmp_path_factory.mktemp("serve-endless")
    folder = build_endless_model(tokenizer, root / "model")
    path = root / "endless.yaml"
    path.write_text(f"target: {{model: {folder}, dtype: float32}}\ndrafter: {{kind: ngram}}\n"
                    "device: cpu\nk: 2\nmax_new_tokens: 3000\nchat: false\ncompile: off\n")
    return path


def test_a_client_leaving_mid_stream_frees_its_row_and_a_full_queue_says_429(endless_profile):
    """One row, one request may wait: a third gets 429 with Retry-After; a client that leaves
    mid-stream frees its row (counted as cancelled) and the next request runs."""
    running = Server("-p", str(endless_profile), "--max-queue", "1")
    try:
        url = running.wait_ready()
        body = {"prompt": "the quick brown fox", "stream": True}
        with httpx.Client(timeout=60) as first, httpx.Client(timeout=60) as second:
            with first.stream("POST", url + "/v1/completions", json=body) as stream:
                lines = stream.iter_lines()
                assert next(line for line in lines if line.startswith("data:"))  # decoding: the row is taken
                with second.stream("POST", url + "/v1/completions", json=body) as waiting:
                    assert waiting.status_code == 200  # queued behind the first
                    refused = httpx.post(url + "/v1/completions", json={"prompt": "hi"}, timeout=30)
                    assert_api_error(refused, 429, "queue")
                    assert refused.headers["retry-after"].isdigit()
                # both clients leave here, mid-stream
        deadline = time.monotonic() + 30
        while counter(httpx.get(url + "/metrics").text, "specdec:requests_total", outcome="cancelled") < 2:
            assert time.monotonic() < deadline, "the rows of the clients that left were not freed"
            time.sleep(0.2)
        answer = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=60).json()
        assert answer["usage"]["completion_tokens"] == 3 and answer["choices"][0]["finish_reason"] == "length"
    finally:
        assert running.stop() == 0, running.err


def test_sigterm_lets_the_request_in_flight_finish_and_exits_0(endless_profile):
    running = Server("-p", str(endless_profile))
    url = running.wait_ready()
    payloads = []
    with httpx.stream("POST", url + "/v1/completions", json={"prompt": "the fox", "max_tokens": 300, "stream": True},
                      timeout=60) as stream:
        for line in stream.iter_lines():
            if not line.startswith("data:"):
                continue
            if not payloads:
                running.proc.send_signal(signal.SIGTERM)
            payloads.append(line[5:].strip())
    assert payloads[-1] == "[DONE]"
    finals = [json.loads(p) for p in payloads[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in finals if c["choices"]][-1] == "length"
    assert running.proc.wait(60) == 0, running.err
    assert "Traceback" not in running.err


def test_bench_endpoint_measures_specdec_serve(capsys, server, monkeypatch, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS[:2]) + "\n")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    code, out, err = run_cli(capsys, "bench", "--endpoint", server.url, "--prompts", str(prompts), "-n", "8",
                             "--concurrency", "2", "-f", "json")
    assert code == 0, err
    report = json.loads(out)
    assert report["endpoint"]["engine"] == "specdec" and report["endpoint"]["speculation_metrics"] is True
    runs = report["runs"]
    assert runs and all(r["drafted_from"] == "specdec speculation" and r["drafted"] >= r["accepted"] for r in runs)


# --------------------------------------------------------------------------- structured output

ENUM_SCHEMA = {"type": "object", "properties": {"tag": {"enum": ["alpha", "beta"]}}, "required": ["tag"],
               "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}  # compact JSON


def test_response_format_holds_the_answer_to_a_schema_as_generate_does(capsys, tmp_path, server, client, profile):
    """A json_schema answer equals `generate --json-schema`'s, and a row beside it stays free."""
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(ENUM_SCHEMA))
    expected = generated(capsys, profile, PROMPTS[0], "--json-schema", str(schema_file), "-n", "64")
    fmt = {"type": "json_schema", "json_schema": {"name": "tag", "schema": ENUM_SCHEMA}}
    with ThreadPoolExecutor(2) as pool:
        free = pool.submit(client.completions.create, model="test", prompt=PROMPTS[1], max_tokens=16)
        answer = client.chat.completions.create(model="test", messages=[{"role": "user", "content": PROMPTS[0]}],
                                                max_tokens=64, response_format=fmt)
    assert answer.choices[0].message.content == expected["text"] and answer.choices[0].finish_reason == "stop"
    assert json.loads(expected["text"])["tag"] in ("alpha", "beta")
    assert free.result().choices[0].text == generated(capsys, profile, PROMPTS[1], "--no-chat")["text"]


def test_a_schema_the_server_cannot_use_is_a_400_naming_response_format(server):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strng"}}}
    error = assert_api_error(post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                                   "response_format": bad}), 400, "strng")
    assert error["param"] == "response_format"
    assert_api_error(post(server, "/v1/completions", {"prompt": "hi", "response_format": {"type": "xml"}}), 400,
                     "json_schema")
