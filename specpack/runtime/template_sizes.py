"""Upper bounds on what a chat template operation will build, computed before it runs (runtime/chat_template.py).

    size_of(value, cap)                        characters of str(value) (containers walked), or cap + 1 once past it
    format_size(fmt, args, cap)                a %-format or str.format: the text, each placeholder's widest value
    filter_size(name, value, args, kwargs, cap)   a filter's result, for the filters that can grow their input
    method_size(name, text, args, kwargs, cap)    the same for the str methods that can (replace, join, format)

Each is an upper bound (never less than the result) or cap + 1: the caller refuses anything past `cap` before
the operation allocates it, so a template never holds more than the render's budget.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

_INTEGERS = re.compile(r"[0-9]+")
# filters that write a whole container out as text (the others return its items, a number, or a lazy iterator)
_TEXT_OF_A_CONTAINER = frozenset({"soft_str", "do_pprint", "do_sum", "do_xmlattr", "do_urlencode"})
_PLACEHOLDER = re.compile(r"%|\{")


def size_of(value: Any, cap: int) -> int:
    """Characters of str(value): a string by its length, a number by a generous constant, a container by its items
    (each string quoted) plus punctuation. A text with many characters that repr() or JSON escape (control
    characters) can come out a few times longer: the result is checked after the operation too. The walk stops
    once past `cap` (returning cap + 1), so it costs at most O(cap) steps."""
    if isinstance(value, str):
        return len(value)
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
            total += 2 + 2 * len(item)
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
            total += 2 + 2 * len(item)
        else:
            total += 32  # a number, None, a bool, a placeholder object
        if total > cap:
            return cap + 1
    return total


def bounded_items(items: Iterable[Any], cap: int) -> list[Any] | None:
    """An iterable's items as a list, or None once their sizes pass `cap` (never more than that is held)."""
    out, total = [], 0
    for item in items:
        total += size_of(item, cap) + 1
        if total > cap:
            return None
        out.append(item)
    return out


def format_size(fmt: str, args: Iterable[Any], cap: int) -> int:
    """A format string filled in: its length, every number in it taken as a width, and each placeholder filled
    with the widest argument (widest as text or as a width)."""
    widest = 0
    for arg in args:
        width = arg if isinstance(arg, int) and not isinstance(arg, bool) else 0
        widest = max(widest, width, size_of(arg, cap))
        if widest > cap:
            return cap + 1
    placeholders = len(_PLACEHOLDER.findall(fmt))
    return len(fmt) + sum(int(n) for n in _INTEGERS.findall(fmt)[:cap]) + placeholders * widest


def _replace_size(text: str, old: Any, new: Any, count: Any = -1) -> int:
    if not isinstance(old, str) or not isinstance(new, str):
        return len(text)
    hits = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * max(0, len(new) - len(old))


def _indent_size(text: str, width: Any = 4, *args: Any) -> int:
    pad = len(width) if isinstance(width, str) else width if isinstance(width, int) and width > 0 else 0
    return len(text) + (text.count("\n") + 1) * pad


def _join_size(items: Any, sep: Any = "", cap: int = 0) -> int:
    if not isinstance(items, (list, tuple)):
        return 0  # an iterator: materialized and sized by the caller (bounded_items)
    gap = len(sep) if isinstance(sep, str) else 0
    return size_of(list(items), cap) + gap * len(items)


def filter_size(name: str, value: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], cap: int) -> int:
    """An upper bound on the result of filter `name` (jinja's do_* functions) on `value`."""
    text = value if isinstance(value, str) else None
    if name == "do_replace" and text is not None and args:
        return _replace_size(text, *args[:3])
    if name == "do_indent" and text is not None:
        return _indent_size(text, *args[:1], **{k: v for k, v in kwargs.items() if k == "width"})
    if name == "do_join":
        return _join_size(value, args[0] if args else kwargs.get("d", ""), cap)
    if name == "do_format" and text is not None:
        return format_size(text, (*args, *kwargs.values()), cap)
    if name in ("do_center", "do_truncate"):
        width = next((a for a in args if isinstance(a, int) and not isinstance(a, bool)), 0)
        return max(size_of(value, cap), width)
    if name == "do_wordwrap" and text is not None:
        width = next((a for a in args if isinstance(a, int) and not isinstance(a, bool) and a > 0), 79)
        return len(text) + len(text) // width + width
    if name in ("escape", "do_forceescape") and text is not None:
        return len(text) + 5 * sum(text.count(c) for c in "&<>\"'")
    if name in ("do_urlize", "do_urlencode"):
        return size_of(value, cap) * (12 if name == "do_urlize" else 3)  # an <a href=...> per word, %XX per byte
    if name == "_tojson":
        indent = args[1] if len(args) > 1 else kwargs.get("indent")
        return _json_size(value, len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0,
                          cap)
    if name in _TEXT_OF_A_CONTAINER:
        return size_of(value, cap)
    return len(value) if isinstance(value, str) else 0  # a new list of the items (references), or a number: by len


def _json_size(value: Any, indent: int, cap: int) -> int:
    """json.dumps(value, indent=indent): each value on a line of its own, indented by its depth."""
    total, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        total += 4 + depth * max(indent, 0)
        if isinstance(item, str):
            total += len(item) + 2  # more where JSON escapes characters: the result is checked too
        elif isinstance(item, Mapping):
            stack.extend((part, depth + 1) for pair in item.items() for part in pair)
        elif isinstance(item, (list, tuple)):
            stack.extend((part, depth + 1) for part in item)
        else:
            total += 32
        if total > cap:
            return cap + 1
    return total


def method_size(name: str, text: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], cap: int) -> int | None:
    """An upper bound on the result of str method `name` on `text`, for the methods that can grow it; else None."""
    if name == "replace" and args:
        return _replace_size(text, *args[:3])
    if name == "join" and args:
        return _join_size(args[0], text, cap)
    if name in ("format", "format_map"):
        values = (*args, *kwargs.values()) if name == "format" else tuple(args[0].values()) \
            if args and isinstance(args[0], Mapping) else ()
        return format_size(text, values, cap)
    return None
