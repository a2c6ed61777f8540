"""What `GET /metrics` says, in Prometheus text: requests, tokens, speculation and the engine's
steps. The speculation counters use vLLM's names under the `specdec:` prefix (llama.cpp adopted
the same schema), so dashboards and `specdec bench --endpoint` read them as they read those
engines'. One registry per server, updated from the engine's thread (prometheus_client's
metrics are thread-safe)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..decoding.events import Finished, Prefilled, Verified

PREFIX = "specdec:"
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, positions: int):
        """`positions`: the deepest draft position counted apart (deeper ones count at the last)."""
        self.registry = CollectorRegistry()
        self.positions = max(1, positions)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=self.registry)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(PREFIX + name, doc, registry=self.registry)

        self.requests = counter("requests", "requests ended, by outcome (eos, length, stop, cancelled, error)",
                                ("outcome",))
        self.prompt_tokens = counter("prompt_tokens", "prompt tokens read (prefilled)")
        self.generation_tokens = counter("generation_tokens", "tokens generated")
        self.target_forwards = counter("target_forwards", "target forward passes (verify steps), per request row")
        self.drafts = counter("spec_decode_num_drafts", "steps that verified a draft")
        self.draft_tokens = counter("spec_decode_num_draft_tokens", "drafted tokens verified")
        self.accepted = counter("spec_decode_num_accepted_tokens", "drafted tokens accepted")
        self.accepted_per_position = counter("spec_decode_num_accepted_tokens_per_pos",
                                             "drafted tokens accepted at each draft position (0: the first)",
                                             ("position",))
        self.tokens_per_forward = gauge("tokens_per_target_forward",
                                        "tokens emitted per target forward since the server started (tau)")
        self.waiting = gauge("num_requests_waiting", "requests queued for a row (queue depth)")
        self.running = gauge("num_requests_running", "requests decoding in the batch")
        self.step_seconds = Histogram(PREFIX + "step_seconds", "seconds of one row's step (draft, verify, commit)",
                                      buckets=STEP_BUCKETS, registry=self.registry)
        for position in range(self.positions):  # present from the start: a rate over no drafts reads 0
            self.accepted_per_position.labels(position=str(position))
        self._emitted = 0
        self._forwards = 0

    def observe(self, event: object) -> None:
        """Count one of the core's events (called on the engine's thread)."""
        if isinstance(event, Prefilled):
            self.prompt_tokens.inc(event.prompt_tokens)
        elif isinstance(event, Verified):
            self._emitted += len(event.emitted)
            self._forwards += 1
            self.generation_tokens.inc(len(event.emitted))
            self.target_forwards.inc()
            self.tokens_per_forward.set(self._emitted / self._forwards)
            self.step_seconds.observe(event.seconds)
            if event.nodes:
                self.drafts.inc()
                self.draft_tokens.inc(event.nodes)
                self.accepted.inc(event.n_accepted)
                for position in range(event.n_accepted):
                    self.accepted_per_position.labels(position=str(min(position, self.positions - 1))).inc()
        elif isinstance(event, Finished):
            self.requests.labels(outcome=event.finish_reason).inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)
