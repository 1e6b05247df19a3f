"""A request body, read within the limits that keep a slow or huge upload from holding the server.

    413  its Content-Length, or the bytes received so far, over --max-body-bytes (never read whole first)
    408  the whole body not in within --read-timeout of the request head
    503  the server began shutting down while the body was arriving
    499  the client left mid-body: one log line, no traceback (nobody reads the answer)

The rest of the body is never read: after the answer the connection closes (connection.py, a lingering close that
lets the client finish sending and discards it).
"""

from __future__ import annotations

import asyncio
import logging

from starlette.requests import ClientDisconnect, Request

from specpack.serve.api_errors import APIError
from specpack.serve.wire import request_timeout, shutting_down

log = logging.getLogger("specpack.serve")


async def read_body(request: Request, limit: int, timeout_s: float, stopping: asyncio.Event) -> bytes:
    """The whole body, or an APIError (above) as soon as one applies."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(f"{int(declared)} bytes", limit)
    reader = asyncio.ensure_future(_read(request, limit))
    stop = asyncio.ensure_future(stopping.wait())
    try:
        done, _ = await asyncio.wait({reader, stop}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        reader.cancel()
        stop.cancel()
    if reader in done:
        return reader.result()
    if stop in done:
        raise shutting_down()
    raise request_timeout("body", timeout_s)


async def _read(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(f"more than {limit} bytes", limit)
            chunks.append(chunk)
    except ClientDisconnect:
        client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
        log.info("%s left while sending its request body (%d bytes received)", client, size)
        raise APIError(499, "the client closed the request", code="client_closed_request") from None
    return b"".join(chunks)


def too_large(found: str, limit: int) -> APIError:
    return APIError(413, f"the request body is too large: {found}; this server accepts up to {limit} bytes "
                         "(`specpack serve --max-body-bytes`)", code="request_too_large")
