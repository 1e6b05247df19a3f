"""Slow clients cannot hold the server: request heads and bodies have a read deadline (408, then closed), and
connections past --max-connections are answered 503. Loopback only, a bounded number of sockets, done in ~1 s."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from typing import Any

import openai
from conftest import MODEL, Live
from raw_http import answer, closed, connect, is_error_object, post_head, request
from serve_harness import wait_until

from specpack.serve.app import build_app
from specpack.serve.config import ServeConfig
from specpack.serve.server import serve_in_thread

READ_TIMEOUT = 0.5


@contextmanager
def server(live: Live, **options: Any) -> Iterator[str]:
    config = ServeConfig(live.pack_dir, model_name=MODEL, **options)
    with serve_in_thread(build_app(live.pack, config)) as url:
        yield url


def health(url: str) -> int:
    with connect(url) as sock:
        sock.sendall(request("GET", "/health"))
        return answer(sock)[0]


def test_partial_heads_and_bodies_are_answered_408_and_closed(live: Live) -> None:
    """The finding: 300 connections that sent part of a head or body stayed open past 75 s."""
    with server(live, read_timeout_s=READ_TIMEOUT) as url, ExitStack() as stack:
        started = time.monotonic()
        heads = [stack.enter_context(connect(url)) for _ in range(8)]
        bodies = [stack.enter_context(connect(url)) for _ in range(8)]
        idle = [stack.enter_context(connect(url)) for _ in range(4)]
        for sock in heads:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Le")
        for sock in bodies:
            sock.sendall(post_head("/v1/completions", 100) + b'{"model": ')
        drip_head, drip_body = connect(url), connect(url)  # one byte every 0.1 s never resets the deadline
        stack.enter_context(drip_head)
        stack.enter_context(drip_body)
        drip_head.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nX-Drip: ")
        drip_body.sendall(post_head("/v1/completions", 10_000))
        for _ in range(int(READ_TIMEOUT / 0.1) + 3):
            for sock in (drip_head, drip_body):
                with suppress(OSError):  # closed by the server: what the test wants
                    sock.sendall(b"x")
            time.sleep(0.1)

        for sock, what in [*((s, "head") for s in [*heads, drip_head]), *((s, "body") for s in [*bodies, drip_body])]:
            status, _, error = answer(sock)
            assert status == 408 and is_error_object(error), (what, status, error)
            assert error["code"] == "request_timeout" and what in error["message"] and "--read-timeout" in error["message"]
            assert closed(sock)
        for sock in idle:  # nothing sent: closed without an answer
            assert closed(sock)
        assert time.monotonic() - started < READ_TIMEOUT + 2.0

        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=10) as client:
            assert client.completions.create(model=MODEL, prompt="hi", max_tokens=2).choices[0].text is not None


def test_connections_past_max_connections_get_503_error_objects(live: Live) -> None:
    """uvicorn's limit_concurrency answers 503 in plain text; this cap answers an error object, at once."""
    with server(live, max_connections=4, read_timeout_s=5) as url, ExitStack() as stack:
        held = [stack.enter_context(connect(url)) for _ in range(4)]
        time.sleep(0.1)  # accepted
        extra = stack.enter_context(connect(url))
        extra.sendall(request("GET", "/health"))
        status, headers, error = answer(extra)
        assert status == 503 and is_error_object(error) and error["code"] == "too_many_connections", error
        assert "--max-connections" in error["message"] and headers["retry-after"] == "1"
        assert closed(extra)

        held[0].sendall(request("GET", "/health"))  # the connections within the cap are still served
        assert answer(held[0])[0] == 200
        for sock in held[1:]:
            sock.close()
        assert wait_until(lambda: health(url) == 200, timeout=5)  # freed places are taken again
