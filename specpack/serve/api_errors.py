"""OpenAI-style error objects: `{"error": {"message", "type", "param", "code"}}` with a 4xx/5xx status.

Every refusal the server makes is an APIError; a SpecpackError from the runtime (a bad prompt, a template
that refuses the messages) becomes a 400 with its message; request-model validation errors name the field.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from specpack.errors import SpecpackError


class APIError(Exception):
    """A refusal with an HTTP status and an OpenAI error object."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


# specpack.validation's names for the request fields OpenAI names otherwise
VALIDATION_NAMES = {"max_new_tokens": "max_tokens"}


def from_specpack(err: SpecpackError, param: str | None = None, code: str | None = None,
                  names: dict[str, str] | None = None) -> APIError:
    """A runtime refusal (what / expected / found / hint) as a 400, in OpenAI's field names (`names` overrides
    them with the field the request used: max_completion_tokens)."""
    message = " ".join(str(err).split())
    for name, api_name in {**VALIDATION_NAMES, **(names or {})}.items():
        message = message.replace(name, api_name)
    return bad_request(message, param=param, code=code)


def request_param(err: SpecpackError, names: dict[str, str] | None = None) -> str | None:
    """The request field a validation error is about ("invalid top_p" -> "top_p"), in OpenAI's names."""
    name = err.what.removeprefix("invalid ") if err.what.startswith("invalid ") else None
    return {**VALIDATION_NAMES, **(names or {})}.get(name, name) if name is not None else None


def from_validation(err: ValidationError) -> APIError:
    """The first field pydantic refused, named as OpenAI does (`messages.0.role`); where the field is a union
    (`prompt`: text, ids, ...), the message says why each form was refused."""
    errors = err.errors(include_url=False)
    first = errors[0]
    kind = first["type"]
    if kind == "json_invalid":
        return bad_request(f"the request body is not valid JSON: {first['msg']}", code="invalid_json")
    if kind == "model_type" and not first["loc"]:
        return bad_request("the request body must be a JSON object", code="invalid_json")
    param, _ = _split_loc(first["loc"])
    if kind == "missing" and not _:
        return bad_request(f"missing required parameter: '{param}'", param=param, code="missing_required_parameter")
    if kind == "extra_forbidden" and not _:
        return bad_request(f"unrecognized request argument supplied: {param}", param=param, code="unknown_parameter")
    reasons = []
    for e in errors:
        where, branch = _split_loc(e["loc"])
        if where == param:
            reasons.append(f"{branch}: {e['msg']}" if branch else e["msg"])
    shown = "; ".join(dict.fromkeys(reasons[:SHOWN_REASONS]))
    return bad_request(f"invalid value for '{param}': {shown}", param=param, code="invalid_value")


SHOWN_REASONS = 4
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|constrained-[\w-]+|[\w-]+\[.*\])$")  # pydantic's union members


def _split_loc(loc: tuple[int | str, ...]) -> tuple[str, str]:
    """(the request field, the union member and the path inside it) of an error location:
    ('messages', 0, 'content', 'list[TextPart]', 0, 'type') -> ('messages.0.content', 'list[TextPart].0.type')."""
    parts = [str(part) for part in loc]
    cut = next((i for i, part in enumerate(parts) if _UNION_TAG.match(part)), len(parts))
    return ".".join(parts[:cut]), ".".join(parts[cut:])
