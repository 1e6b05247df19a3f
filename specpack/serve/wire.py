"""An error object as raw HTTP/1.1 bytes, for answers the connection itself gives before (or instead of) the app:
a request head that took too long (408), a protocol error (400), too many connections (503).

These answers always close the connection (`connection: close`): the request they answer was not read to its end.
"""

from __future__ import annotations

import http
import json

from specpack.serve.api_errors import APIError


def raw_error(err: APIError) -> bytes:
    """`HTTP/1.1 <status>` with the error object as a JSON body and `connection: close`."""
    body = json.dumps(err.body()).encode()
    try:
        phrase = http.HTTPStatus(err.status).phrase
    except ValueError:
        phrase = ""
    head = [f"HTTP/1.1 {err.status} {phrase}", "content-type: application/json",
            f"content-length: {len(body)}", "connection: close",
            *(f"{name}: {value}" for name, value in err.headers.items() if name.lower() != "connection")]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def request_timeout(what: str, seconds: float) -> APIError:
    return APIError(408, f"the request {what} did not arrive within {seconds:g} s (`specpack serve --read-timeout`)",
                    code="request_timeout")


def too_many_connections(limit: int) -> APIError:
    return APIError(503, f"too many connections: this server keeps at most {limit} open (`specpack serve "
                         "--max-connections`); retry later", type="server_error", code="too_many_connections",
                    headers={"Retry-After": "1"})


def invalid_http(reason: str) -> APIError:
    return APIError(400, f"invalid HTTP request: {reason}", code="invalid_http_request")


def shutting_down() -> APIError:
    return APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
