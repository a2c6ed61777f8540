"""`specdec serve`'s life: bind the port first (so /health can say 503 while the models load),
load and compile on a thread, say "listening on ..." once ready, and on SIGTERM or Ctrl-C stop
taking connections, let the requests in flight finish (up to `drain_s`) and exit 0.

uvicorn is the HTTP server (h11: pure Python, no build on any machine); the models load beside
it, so a health probe is answered from the first second.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from dataclasses import dataclass
from typing import Callable

import uvicorn

from ..api import Pipeline
from ..errors import SpecdecError, UsageError
from ..profile import Profile
from ..specs import Workload
from .app import State, make_app
from .engine import Engine
from .metrics import ServerMetrics
from .service import Service

log = logging.getLogger("specdec")
notice = logging.getLogger("specdec.notice")
SERVED_GENERATIONS = 1000  # what compile: auto weighs for a server: it answers many requests
ENGINE_JOIN_S = 2.0


@dataclass(frozen=True)
class ServeSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    batch_size: int | str = 1
    api_key: str | None = None
    max_queue: int = 64
    max_body: int = 4 * 1024 * 1024
    drain_s: float = 30.0
    max_tokens: int | None = None  # a request's default; None: the profile's max_new_tokens


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, or a one-line UsageError (port taken, no such address)."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.set_inheritable(True)
        return sock
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port or --host") from None


def load_service(profile: Profile, settings: ServeSettings, metrics: ServerMetrics) -> Service:
    """The pipeline, its batched decoder compiled ahead (every step width), and the engine running."""
    max_tokens = settings.max_tokens or profile.max_new_tokens
    pipeline = Pipeline(profile, workload=Workload.of(SERVED_GENERATIONS, max_tokens))
    # auto: AUTO_BATCH rows where the profile runs in a batch, else one (batched_decoder says why)
    decoder = pipeline.batched_decoder(settings.batch_size) or pipeline.batched_decoder(1)
    decoder.warmup()
    engine = Engine(decoder, metrics, max_queue=settings.max_queue)
    engine.start()
    return Service(pipeline, engine, model_id=profile.name, max_tokens=max_tokens)


def serve(profile: Profile, settings: ServeSettings, *, announce: Callable[[str], None],
          access_log: bool = False) -> int:
    """Run the server until SIGTERM or Ctrl-C; the exit code (1: the models failed to load)."""
    sock = bind(settings.host, settings.port)
    host, port = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    metrics = ServerMetrics(positions=profile.adaptive.k_max if profile.k == "auto" else max(1, int(profile.k or 1)))
    state = State(metrics, api_key=settings.api_key, max_body=settings.max_body, drain_s=settings.drain_s)
    config = uvicorn.Config(make_app(state), log_level="info" if access_log else "warning", access_log=access_log,
                            timeout_graceful_shutdown=int(settings.drain_s) + 2, lifespan="off")
    server = _Server(config, state, settings.drain_s)
    failure: list[BaseException] = []

    def load() -> None:
        try:
            state.service = load_service(profile, settings, metrics)
        except BaseException as exc:  # the server cannot serve: say why and leave
            failure.append(exc)
            server.should_exit = True
            return
        service = state.service
        announce(f"listening on {url}: model '{service.model_id}' ({profile.target.model}, drafter "
                 f"{service.drafter}, batch size {service.engine.decoder.batch_size}); Ctrl-C stops")

    notice.info("loading %s on %s (GET /health says 503 until it is ready) ...", profile.target.model, url)
    threading.Thread(target=load, name="specdec-load", daemon=True).start()
    stopped = _quiet_signals()
    try:
        server.run(sockets=[sock])
    finally:
        stopped.restore()
        if state.service is not None:  # rows of requests uvicorn gave up on end with the process
            state.service.engine.close()
            state.service.engine.join(ENGINE_JOIN_S)
    if failure:
        error = failure[0]
        if isinstance(error, SpecdecError):
            raise error
        raise SpecdecError(f"the models failed to load: {error}") from error
    return 0


class _Server(uvicorn.Server):
    """uvicorn's server, saying on stderr what a stop signal does."""

    def __init__(self, config: uvicorn.Config, state: State, drain_s: float):
        super().__init__(config)
        self.state = state
        self.drain_s = drain_s

    def handle_exit(self, sig, frame) -> None:
        if not self.should_exit and self.state.service is not None:
            engine = self.state.service.engine
            notice.info("stopping: no new connections; %d requests in flight finish (up to %.0f s)",
                        engine.in_flight, self.drain_s)
        super().handle_exit(sig, frame)


class _quiet_signals:
    """SIGTERM and SIGINT, once uvicorn has shut down on them and raises them again, end the
    process with 0 (a stop asked for), not as killed."""

    def __init__(self):
        self.saved = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore(self) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
