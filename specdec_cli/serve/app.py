"""The HTTP side: Starlette routes for the OpenAI API, /health and /metrics, the API key, the
body's size bound and every refusal as an OpenAI-style error body. Runs on uvicorn's event loop;
the work is the engine's (engine.py), reached through the Service."""

from __future__ import annotations

import hmac
import logging
from typing import Callable

from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import ApiError
from .metrics import ServerMetrics
from .responses import Shape
from .schemas import ChatRequest, CompletionRequest, parse
from .service import Service

log = logging.getLogger("specdec")
PING_S = 15  # an SSE comment this often keeps proxies from closing a quiet stream
OPEN_PATHS = ("/health",)  # answered without the API key: load balancers probe it
SEND_TIMEOUT_S = 60  # a client that stops reading a stream is let go (its row given up)
CLIENT_GONE = 499


class State:
    """What the routes read: the service once it is loaded, and why it is not."""

    def __init__(self, metrics: ServerMetrics, *, api_key: str | None, max_body: int, drain_s: float):
        self.metrics = metrics
        self.api_key = api_key
        self.max_body = max_body
        self.drain_s = drain_s
        self.service: Service | None = None

    def ready(self) -> Service:
        if self.service is None:
            raise ApiError(503, "the model is still loading: GET /health says 200 once it is ready",
                           code="loading", headers={"Retry-After": "5"})
        return self.service


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


class Guard:
    """ASGI middleware: the API key, and bodies over the bound refused (413) before they are read
    whole (by Content-Length, and by counting where it is absent or lies)."""

    def __init__(self, app: ASGIApp, state: State):
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope["path"], headers)
        if refusal is not None:
            await error_response(refusal)(scope, receive, send)
            return
        await self.app(scope, self._bounded(receive), send)

    def _refusal(self, path: str, headers: dict[str, str]) -> ApiError | None:
        key = self.state.api_key
        if key is not None and path not in OPEN_PATHS:
            given = headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
                return ApiError(401, "a valid API key is needed: send 'Authorization: Bearer KEY'",
                                code="invalid_api_key")
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.state.max_body:
            return self._too_large()
        return None

    def _too_large(self) -> ApiError:
        return ApiError(413, f"the body is over {self.state.max_body} bytes", code="request_too_large")

    def _bounded(self, receive: Receive) -> Receive:
        seen = 0

        async def bounded() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.state.max_body:
                    raise self._too_large()
            return message

        return bounded


def make_app(state: State) -> Starlette:
    async def health(request: Request) -> Response:
        if state.service is None:
            return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": "5"})
        if not state.service.engine.alive:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> Response:
        service = state.ready()
        return JSONResponse({"object": "list", "data": [
            {"id": service.model_id, "object": "model", "created": 0, "owned_by": "specdec"}]})

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.text(), media_type=state.metrics.content_type)

    def completion_route(model: type, chat: bool) -> Callable:
        async def route(request: Request) -> Response:
            service = state.ready()
            parsed = parse(model, await request.body())
            key, events, prepared = await service.start(parsed)
            shape = Shape(chat=chat, model=service.model_id)
            if parsed.stream:
                return EventSourceResponse(
                    service.chunks(shape, key, events, prepared, parsed.include_usage()),
                    ping=PING_S, shutdown_grace_period=state.drain_s, send_timeout=SEND_TIMEOUT_S,
                )
            body = await service.whole(shape, key, events, prepared, request.is_disconnected)
            if body is None:  # the client went: nobody reads an answer (nginx's 499, for the access log)
                return Response(status_code=CLIENT_GONE)
            return JSONResponse(body)

        return route

    async def api_error(request: Request, exc: ApiError) -> Response:
        return error_response(exc)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = {404: f"no such endpoint: {request.url.path}",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
        return error_response(ApiError(exc.status_code, message, code=code))

    async def server_error(request: Request, exc: Exception) -> Response:
        log.error("an error answering %s: %s", request.url.path, exc, exc_info=log.isEnabledFor(logging.DEBUG))
        return error_response(ApiError(500, f"the server failed on this request: {exc}", code="server_error"))

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/chat/completions", completion_route(ChatRequest, chat=True), methods=["POST"]),
        Route("/v1/completions", completion_route(CompletionRequest, chat=False), methods=["POST"]),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(Guard, state=state)],
        exception_handlers={ApiError: api_error, HTTPException: http_error, Exception: server_error},
    )
