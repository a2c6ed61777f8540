"""`specdec serve`: the profile's models behind the OpenAI API, loaded and compiled once (serve/)."""

from __future__ import annotations

import logging
from typing import Annotated, Optional

import typer

from ..errors import UsageError
from ..prompt_runs import AUTO_BATCH, MAX_BATCH, parse_batch_size, resolve_batch_size
from .options import (
    CompileOpt,
    DeviceOpt,
    DrafterOpt,
    DraftOpt,
    DtypeOpt,
    KOpt,
    MaxNewOpt,
    ProfileOpt,
    QuantizeOpt,
    TargetOpt,
    TemperatureOpt,
    TopKOpt,
    TopPOpt,
    TreeOpt,
    VerboseOpt,
)
from .setup import resolved_profile, start

MAX_PORT = 65535


def serve(
    profile: ProfileOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    drafter: DrafterOpt = None,
    k: KOpt = None,
    host: Annotated[str, typer.Option("--host", help="the address to listen on; 0.0.0.0 opens it to the network")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="the port to listen on (0: any free one, said on stderr)")] = 8000,
    batch_size: Annotated[str, typer.Option("--batch-size", metavar="N|auto", help=f"requests decoded at once (up to {MAX_BATCH}); auto: {AUTO_BATCH}; later requests wait in the queue")] = "1",
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="SPECDEC_API_KEY", help="every request but GET /health must send 'Authorization: Bearer KEY' [env: SPECDEC_API_KEY]")] = None,
    max_queue: Annotated[int, typer.Option("--max-queue", min=1, metavar="N", help="requests that may wait for a row; more get 429 with Retry-After")] = 64,
    drain: Annotated[float, typer.Option("--drain", min=0, metavar="SECONDS", help="on SIGTERM or Ctrl-C, how long requests in flight may take to finish")] = 30.0,
    max_new_tokens: MaxNewOpt = None,
    temperature: TemperatureOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    quantize: QuantizeOpt = None,
    compile_mode: CompileOpt = None,
    tree: TreeOpt = None,
    verbose: VerboseOpt = 0,
) -> None:
    """Serve the profile's models over the OpenAI API: POST /v1/chat/completions and /v1/completions
    (streamed or not), GET /v1/models, /health (503 while loading, then 200) and /metrics (Prometheus).

    Requests join the batch as rows free up, each with its own sampling, seed and stop texts; a
    request's tokens are what `specdec generate` gives for the same prompt and settings. Fields a
    request leaves out take the profile's (temperature, top_p, top_k) or -n's (max_tokens). Every
    response carries `usage` and `speculation` (drafted, accepted, acceptance_rate, tau = tokens per
    target forward, k, tree). Prompts are never logged; -v logs each request's line."""
    start(verbose)
    size = resolve_batch_size(parse_batch_size(batch_size))
    if not 0 <= port <= MAX_PORT:
        raise UsageError(f"--port: {port} is not between 0 and {MAX_PORT}")
    if api_key is not None and not api_key.strip():
        raise UsageError("--api-key: an empty key would let anyone in; give a key or leave the option out")
    chosen = resolved_profile(
        profile, target=target, draft=draft, drafter=drafter, k=k, max_new_tokens=max_new_tokens,
        temperature=temperature, top_k=top_k, top_p=top_p, device=device, dtype=dtype, quantize=quantize,
        compile=compile_mode, tree=tree,
    )
    from ..serve.run import ServeSettings
    from ..serve.run import serve as run_server

    settings = ServeSettings(host=host, port=port, batch_size=size, api_key=api_key, max_queue=max_queue,
                             drain_s=drain, max_tokens=chosen.max_new_tokens)
    notice = logging.getLogger("specdec.notice")
    raise typer.Exit(run_server(chosen, settings, announce=notice.info, access_log=verbose > 0))
