"""How the end of a client's input is read: mid-body it is a client that left (one log line, no traceback); after
a whole request that said `Connection: close` it is a half-close, and the answer is still written."""

from __future__ import annotations

import json
import socket
import time

import openai
import pytest
from conftest import MODEL, Live
from raw_http import answer, captured_logs, connect, post_head, request
from serve_harness import metric, wait_until

PROMPT = "def fibonacci(n):\n    "
LOGGERS = ("uvicorn.error", "specpack", "asyncio")


def test_a_client_that_leaves_mid_body_is_one_log_line(live: Live) -> None:
    """The finding: a 48-line traceback per client that disconnected while sending its body."""
    with captured_logs(*LOGGERS) as records:
        with connect(live.url) as sock:
            sock.sendall(post_head("/v1/completions", 1000) + b'{"model": "tiny", "prompt": "')
            time.sleep(0.1)
        assert wait_until(lambda: bool(records), timeout=2)
        time.sleep(0.2)  # anything else it would log
    assert len(records) == 1, [r.getMessage() for r in records]
    assert records[0].exc_info is None and "left while sending its request body" in records[0].getMessage()


@pytest.mark.parametrize("version", ["HTTP/1.1", "HTTP/1.0"])
def test_a_client_that_half_closes_after_its_request_gets_the_answer(live: Live, version: str) -> None:
    """`Connection: close` (or HTTP/1.0): the client sends nothing more; shutdown(SHUT_WR) is not leaving."""
    body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}).encode()
    raw = request("POST", "/v1/completions", body, extra="Content-Type: application/json\r\nConnection: close\r\n")
    with connect(live.url) as sock:
        sock.sendall(raw.replace(b"HTTP/1.1", version.encode(), 1))
        sock.shutdown(socket.SHUT_WR)
        status, _, payload = answer(sock)
    assert status == 200, payload
    assert payload["choices"][0]["text"] == live.reference.generate(PROMPT, 8).text


def test_end_of_input_after_a_keep_alive_request_is_a_client_that_left(client: openai.OpenAI, live: Live) -> None:
    """A keep-alive request followed by end of input is what an openai client that gave up sends: its decode is
    cancelled (a half-close and a close look the same on the wire)."""
    scrape = client.with_options(base_url=live.url)
    name = 'specpack_requests_cancelled_total{reason="disconnect"}'
    before = metric(scrape.get("/metrics", cast_to=str), name)
    live.pack.delay = 0.05
    body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 200}).encode()
    with connect(live.url) as sock:
        sock.sendall(request("POST", "/v1/completions", body, extra="Content-Type: application/json\r\n"))
        time.sleep(0.2)
        sock.shutdown(socket.SHUT_WR)
        assert wait_until(lambda: metric(scrape.get("/metrics", cast_to=str), name) == before + 1, timeout=5)
    assert live.pack.pieces < 60
