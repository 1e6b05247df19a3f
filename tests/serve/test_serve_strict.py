"""Requests are read strictly: a neutral value must have its JSON type, and keys may not repeat."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import MODEL, Live
from raw_http import post


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
