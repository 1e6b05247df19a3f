"""Bad requests get a 4xx with an OpenAI error object, never a 500 or a traceback."""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any
from urllib.parse import urlparse

import openai
import pytest
from conftest import MODEL, Live

from specpack.serve.config import ServeConfig


def post(live: Live, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    url = urlparse(live.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    status, payload = resp.status, json.loads(resp.read())
    conn.close()
    return status, payload


def assert_error_object(err: openai.APIStatusError, status: int, param: str | None, *words: str) -> None:
    assert err.status_code == status
    assert isinstance(err.body, dict) and set(err.body) == {"message", "type", "param", "code"}
    assert err.param == param
    message = err.body["message"]
    assert "Traceback" not in message
    for word in words:
        assert word in message, message


def test_unknown_model(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-5", prompt="hi", max_tokens=4)
    assert_error_object(info.value, 404, "model", "gpt-5", MODEL)
    assert info.value.code == "model_not_found"


def test_missing_messages(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=openai.omit)
    assert_error_object(info.value, 400, "messages", "missing", "messages")


@pytest.mark.parametrize("max_tokens", [-1, 0])
def test_max_tokens_below_one(client: openai.OpenAI, max_tokens: int) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=max_tokens)
    assert_error_object(info.value, 400, "max_tokens", "invalid max_tokens", "an integer in 1..")


@pytest.mark.parametrize("chat", [False, True])
def test_prompt_longer_than_the_pack_allows(client: openai.OpenAI, live: Live, chat: bool) -> None:
    limit = live.reference.manifest.max_len
    words = " ".join(["hello"] * (limit + 10))
    with pytest.raises(openai.BadRequestError) as info:
        if chat:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": words}])
        else:
            client.completions.create(model=MODEL, prompt=words, max_tokens=4)
    assert_error_object(info.value, 400, "messages" if chat else "prompt", f"maximum context length is {limit} tokens")
    assert info.value.code == "context_length_exceeded"


def test_prompt_plus_max_tokens_over_the_limit(client: openai.OpenAI, live: Live) -> None:
    limit = live.reference.manifest.max_len
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=limit)
    assert_error_object(info.value, 400, "prompt", f"{limit} tokens", f"{limit} for the completion")


@pytest.mark.parametrize("body", [b"{not json", b"", b"[1, 2]", b'"text"', b"[" * 100_000 + b"]" * 100_000,
                                  b'{"model": "tiny", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"])
def test_malformed_json(live: Live, body: bytes) -> None:
    status, payload = post(live, "/v1/completions", body)
    assert status == 400
    assert payload["error"]["type"] == "invalid_request_error" and payload["error"]["code"] == "invalid_json"


@pytest.mark.parametrize(("field", "value"), [("n", 2), ("logprobs", 3), ("best_of", 2), ("echo", True),
                                               ("presence_penalty", 0.5), ("logit_bias", {"1": 5})])
def test_unsupported_completion_options(client: openai.OpenAI, field: str, value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=4, **{field: value})
    assert_error_object(info.value, 400, field, "not supported")


@pytest.mark.parametrize(("field", "value"), [("n", 2), ("logprobs", True),
                                               ("tools", [{"type": "function", "function": {"name": "f"}}]),
                                               ("response_format", {"type": "json_object"})])
def test_unsupported_chat_options(client: openai.OpenAI, field: str, value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       **{field: value})
    assert_error_object(info.value, 400, field, "not supported")


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "hi", "temperature": -1}, "temperature"),
    ({"prompt": "hi", "top_p": 0}, "top_p"),
    ({"prompt": "hi", "stop": ""}, "stop"),
    ({"prompt": "hi", "seed": -3}, "seed"),
    ({"prompt": "hi", "frobnicate": 1}, "frobnicate"),
    ({"prompt": ["one", "two"]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": [10**9]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": "hi", "max_tokens": True}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 2.5}, "max_tokens"),
    ({"prompt": "hi", "top_k": -5}, "top_k"),
    ({"prompt": "hi", "seed": 2**70}, "seed"),
    ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": "hi", "stream": "yes"}, "stream"),
])
def test_invalid_values_name_the_field(live: Live, body: dict[str, Any], param: str) -> None:
    status, payload = post(live, "/v1/completions", json.dumps({"model": MODEL, **body}).encode())
    assert status == 400, payload
    assert payload["error"]["param"] == param, payload
    assert param in payload["error"]["message"] and "Traceback" not in payload["error"]["message"]


def test_chat_content_must_be_text(live: Live) -> None:
    image = [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    status, payload = post(live, "/v1/chat/completions",
                           json.dumps({"model": MODEL, "messages": [{"role": "user", "content": image}]}).encode())
    assert status == 400 and payload["error"]["param"] == "messages.0.content", payload
    assert "Input should be 'text'" in payload["error"]["message"]


def test_unknown_route_and_method_are_error_objects(live: Live) -> None:
    url = urlparse(live.url)
    for method, path, status in [("GET", "/v2/nothing", 404), ("GET", "/v1/completions", 405)]:
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
        conn.request(method, path)
        resp = conn.getresponse()
        assert resp.status == status
        assert "message" in json.loads(resp.read())["error"]
        conn.close()


def test_a_body_over_max_body_bytes_is_413_before_it_is_read_whole(live: Live) -> None:
    """A huge body (a 60 MB prompt took 2.5 min and 15 GB to tokenize) is refused from its Content-Length, or while
    a chunked one arrives, with an error object; the server answers the next request."""
    limit = ServeConfig(live.pack_dir).max_body_bytes  # the live server's: the default
    prompt = "a " * (limit // 2 + 16)
    status, payload = post(live, "/v1/completions", json.dumps({"model": MODEL, "prompt": prompt}).encode())
    assert status == 413 and payload["error"]["code"] == "request_too_large", payload
    assert str(limit) in payload["error"]["message"] and "--max-body-bytes" in payload["error"]["message"]

    url = urlparse(live.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    body = json.dumps({"model": MODEL, "prompt": prompt}).encode()
    chunks = (body[i:i + 65536] for i in range(0, len(body), 65536))
    conn.request("POST", "/v1/completions", chunks, {"Content-Type": "application/json"}, encode_chunked=True)
    resp = conn.getresponse()
    assert resp.status == 413 and json.loads(resp.read())["error"]["code"] == "request_too_large"
    conn.close()

    status, payload = post(live, "/v1/completions", json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode())
    assert status == 200, payload


def test_tokenizing_a_prompt_does_not_block_the_event_loop(live: Live) -> None:
    """Encoding runs in a worker thread: /health answers while a request's prompt is being tokenized."""
    entered, release = threading.Event(), threading.Event()
    encode = live.pack.encode

    def slow_encode(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(30)
        return encode(*args, **kwargs)

    live.pack.encode = slow_encode  # type: ignore[method-assign]
    try:
        results: list[tuple[int, dict[str, Any]]] = []
        body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode()
        worker = threading.Thread(target=lambda: results.append(post(live, "/v1/completions", body)))
        worker.start()
        assert entered.wait(30)
        url = urlparse(live.url)
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=5)
        conn.request("GET", "/health")
        assert conn.getresponse().status == 200  # a blocked event loop would time out here
        conn.close()
    finally:
        release.set()
        del live.pack.encode
    worker.join(30)
    assert results and results[0][0] == 200, results


@pytest.mark.parametrize("value", [0, 10**6])
def test_max_completion_tokens_errors_name_that_field(live: Live, value: int) -> None:
    """A chat request that sets max_completion_tokens is told about max_completion_tokens, not max_tokens."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": value}
    status, payload = post(live, "/v1/chat/completions", json.dumps(body).encode())
    assert status == 400 and payload["error"]["param"] == "max_completion_tokens", payload
    assert "invalid max_completion_tokens" in payload["error"]["message"]
    assert "max_tokens" not in payload["error"]["message"].replace("max_completion_tokens", "")


@pytest.mark.parametrize("stream", [None, False])
@pytest.mark.parametrize("chat", [False, True])
def test_stream_options_without_stream(live: Live, chat: bool, stream: bool | None) -> None:
    """As OpenAI: stream_options is only allowed with stream true (null stream_options stays fine)."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2, "stream_options": {"include_usage": True},
                            **({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"})}
    if stream is not None:
        body["stream"] = stream
    path = "/v1/chat/completions" if chat else "/v1/completions"
    status, payload = post(live, path, json.dumps(body).encode())
    assert status == 400, payload
    assert payload["error"]["param"] == "stream_options" and payload["error"]["type"] == "invalid_request_error"
    assert "only allowed when 'stream' is enabled" in payload["error"]["message"]
    status, payload = post(live, path, json.dumps({**body, "stream_options": None}).encode())
    assert status == 200, payload


def test_stream_options_without_stream_openai_client(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, stream_options={"include_usage": True})
    assert_error_object(info.value, 400, "stream_options", "'stream_options'", "'stream'")


def test_retrieve_an_unknown_model(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-5")
    assert_error_object(info.value, 404, "model", "gpt-5", MODEL)
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve(f"{MODEL}/extra")
