"""Structured output served: the fifty schema-constrained prompts of structured_prompts.py sent to
a running OpenAI-compatible server (specdec serve, llama.cpp's llama-server) as chat requests with
`response_format: json_schema`, one at a time, streamed, greedy. Per request: the completion's
tokens, the time to its first text and the decode rate after it; whether the answer validates.

    python benchmarks/structured_vs_llama_server.py URL [-n 400] [--limit N] [--json out.json]

Start each server alone on the machine (see serve_vs_llama_server.sh for the commands); needs
`pip install jsonschema`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import jsonschema

sys.path.insert(0, str(Path(__file__).parent))
from structured_prompts import rows  # noqa: E402


def one_request(client: httpx.Client, url: str, row: dict, max_tokens: int) -> dict:
    body = {"messages": [{"role": "user", "content": row["prompt"]}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True},
            "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": row["json_schema"]}}}
    started = time.perf_counter()
    first, text, tokens, finish = None, "", None, None
    with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and first is None:
                    first = time.perf_counter()
                text += piece
                finish = choice.get("finish_reason") or finish
    ended = time.perf_counter()
    try:
        jsonschema.validate(json.loads(text), row["json_schema"])
        valid = True
    except (json.JSONDecodeError, jsonschema.ValidationError):
        valid = False
    first = first or ended
    return {"id": row["id"], "tokens": tokens, "ttft": first - started, "decode_seconds": ended - first,
            "valid": valid, "finish": finish}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("-n", "--max-tokens", type=int, default=400)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    prompts = rows()[: args.limit]
    # a connection a request: llama-server (cpp-httplib) closes a kept-alive one after 5 requests
    with httpx.Client(timeout=600, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        one_request(client, args.url, prompts[0], 16)  # warm-up: first calls, untimed
        runs = [one_request(client, args.url, row, args.max_tokens) for row in prompts]
    tokens = sum(r["tokens"] - 1 for r in runs if r["tokens"])
    seconds = sum(r["decode_seconds"] for r in runs if r["tokens"])
    print(f"{args.url}: {len(runs)} prompts, valid {sum(r['valid'] for r in runs)}, "
          f"finished {sum(r['finish'] == 'stop' for r in runs)}; decode {tokens / seconds:.1f} tok/s after the first "
          f"text (all requests), median TTFT {statistics.median(r['ttft'] for r in runs) * 1000:.0f} ms")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
