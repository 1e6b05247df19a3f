"""What a client sees when a Ray Serve replica dies under its request: an OpenAI error, never a bare 500 or a cut body.

Ray Serve's HTTP proxy (ray 2.60, `ray/serve/_private/proxy.py`, `send_request_to_replica`) catches a replica's
death (RayActorError) and, before any response message, sends nothing at all: its uvicorn then answers a plain-text
500; a stream that already started just stops (no last chunk), and the connection closes mid-body. This ASGI
middleware runs inside the proxy, around its app, and finishes those responses the way `specpack serve` finishes its
own (app.py: an error object; inside a started stream, an error event, then `data: [DONE]`):

    the proxy returned ── no http.response.start sent ──────────> 503 OpenAI error object, Retry-After: 1
                     └─── an event stream started, not ended ───> data: {"error": ...}  data: [DONE]  (body ended)
                     └─── anything else (ended, or not a stream) ─> as the proxy left it
    the proxy's own refusal (a text/plain 4xx/5xx: 503 no replica up, 408 request_timeout_s, 429 max_queued_requests)
                          ─> the same status and headers (Retry-After), its text in an OpenAI error object (http_STATUS)

The official openai client retries the 503 (max_retries, after Retry-After) and raises APIError from the error event.

Ray loads it in each proxy from the environment variable RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH = PROXY_CALLBACK,
set before the node starts (`specpack serve --ray` sets it for the local cluster it starts; docs/ray_serve.md).
No ray import here: the proxy imports this module, and the app's own modules stay free of ray.
"""

from __future__ import annotations

import logging

from starlette.middleware import Middleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specpack.serve.api_errors import APIError
from specpack.serve.responses import sse

PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "specpack.serve.ray_proxy:middlewares"
RETRY_AFTER_S = 1  # the other replicas take the retry at once; a dead one is out of the routing table by then

log = logging.getLogger(__name__)

UNANSWERED = APIError(503, "the replica that took this request stopped before answering (Ray Serve); retry it",
                      type="server_error", code="replica_lost", headers={"Retry-After": str(RETRY_AFTER_S)})
CUT_STREAM = APIError(503, "the replica serving this stream stopped mid-way (Ray Serve): the text so far is "
                      "incomplete; retry the request", type="server_error", code="replica_lost")


def middlewares() -> list[Middleware]:
    """Ray's proxy callback (PROXY_CALLBACK): the middlewares its HTTP proxy wraps its app in."""
    return [Middleware(ProxyErrorsMiddleware)]


class ProxyErrorsMiddleware:
    """Finishes a response that Ray's proxy left unstarted or cut, and puts Ray's own plain-text refusals in OpenAI's
    error object (the module's docstring says how)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = ended = stream = False
        refusal: Message | None = None  # Ray's own plain-text refusal: its start, held until its text has come
        text = b""

        async def watch(message: Message) -> None:
            nonlocal started, ended, stream, refusal, text
            if message["type"] == "http.response.start":
                started = True
                kind = dict((name.lower(), value) for name, value in message.get("headers", ())).get(b"content-type", b"")
                stream = kind.startswith(b"text/event-stream")
                if message["status"] >= 400 and kind.startswith(b"text/plain"):  # the app's errors are JSON
                    refusal = message
                    return
            elif message["type"] == "http.response.body":
                ended = not message.get("more_body", False)
                if refusal is not None:
                    text += message.get("body", b"")
                    if ended:
                        await _as_error_object(refusal, text)(scope, receive, send)
                    return
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:  # the proxy's own failure: the client still gets an answer below
            log.exception("Ray Serve's proxy failed on %s", scope.get("path"))
        if not started:
            response = JSONResponse(UNANSWERED.body(), status_code=UNANSWERED.status, headers=UNANSWERED.headers)
            await response(scope, receive, send)
        elif refusal is not None and not ended:
            await _as_error_object(refusal, text)(scope, receive, send)
        elif stream and not ended:
            body = sse(CUT_STREAM.body()) + sse("[DONE]")
            await send({"type": "http.response.body", "body": body.encode(), "more_body": False})


def _as_error_object(start: Message, text: bytes) -> JSONResponse:
    """Ray's plain-text refusal (its status, its headers such as Retry-After) with its text as an OpenAI error."""
    status = int(start["status"])
    err = APIError(status, text.decode("utf-8", "replace").strip() or f"Ray Serve answered {status}",
                   type="server_error" if status >= 500 else "invalid_request_error", code=f"http_{status}")
    headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in start.get("headers", ())
               if name.lower() not in (b"content-type", b"content-length")}
    return JSONResponse(err.body(), status_code=status, headers=headers)
