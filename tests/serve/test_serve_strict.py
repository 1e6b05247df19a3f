"""Requests are read strictly: a neutral value must have its JSON type, keys may not repeat, framing may not be
ambiguous, and every refusal at the HTTP level is an OpenAI error object (uvicorn's are plain text)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import MODEL, Live
from raw_http import answer, closed, connect, is_error_object, post


def completion(**fields: Any) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2, **fields}).encode()


@pytest.mark.parametrize(("field", "value"), [("n", True), ("n", 1.0), ("logprobs", 0.0), ("best_of", True),
                                               ("echo", 0), ("presence_penalty", False)])
def test_a_neutral_value_of_another_json_type_is_refused(live: Live, field: str, value: Any) -> None:
    """`n: true` and `logprobs: 0.0` were accepted: Python's True == 1 and 0.0 == 0."""
    status, payload = post(live.url, "/v1/completions", completion(**{field: value}))
    assert status == 400 and payload["error"]["param"] == field, payload
    assert "not supported" in payload["error"]["message"]


@pytest.mark.parametrize("fields", [{"n": 1}, {"logprobs": 0}, {"logprobs": False}, {"presence_penalty": 0.0},
                                    {"frequency_penalty": 0}, {"logit_bias": {}}, {"n": None}])
def test_the_neutral_values_themselves_are_accepted(live: Live, fields: dict[str, Any]) -> None:
    status, payload = post(live.url, "/v1/completions", completion(**fields))
    assert status == 200, payload


@pytest.mark.parametrize(("path", "body", "key"), [
    ("/v1/completions", b'{"model": "tiny", "prompt": "hi", "max_tokens": 2, "max_tokens": 4}', "max_tokens"),
    ("/v1/completions", b'{"model": "tiny", "model": "tiny", "prompt": "hi"}', "model"),
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "a", "content": "b"}]}',
     "content"),
])
def test_repeated_keys_are_refused(live: Live, path: str, body: bytes, key: str) -> None:
    status, payload = post(live.url, path, body)
    assert status == 400 and payload["error"]["code"] == "invalid_json", payload
    assert f'duplicate key "{key}"' in payload["error"]["message"]


def test_content_length_with_transfer_encoding_is_refused_and_closed(live: Live) -> None:
    body = completion()
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    with connect(live.url) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
        status, headers, error = answer(sock)
        assert status == 400 and is_error_object(error) and error["code"] == "invalid_http_request", error
        assert "Content-Length and Transfer-Encoding" in error["message"]
        assert headers["connection"] == "close" and closed(sock)


@pytest.mark.parametrize(("raw", "status"), [
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET /health HTTP/1.1\r\nHost: test\r\nNo colon here\r\n\r\n", 400),
    (b"GET /health HTTP/1.1\r\nHost: test\r\nX-Big: " + b"a" * 300_000 + b"\r\n\r\n", 431),
    (b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
])
def test_protocol_errors_are_error_objects(live: Live, raw: bytes, status: int) -> None:
    with connect(live.url) as sock:
        sock.sendall(raw)
        got, headers, error = answer(sock)
        assert got == status and is_error_object(error) and error["code"] == "invalid_http_request", (got, error)
        assert headers["content-type"] == "application/json" and closed(sock)
