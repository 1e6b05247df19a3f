"""Request bodies of the OpenAI API that the server accepts, as pydantic models.

Unknown fields are refused (as OpenAI does), and so are repeated keys. Fields of the API that specpack does not
implement are accepted only at their neutral value (`n` 1, `logprobs` off, penalties 0, ...), of the same JSON
type (`n: true` and `logprobs: 0.0` are refused): anything else is a 400 that names the field, never silently
ignored. `stream_options` only with `stream: true` (as OpenAI). Extensions: `top_k` (0 or -1 disables, as vLLM)
`drafter` ("model" | "ngram": who drafts for this request; default: `specpack serve --drafter`, else the
pack's own) and `tree` ("auto" | "off" | N nodes, as Pack.generate's; default: `specpack serve --tree`).

These models check the JSON types only; the values (ranges of max_tokens, temperature, top_p, top_k, seed) are
checked by specpack.validation, as for Pack.generate, so both refuse the same requests.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from specpack.serve.api_errors import bad_request

# field -> its values that mean "off": any other value is refused (specpack does not implement it)
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "suffix": (None, ""),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "parallel_tool_calls": (None, False),
    "response_format": (None, {"type": "text"}),
}


NonEmpty = Annotated[str, Field(min_length=1)]


def is_neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    """Equal to one of the neutral values and of its JSON type: `true` is not 1 and `0.0` is not 0 (Python's == says
    they are); a container's items are compared the same way."""
    return any(_same(value, v) for v in neutral)


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def check_unique_keys(body: bytes) -> None:
    """Refuse a body whose objects repeat a key (`{"n": 1, "n": 5}`): JSON parsers disagree on which one counts, so a
    proxy and this server could read different requests. Run after pydantic accepted the body (so its nesting is
    bounded)."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise bad_request(f"duplicate key {json.dumps(key)} in the request body", code="invalid_json")
            out[key] = value
        return out

    try:
        json.loads(body, object_pairs_hook=unique)
    except (ValueError, RecursionError) as err:
        raise bad_request(f"the request body is not valid JSON: {err}", code="invalid_json") from None


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Request):
    include_usage: bool = False


class SamplingRequest(_Request):
    """What both endpoints share."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None                 # -1 or 0: off
    drafter: str | None = None               # extension: "model" | "ngram" (checked against the pack's drafters)
    tree: str | int | None = None            # extension: "auto" | "off" | N nodes (checked against the pack's trees)
    seed: int | None = None
    stop: NonEmpty | Annotated[list[NonEmpty], Field(max_length=4)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # accepted only at their neutral values (NEUTRAL)
    n: Any = None
    logprobs: Any = None
    top_logprobs: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    logit_bias: Any = None

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def check_supported(self) -> None:
        """Refuse any unimplemented field set to a value that would change the output, and stream_options without
        stream (OpenAI refuses it too)."""
        if self.stream_options is not None and not self.stream:
            raise bad_request("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                              param="stream_options", code="invalid_value")
        for name, neutral in NEUTRAL.items():
            value = getattr(self, name, None)
            if not is_neutral(value, neutral):
                shown = ", ".join("null" if v is None else json.dumps(v) for v in neutral)
                raise bad_request(f"'{name}' = {json.dumps(value)} is not supported by this server (supported: {shown})",
                                  param=name, code="unsupported_value")


Prompt = str | Annotated[list[str], Field(min_length=1)] | Annotated[list[int], Field(min_length=1)] | \
    Annotated[list[list[int]], Field(min_length=1)]


class CompletionRequest(SamplingRequest):
    prompt: Prompt
    best_of: Any = None
    echo: Any = None
    suffix: Any = None


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The content as one string (text parts joined with newlines, as vLLM does)."""
        if isinstance(self.content, list):
            return "\n".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: int | None = None  # the newer name of max_tokens
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: Any = None
    response_format: Any = None
