"""Response bodies and stream chunks in OpenAI's shapes, for both endpoints.

Extension: `speculation` ({drafter, k, alpha, tau, steps, proposed, accepted, tokens_per_s, ttft_s}, from the runtime's
statistics) on every response and on a stream's last chunk (a stop string ends the decode through the runtime's
cancel event, so its statistics are there too).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from specpack.serve.decoder import Done

SPECULATION_KEYS = ("drafter", "k", "alpha", "tau", "steps", "proposed", "accepted", "tokens_per_s", "ttft_s")


def usage(done: Done) -> dict[str, int]:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def speculation(done: Done) -> dict[str, Any]:
    return {key: done.stats.get(key) for key in SPECULATION_KEYS}


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


class Shapes:
    """The bodies of one request: a text completion (chat=False) or a chat completion."""

    def __init__(self, model: str, *, chat: bool) -> None:
        self.chat, self.model = chat, model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def response(self, text: str, done: Done) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": done.finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": done.finish_reason}
        body = self._envelope("chat.completion" if self.chat else "text_completion", [choice])
        return {**body, "usage": usage(done), "speculation": speculation(done)}

    def opening(self) -> list[dict[str, Any]]:
        """Chunks before any text: a chat stream starts with the assistant's role."""
        return [self._chunk({"role": "assistant", "content": ""}, None)] if self.chat else []

    def piece(self, text: str) -> dict[str, Any]:
        return self._chunk({"content": text} if self.chat else text, None)

    def closing(self, done: Done, include_usage: bool) -> list[dict[str, Any]]:
        """The chunk with the finish reason (and the statistics), then the usage chunk if asked for."""
        last = {**self._chunk({} if self.chat else "", done.finish_reason), "speculation": speculation(done)}
        if not include_usage:
            return [last]
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return [last, {**self._envelope(obj, []), "usage": usage(done)}]

    def _chunk(self, delta: dict[str, Any] | str, finish_reason: str | None) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish_reason}
        return self._envelope("text_completion", [choice])
