"""What each serving engine sends about its speculation, and how it is read.

- Prometheus `/metrics` (vLLM, and llama.cpp with `--metrics`, which adopted vLLM's schema):
  `<prefix>:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens`,
  `..._num_accepted_tokens_per_pos{position}`, cumulative (the bench reads them before and after);
- per response: llama.cpp's `timings.draft_n` / `timings.draft_n_accepted` (on the last streamed chunk;
  llama-server leaves both out when a request drafted nothing, so `timings` without them counts 0),
  or vLLM's `speculative_decoding_stats` (on the terminal chunk's choice, when the server runs with
  `--per-request-spec-decode-stats`);
- SGLang's `meta_info.spec_verify_ct` (verify passes), and its accepted / drafted token counts;
- specdec serve's own `speculation` object (on the response, and on the last streamed chunks).

One module for every engine rather than one per engine file: a response is read before the server
is known (vLLM's /metrics schema is also llama.cpp's), and the sources are tried in one order.
The Prometheus text is parsed by prometheus_client's parser.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# a /v1/models `owned_by` or a metric name's prefix -> the engine's name (serving/registry.py's)
ENGINE_PREFIXES = {"vllm": "vllm", "llamacpp": "llama.cpp", "sglang": "sglang", "specdec": "specdec"}


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


def response_counts(timings: Any, stats: Any, meta: Any, speculation: Any = None) -> dict[str, Any]:
    """A response's own speculation counts, from whichever engine's fields it carries: llama.cpp's
    `timings` (last chunk), vLLM's `speculative_decoding_stats` (terminal choice), SGLang's
    `meta_info`, specdec's `speculation`."""
    counts: dict[str, Any] = {}
    if isinstance(speculation, dict) and isinstance(speculation.get("drafted"), int):
        counts.update(drafted=speculation["drafted"], accepted=int(speculation.get("accepted") or 0),
                      drafted_from="specdec speculation")
        if isinstance(speculation.get("target_forwards"), int):
            counts["verify_steps"] = speculation["target_forwards"]
    elif isinstance(timings, dict) and isinstance(timings.get("draft_n"), int):
        counts.update(drafted=timings["draft_n"], accepted=int(timings.get("draft_n_accepted") or 0),
                      drafted_from="llama.cpp timings")
    elif isinstance(timings, dict) and isinstance(timings.get("predicted_n"), int) and timings.get("draft_n") is None:
        # llama-server writes draft_n / draft_n_accepted only for a request that drafted at least one token
        # (server_slot_stats::to_json): a llama.cpp response without them drafted nothing
        counts.update(drafted=0, accepted=0, drafted_from="llama.cpp timings")
    elif isinstance(stats, dict) and isinstance(stats.get("num_draft_tokens"), int):
        counts.update(drafted=stats["num_draft_tokens"], accepted=int(stats.get("num_accepted_draft_tokens") or 0),
                      drafted_from="vllm speculative_decoding_stats")
    if isinstance(meta, dict):
        counts.update(sglang_counts(meta))
    return counts


def sglang_counts(meta: dict[str, Any]) -> dict[str, Any]:
    """SGLang's `meta_info`: verify passes, and accepted / drafted tokens where it reports them."""
    counts: dict[str, Any] = {}
    if isinstance(meta.get("spec_verify_ct"), (int, float)):
        counts["verify_steps"] = int(meta["spec_verify_ct"])
    if isinstance(meta.get("spec_accept_token_num"), (int, float)) and isinstance(meta.get("spec_draft_token_num"), (int, float)):
        counts["sglang_accepted"] = int(meta["spec_accept_token_num"])
        counts["sglang_drafted"] = int(meta["spec_draft_token_num"])
    return counts
