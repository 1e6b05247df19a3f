"""Raw HTTP/1.1 over loopback sockets, for what the openai client never sends (partial, malformed, half-closed
requests), and a log capture for the server's loggers (uvicorn's and specpack's do not propagate to pytest's).

    sock = connect(url); sock.sendall(post_head("/v1/completions", 100) + b"{")
    status, headers, error = answer(sock)        # error: the body's "error" object
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse


def address(url: str) -> tuple[str, int]:
    parts = urlparse(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def connect(url: str, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(address(url), timeout=timeout)


def post_head(path: str, length: int, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n"
            f"{extra}\r\n").encode()


def request(method: str, path: str, body: bytes = b"", extra: str = "") -> bytes:
    length = f"Content-Length: {len(body)}\r\n" if body or method == "POST" else ""
    return f"{method} {path} HTTP/1.1\r\nHost: test\r\n{length}{extra}\r\n".encode() + body


def post(url: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    """POST a JSON body with http.client: (status, the JSON answer)."""
    conn = http.client.HTTPConnection(*address(url), timeout=30)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def answer(sock: socket.socket) -> tuple[int, dict[str, str], dict[str, Any]]:
    """One response read off the socket: (status, lower-cased headers, the JSON body's "error" or the whole body)."""
    resp = http.client.HTTPResponse(sock)
    resp.begin()
    body = resp.read()
    payload = json.loads(body) if body else {}
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload.get("error", payload)


def closed(sock: socket.socket, timeout: float = 5.0) -> bool:
    """Whether the server closed the connection (end of input, or a reset) within `timeout`."""
    sock.settimeout(timeout)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def is_error_object(error: dict[str, Any]) -> bool:
    return set(error) == {"message", "type", "param", "code"} and "Traceback" not in error["message"]


@contextmanager
def captured_logs(*names: str) -> Iterator[list[logging.LogRecord]]:
    """Every record (INFO and up) the named loggers emit inside the block."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler, loggers = Keep(logging.INFO), [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)
