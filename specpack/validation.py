"""Checks of what users pass in, each written once: prompts, token ids, integers and numbers, paths, digests.

    check_prompt(prompt, chat=..., vocab_size=None)   a str, or 1-D integer ids as Python ints
    check_context(n_prompt, max_new_tokens, max_len)  the prompt's ids and the new tokens fit the pack (ContextTooLong)
    PackLimits(k_max, vocab_size, max_len, max_nodes) what a loaded pack allows

A generate request is checked by specpack.runtime.request.GenerateRequest (its own values as it is made, the pack's
limits in Pack.prepare), from these functions. A prompt is a `str` or a 1-D sequence of Python or numpy integers
(bools, floats, strings, bytes, None and nested sequences are refused); `chat=True` needs a `str`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specpack.errors import SpecpackError

SHOWN = 5                  # bad items named in an error
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class PackLimits:
    """What a loaded pack allows: drafts per step, the logits width (ids are below it), prompt + new tokens."""

    k_max: int
    vocab_size: int
    max_len: int
    max_nodes: int = 0  # the most nodes of a tree verify (0: the pack has no tree verify graph)


def check_prompt(prompt: object, *, chat: bool = False, vocab_size: int | None = None) -> str | list[int]:
    """A non-empty `str`, or a non-empty 1-D sequence of integer ids (each in [0, vocab_size) when it is given)."""
    if isinstance(prompt, str):
        if not prompt:
            raise SpecpackError("empty prompt", expected="at least one character", found="''")
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as err:
            raise SpecpackError("the prompt is not valid text", expected="a str that encodes as UTF-8",
                                found=f"a lone surrogate at character {err.start}") from None
        return prompt
    what = "a str, or a sequence of token ids (Python or numpy integers)"
    if isinstance(prompt, (bytes, bytearray, memoryview)):
        raise SpecpackError("invalid prompt", expected=what, found=f"{type(prompt).__name__} {brief(prompt)}",
                            hint="decode the bytes to a str first (prompt.decode('utf-8'))")
    if isinstance(prompt, np.ndarray):
        if prompt.ndim != 1 or not np.issubdtype(prompt.dtype, np.integer):
            raise SpecpackError("invalid prompt", expected=f"{what}: a 1-D integer array",
                                found=f"a {prompt.ndim}-D array of {prompt.dtype}")
        items: Sequence[Any] = prompt.tolist()
    elif isinstance(prompt, Sequence):
        items = prompt
    else:
        raise SpecpackError("invalid prompt", expected=what, found=f"{type(prompt).__name__} {brief(prompt)}")
    if chat:
        raise SpecpackError("chat=True needs a text prompt", expected="a str prompt with chat=True",
                            found="token ids", hint="pass the text, or drop chat=True to use the ids as they are")
    bad = [i for i, t in enumerate(items) if not is_int(t)]
    if bad:
        raise SpecpackError("invalid prompt token ids", expected="integers (Python int or numpy integer)",
                            found=", ".join(f"item {i}: {type(items[i]).__name__} {brief(items[i])}"
                                            for i in bad[:SHOWN]))
    ids = [int(t) for t in items]
    if not ids:
        raise SpecpackError("empty prompt", expected="at least one token", found="0 tokens")
    if vocab_size is not None:
        check_ids(ids, vocab_size)
    return ids


def check_ids(ids: Sequence[int], vocab_size: int) -> None:
    """Token ids in [0, vocab_size): the graphs' embedding would fail on any other."""
    out_of_range = [t for t in ids if not 0 <= t < vocab_size]
    if out_of_range:
        raise SpecpackError("prompt token id out of range", expected=f"ids in [0, {vocab_size})",
                            found=f"{out_of_range[:SHOWN]}")


class ContextTooLong(SpecpackError):
    """The prompt and max_new_tokens do not fit the pack's max length (the server answers it in OpenAI's words)."""


def check_context(n_prompt: int, max_new_tokens: int, max_len: int) -> None:
    """The prompt and the tokens to generate fit in the pack's max length (its KV cache)."""
    if n_prompt + max_new_tokens > max_len:
        raise ContextTooLong("prompt plus max_new_tokens is longer than the pack's max length",
                            expected=f"prompt + max_new_tokens <= {max_len}",
                            found=f"{n_prompt} + {max_new_tokens} = {n_prompt + max_new_tokens}",
                            hint="shorten the prompt, lower --max-new-tokens, or re-export with a larger --max-len")


def check_load_args(path: object, threads: object) -> str | os.PathLike[str]:
    """`specpack.load`'s arguments: a path (str or os.PathLike) and a thread count (None: ONNX Runtime's default)."""
    if not isinstance(path, (str, os.PathLike)) or isinstance(path, bytes):
        raise SpecpackError("invalid pack path", expected="a str or pathlib.Path", found=brief(path))
    if threads is not None:
        check_integer(threads, "threads", 1, 1024, "None: ONNX Runtime's default")
    return path


def check_sha256(value: object, what: str) -> str:
    """A sha256 digest as 64 lowercase hex digits (upper case is accepted and lowered)."""
    if not isinstance(value, str) or not _SHA256.fullmatch(value.lower()):
        raise SpecpackError(f"invalid {what}", expected="a sha256 digest: 64 hex digits",
                            found=brief(value), hint="copy it from `specpack inspect PACK`")
    return value.lower()


def is_bool(value: object) -> bool:
    return isinstance(value, (bool, np.bool_))


def is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_integer(value: object, what: str, low: int, high: int, note: str = "", hint: str | None = None) -> int:
    if not is_int(value) or not low <= int(value) <= high:  # type: ignore[call-overload]
        extra = f" ({note})" if note else ""
        raise SpecpackError(f"invalid {what}", expected=f"an integer in {low}..{high}{extra}", found=brief(value),
                            hint=hint)
    return int(value)  # type: ignore[call-overload]


def check_number(value: object, what: str) -> float:
    """A real number as a Python float (NaN and infinities are left for SamplingParams to refuse by name)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise SpecpackError(f"invalid {what}", expected="a number", found=brief(value))
    try:
        return float(value)
    except OverflowError:  # an int past the float range
        return math.inf


def brief(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

