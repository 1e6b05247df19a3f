"""What a client sees when a Ray Serve replica dies under its request: an OpenAI error, never a bare 500 or a cut body.

Ray Serve's HTTP proxy (ray 2.60, `ray/serve/_private/proxy.py`, `send_request_to_replica`) catches a replica's
death (RayActorError) and, before any response message, sends nothing at all: its uvicorn then answers a plain-text
500; a stream that already started just stops (no last chunk), and the connection closes mid-body. This ASGI
middleware runs inside the proxy, around its app, and finishes those responses the way `specpack serve` finishes its
own (app.py: an error object; inside a started stream, an error event, then `data: [DONE]`):

    the proxy returned ── no http.response.start sent ──────────> 503 OpenAI error object, Retry-After: 1
                     └─── an event stream started, not ended ───> data: {"error": ...}  data: [DONE]  (body ended)
                     └─── anything else (ended, or not a stream) ─> as the proxy left it

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
    return [Middleware(ReplicaLossMiddleware)]


class ReplicaLossMiddleware:
    """Finishes a response that Ray's proxy left unstarted or cut (the module's docstring says how)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = ended = stream = False

        async def watch(message: Message) -> None:
            nonlocal started, ended, stream
            if message["type"] == "http.response.start":
                started = True
                stream = any(name.lower() == b"content-type" and value.startswith(b"text/event-stream")
                             for name, value in message.get("headers", ()))
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                ended = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:  # the proxy's own failure: the client still gets an answer below
            log.exception("Ray Serve's proxy failed on %s", scope.get("path"))
        if not started:
            response = JSONResponse(UNANSWERED.body(), status_code=UNANSWERED.status, headers=UNANSWERED.headers)
            await response(scope, receive, send)
        elif stream and not ended:
            body = sse(CUT_STREAM.body()) + sse("[DONE]")
            await send({"type": "http.response.body", "body": body.encode(), "more_body": False})
