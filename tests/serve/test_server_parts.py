"""The server's parts without a model: /health and the API answering 503 while the models load
(over real HTTP, uvicorn on the loopback), and the engine's thread after a fault in a batch."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
import uvicorn

from specdec_cli.decoding.events import Finished, Prefilled
from specdec_cli.decoding.stats import DecodeStats
from specdec_cli.serve.app import State, make_app
from specdec_cli.serve.engine import Engine, EngineFault
from specdec_cli.serve.metrics import ServerMetrics
from specdec_cli.serve.run import bind


@pytest.fixture
def loading_server():
    """The app before its service exists, as `specdec serve` is while its models load."""
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(make_app(State(ServerMetrics(4), api_key=None, max_body=1024, drain_s=1)),
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = "http://127.0.0.1:%d" % sock.getsockname()[1]
    for _ in range(100):
        if server.started:
            break
        threading.Event().wait(0.05)
    yield url
    server.should_exit = True
    thread.join(10)


def test_health_and_requests_say_503_while_loading(loading_server):
    health = httpx.get(loading_server + "/health", timeout=10)
    assert health.status_code == 503 and health.json() == {"status": "loading"} and health.headers["retry-after"]
    answer = httpx.post(loading_server + "/v1/completions", json={"prompt": "hi"}, timeout=10)
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "loading"
    assert httpx.get(loading_server + "/metrics", timeout=10).status_code == 200


class FailingDecoder:
    """A decoder whose batch fails on the prompt [666] and finishes every other at once."""

    batch_size = 1

    def stream(self, arrivals):
        while (request := arrivals.take(wait=True)) is not None:
            key, ids = request[0], list(request[1])
            yield key, Prefilled(len(ids), 0.0)
            if ids == [666]:
                raise RuntimeError("a kernel failed")
            yield key, Finished((1, 2), "length", DecodeStats(k=0, k_limit=0))


def test_a_fault_ends_its_request_with_an_error_and_the_engine_goes_on():
    engine = Engine(FailingDecoder(), ServerMetrics(4), max_queue=4)
    engine.start()

    async def ask(ids: list[int]):
        events: asyncio.Queue = asyncio.Queue()
        engine.submit(lambda key: (key, ids, 2), asyncio.get_running_loop(), events)
        while not isinstance(event := await asyncio.wait_for(events.get(), 10), (Finished, EngineFault)):
            pass
        return event

    async def both():
        return await ask([666]), await ask([5, 6])

    failed, finished = asyncio.run(both())
    assert isinstance(failed, EngineFault) and "a kernel failed" in failed.message
    assert isinstance(finished, Finished) and finished.token_ids == (1, 2)
    engine.close()
    engine.join(10)
    assert b'specdec:requests_total{outcome="error"} 1.0' in engine.metrics.text()


@pytest.mark.parametrize("stops", [(), ("ab",), ("\n\n", "xyz")])
def test_streamed_text_adds_up_to_the_answer_in_any_chunking(tokenizer, stops):
    """Pieces sent as tokens arrive, in steps of 1 to 4 tokens, join to the final text: nothing is
    sent twice, nothing that begins a stop text is sent before it is known not to be one."""
    import random

    from specdec_cli.decoding.stop_texts import text_before_stop
    from specdec_cli.serve.responses import GrowingText

    def decode(ids):
        return tokenizer.decode(list(ids), skip_special_tokens=True)

    ids = tokenizer("def fab(n):\n\n    return 'xyz' + n  # ab ünï ✓\n\nend")["input_ids"]
    full = decode(ids)
    before = text_before_stop(full, stops) if stops else None
    expected = full if before is None else before
    rng = random.Random(0)
    for _ in range(10):
        text, sent, i = GrowingText(decode, stops), "", 0
        while i < len(ids):
            n = rng.randint(1, 4)
            piece = text.add(ids[i : i + n])
            sent += piece
            assert all(stop not in sent for stop in stops)
            i += n
        assert expected.startswith(sent)
        assert sent + text.finish(expected) == expected


def test_a_row_given_up_mid_batch_leaves_its_neighbours_tokens_unchanged(tmp_path, llama_pair):
    """Three rows; the second is cancelled after its first step: the others' tokens are still
    each prompt's own, and the cancelled row ends as "cancelled"."""
    from profile_helpers import model_profile

    from specdec_cli import Pipeline

    pipe = Pipeline.from_profile(str(model_profile(tmp_path, llama_pair, max_new_tokens=20)))
    prompts = [pipe.encode(p, chat=False) for p in ("def add(a, b):", "The quick brown fox", "import os")]
    alone = [pipe.generate(ids, max_new_tokens=20, seed=0).token_ids for ids in prompts]

    class CancelSecond:
        def __init__(self):
            self.waiting = [(i, ids, 20) for i, ids in enumerate(prompts)]
            self.steps = 0

        def take(self, wait):
            return self.waiting.pop(0) if self.waiting else None

        def cancelled(self, key):
            return key == 1 and self.steps > 0

    arrivals = CancelSecond()
    finished = {}
    for key, event in pipe.batched_decoder(3).stream(arrivals):
        if isinstance(event, Finished):
            finished[key] = event
        elif key == 1 and not isinstance(event, Prefilled):
            arrivals.steps += 1
    assert finished[1].finish_reason == "cancelled" and len(finished[1].token_ids) < 20
    assert finished[0].token_ids == alone[0] and finished[2].token_ids == alone[2]
