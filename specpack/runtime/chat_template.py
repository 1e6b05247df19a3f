"""Chat templates rendered the way transformers renders them, without transformers.

Mirrors `_compile_jinja_template` and `render_jinja_template` of transformers 5.x
(transformers/utils/chat_template_utils.py): an ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks,
the loopcontrols extension, a `tojson` filter that does not escape HTML, the globals `raise_exception`,
`strftime_now`, `dict` and `namespace`, and the same clean-up of the messages (None values dropped, reasoning
fields aliased, only plain JSON data reaches the template). A `{% generation %}` block renders its body:
transformers uses it only to mark assistant tokens.

The caller passes the variables transformers adds from the tokenizer (its `special_tokens_map`: bos_token,
eos_token, ...), and encodes the rendered text without adding special tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specpack.errors import SpecpackError

MIN_JINJA = (3, 1, 6)  # older versions have known sandbox escapes; templates come from the Hub, untrusted
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # the first is the one templates read


def render_chat(template: str, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool,
                variables: Mapping[str, Any], tools: Sequence[Mapping[str, Any]] | None = None,
                documents: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The text `template` renders for `messages`; `variables` are the special tokens and any template kwargs."""
    if not messages:
        raise SpecpackError("no messages to render", expected="at least one message", found="an empty list")
    chat = _alias_reasoning_fields(_plain_data(_normalize(messages)))
    compiled = compile_template(template)
    try:
        return compiled.render(messages=chat, tools=_plain_data(tools), documents=_plain_data(documents),
                               add_generation_prompt=add_generation_prompt, **_plain_data(dict(variables)))
    except jinja2.TemplateError as e:  # raise_exception(), undefined attributes, sandbox violations
        raise SpecpackError("the chat template refused these messages", expected="messages the template accepts",
                            found=f"{type(e).__name__}: {e}",
                            hint="check the roles and their order (many templates want user/assistant turns "
                                 "alternating, and the system message first)") from e


@lru_cache(maxsize=8)
def compile_template(template: str) -> jinja2.Template:
    """The template compiled in transformers' sandbox (cached, like transformers does)."""
    found = tuple(int(p) for p in jinja2.__version__.split(".")[:3] if p.isdigit())
    if found < MIN_JINJA:
        raise SpecpackError("jinja2 is too old to render chat templates safely",
                            expected="jinja2 >= " + ".".join(map(str, MIN_JINJA)), found=f"jinja2 {jinja2.__version__}",
                            hint="pip install -U jinja2")
    try:
        return _environment().from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise SpecpackError("the chat template does not parse", expected="a valid Jinja template",
                            found=f"line {e.lineno}: {e.message}",
                            hint="fix the template of the source model and export the pack again") from e


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters; transformers' does not
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` in templates, without attribute access to the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore-prefixed attributes (no way into CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's signature trick, so namespace(self=...) still works
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}.")


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body unchanged."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's own class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _normalize(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as dicts without None values: many templates render a literal "None" but handle a missing key."""
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise SpecpackError("a chat message is not a dict", expected='{"role": ..., "content": ...}',
                                found=f"message {i}: {message!r}")
        out.append({key: value for key, value in message.items() if value is not None})
    return out


def _alias_reasoning_fields(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fill `reasoning_content` (and `thinking`, read by gpt-oss templates) from whichever name the caller used."""
    aliased = []
    for message in chat:
        reasoning = next((message[key] for key in REASONING_FIELDS if message.get(key) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        aliased.append(message)
    return aliased


def _plain_data(value: Any) -> Any:
    """Only plain JSON-like data reaches the sandbox; any other object becomes an inert "<TypeName>" placeholder."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):  # subclasses (enums, ...) can carry methods: strip back to the base type
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain_data(k): _plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain_data(v) for v in value)
    if isinstance(value, np.generic):  # numpy scalars: np.bool_(False) must not become a truthy placeholder
        return _plain_data(value.item())
    return f"<{type(value).__name__}>"
