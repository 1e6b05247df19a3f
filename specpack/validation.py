"""The arguments of a generate request, checked in one place for the Python API and the CLI alike.

    check_generate_args(prompt, max_new_tokens, k=..., temperature=..., ..., limits=None | PackLimits)
        -> GenerateArgs (plain Python values) or a SpecpackError saying what was expected and found
    check_context(n_prompt, max_new_tokens, max_len)    the prompt's ids and the new tokens fit the pack

The CLI calls it before loading the pack (limits=None: what can be checked without one), `Pack.generate`
calls it again with the pack's limits. A prompt is a `str` or a 1-D sequence of Python or numpy integers
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
from specpack.limits import K_MAX, check_k  # K_MAX: the largest k any pack accepts
from specpack.sampling import SamplingParams

SEED_LIMIT = 1 << 64       # seeds are 0 .. 2**64 - 1
TOP_K_MAX = (1 << 31) - 1  # top_k is an int64 graph input; anything past the vocabulary keeps every token
SHOWN = 5                  # bad items named in an error
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class PackLimits:
    """What a loaded pack allows: drafts per step, the logits width (ids are below it), prompt + new tokens."""

    k_max: int
    vocab_size: int
    max_len: int


@dataclass(frozen=True)
class GenerateArgs:
    prompt: str | list[int]   # text, or ids as Python ints
    max_new_tokens: int
    k: int | None             # None: adaptive ("auto")
    sampling: SamplingParams
    seed: int | None
    chat: bool


def check_generate_args(prompt: object, max_new_tokens: object = 128, *, k: object = None, temperature: object = 0.0,
                        top_k: object = 0, top_p: object = 1.0, seed: object = None, chat: object = False,
                        on_text: object = None, cancel: object = None, limits: PackLimits | None = None) -> GenerateArgs:
    """Every argument of a generate request, type- and range-checked; ranges that need the pack use `limits`."""
    if not isinstance(chat, (bool, np.bool_)):
        raise SpecpackError("invalid chat", expected="True or False", found=_brief(chat))
    k_max = K_MAX if limits is None else min(K_MAX, limits.k_max)
    max_len = None if limits is None else limits.max_len
    sampling = SamplingParams(_number(temperature, "temperature"), _integer(top_k, "top_k", 0, TOP_K_MAX, "0 disables"),
                              _number(top_p, "top_p"))
    if on_text is not None and not callable(on_text):
        raise SpecpackError("invalid on_text", expected="a function taking a str, or None", found=_brief(on_text))
    if cancel is not None and not callable(getattr(cancel, "is_set", None)):
        raise SpecpackError("invalid cancel", expected="a threading.Event (anything with an is_set() method), or None",
                            found=_brief(cancel), hint="pass cancel=threading.Event() and set() it to stop")
    return GenerateArgs(
        prompt=check_prompt(prompt, chat=bool(chat), vocab_size=None if limits is None else limits.vocab_size),
        max_new_tokens=_integer(max_new_tokens, "max_new_tokens", 1, max_len or 1 << 31,
                                "at most the pack's max_len" if max_len else ""),
        k=None if k is None else check_k(k, k_max),
        sampling=sampling,
        seed=None if seed is None else _integer(seed, "seed", 0, SEED_LIMIT - 1),
        chat=bool(chat),
    )


def check_prompt(prompt: object, *, chat: bool = False, vocab_size: int | None = None) -> str | list[int]:
    """A non-empty `str`, or a non-empty 1-D sequence of integer ids (each below `vocab_size` when given)."""
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
        raise SpecpackError("invalid prompt", expected=what, found=f"{type(prompt).__name__} {_brief(prompt)}",
                            hint="decode the bytes to a str first (prompt.decode('utf-8'))")
    if isinstance(prompt, np.ndarray):
        if prompt.ndim != 1 or not np.issubdtype(prompt.dtype, np.integer):
            raise SpecpackError("invalid prompt", expected=f"{what}: a 1-D integer array",
                                found=f"a {prompt.ndim}-D array of {prompt.dtype}")
        items: Sequence[Any] = prompt.tolist()
    elif isinstance(prompt, Sequence):
        items = prompt
    else:
        raise SpecpackError("invalid prompt", expected=what, found=f"{type(prompt).__name__} {_brief(prompt)}")
    if chat:
        raise SpecpackError("chat=True needs a text prompt", expected="a str prompt with chat=True",
                            found="token ids", hint="pass the text, or drop chat=True to use the ids as they are")
    bad = [i for i, t in enumerate(items) if not _is_int(t)]
    if bad:
        raise SpecpackError("invalid prompt token ids", expected="integers (Python int or numpy integer)",
                            found=", ".join(f"item {i}: {type(items[i]).__name__} {_brief(items[i])}"
                                            for i in bad[:SHOWN]))
    ids = [int(t) for t in items]
    if not ids:
        raise SpecpackError("empty prompt", expected="at least one token", found="0 tokens")
    top = vocab_size if vocab_size is not None else 1 << 62
    out_of_range = [t for t in ids if not 0 <= t < top]
    if out_of_range:
        raise SpecpackError("prompt token id out of range", expected=f"ids in [0, {top})",
                            found=f"{out_of_range[:SHOWN]}")
    return ids


def check_context(n_prompt: int, max_new_tokens: int, max_len: int) -> None:
    """The prompt and the tokens to generate fit in the pack's max length (its KV cache)."""
    if n_prompt + max_new_tokens > max_len:
        raise SpecpackError("prompt plus max_new_tokens is longer than the pack's max length",
                            expected=f"prompt + max_new_tokens <= {max_len}",
                            found=f"{n_prompt} + {max_new_tokens} = {n_prompt + max_new_tokens}",
                            hint="shorten the prompt, lower --max-new-tokens, or re-export with a larger --max-len")


def check_load_args(path: object, threads: object) -> str | os.PathLike[str]:
    """`specpack.load`'s arguments: a path (str or os.PathLike) and a thread count (None: ONNX Runtime's default)."""
    if not isinstance(path, (str, os.PathLike)) or isinstance(path, bytes):
        raise SpecpackError("invalid pack path", expected="a str or pathlib.Path", found=_brief(path))
    if threads is not None:
        _integer(threads, "threads", 1, 1024, "None: ONNX Runtime's default")
    return path


def check_sha256(value: object, what: str) -> str:
    """A sha256 digest as 64 lowercase hex digits (upper case is accepted and lowered)."""
    if not isinstance(value, str) or not _SHA256.fullmatch(value.lower()):
        raise SpecpackError(f"invalid {what}", expected="a sha256 digest: 64 hex digits",
                            found=_brief(value), hint="copy it from `specpack inspect PACK`")
    return value.lower()


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _integer(value: object, what: str, low: int, high: int, note: str = "", hint: str | None = None) -> int:
    if not _is_int(value) or not low <= int(value) <= high:  # type: ignore[call-overload]
        extra = f" ({note})" if note else ""
        raise SpecpackError(f"invalid {what}", expected=f"an integer in {low}..{high}{extra}", found=_brief(value),
                            hint=hint)
    return int(value)  # type: ignore[call-overload]


def _number(value: object, what: str) -> float:
    """A real number as a Python float (NaN and infinities are left for SamplingParams to refuse by name)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise SpecpackError(f"invalid {what}", expected="a number", found=_brief(value))
    try:
        return float(value)
    except OverflowError:  # an int past the float range
        return math.inf


def _brief(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

