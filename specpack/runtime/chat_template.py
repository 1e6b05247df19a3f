"""Chat templates rendered the way transformers renders them, without transformers.

Mirrors `_compile_jinja_template` and `render_jinja_template` of transformers 5.x
(transformers/utils/chat_template_utils.py): an ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks,
the loopcontrols extension, a `tojson` filter that does not escape HTML, the globals `raise_exception`,
`strftime_now`, `dict` and `namespace`, and the same clean-up of the messages (None values dropped, reasoning
fields aliased, only plain JSON data reaches the template). A `{% generation %}` block renders its body:
transformers uses it only to mark assistant tokens.

The caller passes the variables transformers adds from the tokenizer (its `special_tokens_map`: bos_token,
eos_token, ...), and encodes the rendered text without adding special tokens.

A template is untrusted input, so rendering is bounded (RenderLimits): a deadline checked on every loop item,
call and output piece; an output-size limit; no single operation may build a value past that size, refused
before it allocates (string/list `*` and `+`, `~`, `**`, padding and format widths, filters and the str methods
that grow their input, estimated by runtime/template_sizes.py; the text of a macro, call or set block, joined
through the environment's `concat`; every value written out, through `finalize`); and everything built in one
render counts against a total (`built`), so recursion or loops cannot hold more than that in memory.
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, NoReturn

import jinja2
import jinja2.compiler
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specpack.errors import SpecpackError
from specpack.runtime.template_sizes import bounded_items, filter_size, format_size, method_size, size_of

MIN_JINJA = (3, 1, 6)  # older versions have known sandbox escapes; templates come from the Hub, untrusted
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # the first is the one templates read


@dataclass(frozen=True)
class RenderLimits:
    """Bounds on rendering one chat: real templates take milliseconds and write a few KB per message."""

    seconds: float = 2.0
    chars: int = 1 << 22  # output characters, and the size of any one string or list a template builds
    built: int = 1 << 26  # characters (or items) of every string and list the template builds, in all


def render_chat(template: str, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool,
                variables: Mapping[str, Any], tools: Sequence[Mapping[str, Any]] | None = None,
                documents: Sequence[Mapping[str, Any]] | None = None, limits: RenderLimits = RenderLimits()) -> str:
    """The text `template` renders for `messages`; `variables` are the special tokens and any template kwargs."""
    if not messages:
        raise SpecpackError("no messages to render", expected="at least one message", found="an empty list")
    chat = _alias_reasoning_fields(_plain_data(_normalize(messages)))
    budget = _Budget(limits)
    token = _BUDGET.set(budget)  # compiling folds constant expressions (filters included): bounded too
    try:
        compiled = compile_template(template)
        pieces = compiled.generate(messages=chat, tools=_plain_data(tools), documents=_plain_data(documents),
                                   add_generation_prompt=add_generation_prompt, **_plain_data(dict(variables)))
        return "".join(budget.output(pieces))
    except (RecursionError, MemoryError) as e:
        raise SpecpackError("the chat template cannot be rendered within bounds", expected="a template that ends",
                            found="unbounded recursion" if isinstance(e, RecursionError) else "out of memory",
                            hint="fix the template of the source model and export the pack again") from None
    except jinja2.TemplateError as e:  # raise_exception(), undefined attributes, sandbox violations
        raise SpecpackError("the chat template refused these messages", expected="messages the template accepts",
                            found=f"{type(e).__name__}: {e}",
                            hint="check the roles and their order (many templates want user/assistant turns "
                                 "alternating, and the system message first)") from e
    finally:
        _BUDGET.reset(token)


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
    env = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True,
                              extensions=[_GenerationBlock, _LoopGuard, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters = {name: _bounded_filter(f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


class _Budget:
    """The limits of one render: checked by the environment's hooks through the _BUDGET context variable."""

    def __init__(self, limits: RenderLimits) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.seconds
        self.built = 0  # characters (or items) built so far

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise SpecpackError("the chat template takes too long to render",
                                expected=f"a render within {self.limits.seconds:g} s",
                                found="still running at the deadline (a loop or recursion that does not end soon)",
                                hint="fix the template of the source model and export the pack again")

    def check_size(self, value: object, what: str, *, built: bool = True) -> None:
        """A value within the size of one operation; `built`: just built, so counted against the render's total."""
        if isinstance(value, (str, list, tuple, dict)):
            if len(value) > self.limits.chars:
                self.refuse(what, f"{len(value):,} items")
            if built:
                self.charge(len(value), what)

    def check_estimate(self, size: int | None, what: str) -> None:
        """An operation about to run, by the upper bound on what it builds (runtime/template_sizes.py)."""
        if size is not None and size > self.limits.chars:
            self.refuse(what, f"more than {self.limits.chars:,} characters (before it was built)")

    def charge(self, size: int, what: str) -> None:
        self.built += size
        if self.built > self.limits.built:
            raise SpecpackError("the chat template builds too much", expected=f"at most {self.limits.built:,} "
                                "characters (or items) built in one render", found=f"{what}: past the total",
                                hint="fix the template of the source model and export the pack again")

    def refuse(self, what: str, found: str) -> NoReturn:
        raise SpecpackError("the chat template builds too much output", expected=f"at most {self.limits.chars:,} "
                            "characters (or items) from any one operation and in all", found=f"{what}: {found}",
                            hint="fix the template of the source model and export the pack again")

    def output(self, pieces: Iterable[str]) -> Iterator[str]:
        written = 0
        for piece in pieces:
            self.tick()
            written += len(piece)
            if written > self.limits.chars:
                self.refuse("the rendered text", f"more than {self.limits.chars:,} characters")
            yield piece


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("specpack_chat_budget", default=None)
# a width or precision of a million or more in a %-format or a {}-format spec
_WIDE_FORMAT = re.compile(r"%[^%a-zA-Z]*[0-9]{7}|\{[^{}]*:[^{}]*[0-9]{7}")
_SIZED_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs", "format", "format_map"})
_MATERIALIZED = frozenset({"do_join", "do_sum", "do_list", "do_unique", "do_batch", "do_slice"})  # read whole


def _tick() -> _Budget | None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.tick()
    return budget


class _BoundedCodeGenerator(jinja2.compiler.CodeGenerator):
    """Jinja's code generator, with `a ~ b` joined through the environment (sized before it is built)."""

    @jinja2.compiler.optimizeconst
    def visit_Concat(self, node: jinja2.nodes.Concat, frame: jinja2.compiler.Frame) -> None:
        if frame.eval_ctx.volatile:
            join = "(markup_join if context.eval_ctx.volatile else str_join)"
        else:
            join = "markup_join" if frame.eval_ctx.autoescape else "str_join"
        self.write(f"environment.join_values({join}, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with every call, binary operator, join, output value and loop item checked against the render's
    budget."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _BoundedCodeGenerator

    def __init__(self, **options: Any) -> None:
        super().__init__(finalize=_finalize, **options)

    def concat(self, pieces: Iterable[str]) -> str:
        """The text of a macro, call block or set block (compiled code calls `environment.concat(buffer)`)."""
        budget = _BUDGET.get()
        if budget is None:
            return "".join(pieces)
        parts = list(pieces)
        budget.check_estimate(sum(len(p) for p in parts), "the text of a macro or block")
        out = "".join(parts)
        budget.charge(len(out), "the text of a macro or block")
        return out

    def join_values(self, join: Callable[[Iterable[Any]], str], values: tuple[Any, ...]) -> str:
        """`a ~ b ~ ...`: sized before the join."""
        budget = _tick()
        if budget is not None:
            budget.check_estimate(sum(size_of(v, budget.limits.chars) for v in values), "a joined string ('~')")
        result = join(values)
        if budget is not None:
            budget.check_size(result, "a joined string ('~')")
        return result

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        budget = _tick()
        if budget is not None:
            _check_binop(budget, operator, left, right)
        result = super().call_binop(context, operator, left, right)
        if budget is not None:
            budget.check_size(result, f"the result of {operator!r}")
        return result

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        budget = _tick()
        method = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format and str.format_map
        text, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
        if budget is not None and isinstance(text, str):
            if name == "join" and args and not isinstance(args[0], (str, list, tuple)):
                items = bounded_items(args[0], budget.limits.chars)  # an iterator: never more than the limit held
                if items is None:
                    budget.refuse("str.join", f"items of more than {budget.limits.chars:,} characters")
                args = (items, *args[1:])
            if name in _SIZED_METHODS:
                _check_widths(budget, f"str.{name}", text, (*args, *kwargs.values()))
            budget.check_estimate(method_size(name, text, args, kwargs, budget.limits.chars), f"str.{name}")
        result = super().call(__context, __obj, *args, **kwargs)
        if budget is not None:
            budget.check_size(result, f"the result of {name or 'a call'}")
        return result

    def _parse(self, source: str, name: str | None, filename: str | None) -> jinja2.nodes.Template:
        """Every `{% for %}` iterates through _LoopGuard.items (an extension attribute: templates cannot rebind it)."""
        tree = super()._parse(source, name, filename)
        guard = jinja2.nodes.ExtensionAttribute(_LoopGuard.identifier, "items")
        for loop in tree.find_all(jinja2.nodes.For):
            loop.iter = jinja2.nodes.Call(guard, [loop.iter], [], None, None)
        return tree


class _LoopGuard(jinja2.ext.Extension):
    """Yields a loop's items, checking the deadline before each."""

    def items(self, iterable: Iterable[Any]) -> Iterator[Any]:
        for item in iterable:
            _tick()
            yield item


def _check_binop(budget: _Budget, operator: str, left: Any, right: Any) -> None:
    """Refuse before computing: sequences repeated or joined past the limit, huge powers, wide % formats."""
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(times, int) and len(seq) * times > budget.limits.chars:
                budget.refuse("a repeated string or list", f"{len(seq):,} x {times:,}")
    elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
        if len(left) + len(right) > budget.limits.chars:
            budget.refuse("a joined string or list", f"{len(left) + len(right):,} items")
    elif operator == "**" and isinstance(right, (int, float)) and abs(right) > 64 and \
            isinstance(left, (int, float)) and abs(left) > 1:
        budget.refuse("a power", f"an exponent of {right}")
    elif operator == "%" and isinstance(left, str):
        args = right if isinstance(right, tuple) else (right,)
        _check_widths(budget, "a % format", left, args)
        budget.check_estimate(format_size(left, args, budget.limits.chars), "a % format")


def _check_widths(budget: _Budget, what: str, fmt: object, args: Iterable[Any]) -> None:
    """No integer argument past the size limit (a width, a count), no format spec as wide as a million."""
    for arg in args:
        if isinstance(arg, int) and not isinstance(arg, bool) and arg > budget.limits.chars:
            budget.refuse(what, f"an argument of {arg:,}")
    if isinstance(fmt, str) and _WIDE_FORMAT.search(fmt):
        budget.refuse(what, "a format width or precision of a million or more")


def _bounded_filter(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A filter whose integer arguments, estimated result (before it runs) and result stay within the render's size
    limit."""

    skip = 2 if hasattr(fn, "jinja_pass_arg") else 1  # the context / environment, then the value filtered

    @functools.wraps(fn)  # keeps jinja_pass_arg (pass_context / pass_environment)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = _tick()
        if budget is not None and len(args) >= skip:
            cap, what = budget.limits.chars, f"filter {fn.__name__}"
            fmt = args[skip - 1] if fn.__name__ == "do_format" else None
            _check_widths(budget, what, fmt, (*args[skip:], *kwargs.values()))
            value = args[skip - 1]
            if fn.__name__ in _MATERIALIZED and not isinstance(value, (str, list, tuple, Mapping)):
                items = bounded_items(value, cap)  # an iterator (map, select, ...): never more than cap held
                if items is None:
                    budget.refuse(what, f"items of more than {cap:,} characters")
                args = (*args[: skip - 1], items, *args[skip:])
            budget.check_estimate(filter_size(fn.__name__, args[skip - 1], args[skip:], kwargs, cap), what)
        result = fn(*args, **kwargs)
        if budget is not None:
            budget.check_size(result, f"the result of filter {fn.__name__}")
        return result

    return bounded


def _finalize(value: Any) -> Any:
    """Every value written out (`{{ x }}`), before str() turns it into text: no larger than one operation may build."""
    budget = _BUDGET.get()
    if budget is not None and not isinstance(value, str):
        budget.check_estimate(size_of(value, budget.limits.chars), "a value written out")
    return value


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
        budget = _tick()
        if budget is not None:
            budget.check_size(value, f"namespace value {name!r}", built=False)  # built (and counted) already
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
