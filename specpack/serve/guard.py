"""Requests whose framing is ambiguous are refused before any route runs.

Both Content-Length and Transfer-Encoding: h11 follows Transfer-Encoding, a proxy in front may follow
Content-Length, and the two would then disagree on where the next request starts (request smuggling; RFC 9112
section 6.3 lets a server refuse such a message). Answered 400 with an error object; the connection is closed.
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from specpack.serve.wire import invalid_http


class FramingGuard:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            names = {name for name, _ in scope["headers"]}
            if b"content-length" in names and b"transfer-encoding" in names:
                err = invalid_http("both Content-Length and Transfer-Encoding are set; send one")
                await JSONResponse(err.body(), status_code=err.status, headers={"Connection": "close"})(scope, receive, send)
                return
        await self.app(scope, receive, send)
