"""ray_proxy.py's middleware under uvicorn, around an ASGI app that fails as Ray Serve's proxy does when the replica
under a request dies (ray 2.60, proxy.py `send_request_to_replica`): it returns without a response message, or stops a
started stream without its last body message; and that refuses as Ray's proxy refuses on its own (http_util.py
`convert_object_to_asgi_messages`: a text/plain body). Each, every run, with the official openai client; the kill
test in test_ray_serve.py shows the first two through a real Ray proxy and a killed replica, where which of them
happens is up to timing. Needs no ray.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from specpack.serve.ray_proxy import ProxyErrorsMiddleware

COMPLETION = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "tiny",
              "choices": [{"index": 0, "text": "ok", "logprobs": None, "finish_reason": "stop"}]}


class LosingProxy:
    """Answers /v1/completions as Ray's proxy does: the first `unanswered` requests get no response message at all
    (a replica lost before it answered); a stream sends one chunk and stops (a replica lost mid-stream)."""

    def __init__(self) -> None:
        self.unanswered = 0
        self.calls = 0
        self.refuse = False  # answer as Ray's back-pressure does: 429, Retry-After, plain text

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls += 1
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if self.calls <= self.unanswered:
            return
        if self.refuse:
            await send({"type": "http.response.start", "status": 429, "headers": [
                (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"31"), (b"retry-after", b"2")]})
            await send({"type": "http.response.body", "body": b"Request dropped due to backpres", "more_body": True})
            await send({"type": "http.response.body", "body": b"sure"})
            return
        if json.loads(body).get("stream"):
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
            chunk = {**COMPLETION, "choices": [{**COMPLETION["choices"][0], "finish_reason": None}]}  # type: ignore[dict-item]
            await send({"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(),
                        "more_body": True})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps(COMPLETION).encode()})


@pytest.fixture(scope="module")
def proxy() -> Iterator[tuple[str, LosingProxy]]:
    inner = LosingProxy()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(ProxyErrorsMiddleware(inner), host="127.0.0.1", port=port,
                                           lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", inner
    server.should_exit = True
    thread.join(10)


def _client(url: str, **options: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=10, **options)


def test_no_response_becomes_a_retryable_openai_error(proxy: tuple[str, LosingProxy]) -> None:
    url, inner = proxy
    inner.calls, inner.unanswered = 0, 1
    with pytest.raises(openai.InternalServerError) as err:  # what Ray's uvicorn says alone: a plain-text 500
        _client(url, max_retries=0).completions.create(model="tiny", prompt="x", max_tokens=1)
    assert err.value.status_code == 503
    assert err.value.code == "replica_lost" and err.value.type == "server_error"
    assert err.value.response.headers["retry-after"] == "1"
    assert "stopped before answering" in err.value.message


def test_the_openai_client_retries_it(proxy: tuple[str, LosingProxy]) -> None:
    url, inner = proxy
    inner.calls, inner.unanswered = 0, 1
    start = time.monotonic()
    out = _client(url, max_retries=1).completions.create(model="tiny", prompt="x", max_tokens=1)
    assert out.choices[0].text == "ok" and inner.calls == 2
    assert time.monotonic() - start >= 1.0  # after Retry-After


def test_a_cut_stream_ends_with_an_error_event(proxy: tuple[str, LosingProxy]) -> None:
    url, inner = proxy
    inner.calls, inner.unanswered = 0, 0
    text = []
    with pytest.raises(openai.APIError) as err:  # alone: APIConnectionError (the body ends short)
        for chunk in _client(url, max_retries=0).completions.create(model="tiny", prompt="x", max_tokens=4,
                                                                     stream=True):
            text.append(chunk.choices[0].text)
    assert type(err.value) is openai.APIError and err.value.code == "replica_lost"
    assert "stopped mid-way" in err.value.message
    assert text == ["ok"]  # what arrived before the loss
    request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps({"stream": True}).encode())
    with urllib.request.urlopen(request, timeout=10) as raw:  # the whole body: it ends, and well-formed
        assert raw.read().decode().endswith("data: [DONE]\n\n")


def test_rays_own_refusal_becomes_an_openai_error_object(proxy: tuple[str, LosingProxy]) -> None:
    url, inner = proxy
    inner.calls, inner.unanswered, inner.refuse = 0, 0, True
    try:
        with pytest.raises(openai.RateLimitError) as err:
            _client(url, max_retries=0).completions.create(model="tiny", prompt="x", max_tokens=1)
    finally:
        inner.refuse = False
    assert err.value.status_code == 429 and err.value.code == "http_429"
    assert err.value.body == {"message": "Request dropped due to backpressure", "type": "invalid_request_error",
                              "param": None, "code": "http_429"}  # Ray's text, all of it
    assert err.value.response.headers["retry-after"] == "2"
    assert err.value.response.headers["content-type"] == "application/json"
