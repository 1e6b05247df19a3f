"""GenerateRequest (runtime/request.py): one typed request, checked once, the same tokens by every path into a pack;
stop strings cut in the pack."""

from __future__ import annotations

import re

import numpy as np
import pytest

import specpack
from specpack.errors import SpecpackError
from specpack.runtime.pack import Pack
from specpack.runtime.request import MAX_NEW_TOKENS, GenerateRequest
from specpack.sampling import SamplingParams
from specpack.validation import PackLimits

PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def pack(tiny_pack) -> Pack:
    return specpack.load(tiny_pack("qwen2", "noisy")[0], threads=1)


def test_defaults_and_loose_values_are_made_plain() -> None:
    req = GenerateRequest.of(np.array([5, 6, 7], np.int32), np.int64(9), k=np.int64(2), top_k=np.int32(3), seed=np.uint8(4))
    assert req == GenerateRequest((5, 6, 7), 9, k=2, sampling=SamplingParams(top_k=3), seed=4)
    assert type(req.max_new_tokens) is int and type(req.k) is int and all(type(t) is int for t in req.prompt)
    plain = GenerateRequest("hi")
    assert plain.max_new_tokens == MAX_NEW_TOKENS and plain.sampling.greedy and plain.k is None and plain.stop == ()


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"k": 17}, "0..16 (the largest k_max"), ({"drafter": "eagle"}, "unknown drafter 'eagle'"),
    ({"stop": ("",)}, "invalid stop string"), ({"stop": "x"}, "invalid stop"), ({"sampling": 0.5}, "invalid sampling"),
    ({"tree": 65}, "a node budget in 1..64 (the largest a pack takes)"), ({"tree": 0}, "invalid tree"),
    ({"tree": "wide"}, "invalid tree"), ({"tree": True}, "invalid tree"), ({"tree": 2.0}, "invalid tree"),
    ({"tree": 8, "k": 2}, "k and a fixed tree both fix a step's drafts"),
])
def test_refused_as_it_is_made(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(SpecpackError, match=re.escape(says)):
        GenerateRequest("hi", 4, **kwargs)  # type: ignore[arg-type]


def test_tree_values() -> None:
    assert GenerateRequest("hi").tree == "auto"
    assert GenerateRequest.of("hi", tree=np.int64(8)).tree == 8 and GenerateRequest("hi", tree="off").tree == "off"
    assert GenerateRequest("hi", k=2, tree="off").k == 2  # a fixed k with auto or off: chains of k, or tries of k nodes
    limits = PackLimits(4, 100, 64, max_nodes=16)
    with pytest.raises(SpecpackError, match=re.escape("1..16 (this pack's max tree nodes)")):
        GenerateRequest("hi", 4, tree=17, limits=limits)
    with pytest.raises(SpecpackError, match="a fixed tree needs a pack whose verify graph takes trees"):
        GenerateRequest("hi", 4, tree=4).check_fits(PackLimits(4, 100, 64))
    assert GenerateRequest("hi", 4, tree="auto", limits=PackLimits(4, 100, 64)).tree == "auto"  # chains there


def test_a_packs_limits_are_checked_once(pack: Pack) -> None:
    """Made without limits (the CLI, before loading): Pack.prepare checks what the pack's limits add; made with them,
    it is not checked again."""
    m = pack.manifest
    for bad, says in (({"k": m.k_max + 1}, f"0..{m.k_max} (this pack's k_max"),
                      ({"max_new_tokens": m.max_len + 1}, "at most the pack's max_len"),
                      ({"prompt": (m.vocab_size,)}, "out of range")):
        request = GenerateRequest(**{"prompt": PROMPT, "max_new_tokens": 4, **bad})  # type: ignore[arg-type]
        with pytest.raises(SpecpackError, match=re.escape(says)):
            pack.prepare(request)
    request = GenerateRequest(PROMPT, 4, limits=pack.limits)
    assert request.checked_for == pack.limits == PackLimits(m.k_max, m.vocab_size, m.max_len)
    assert pack.prepare(request).ids == tuple(pack.encode(PROMPT))


def test_every_path_gives_the_same_tokens(pack: Pack) -> None:
    """Pack.generate (keywords), generate_request (a typed request) and prepare + run (the server's path)."""
    kwargs = {"k": 2, "temperature": 0.8, "top_p": 0.9, "seed": 5}
    want = pack.generate(PROMPT, 12, **kwargs)  # type: ignore[arg-type]
    request = GenerateRequest(PROMPT, 12, k=2, sampling=SamplingParams(0.8, 0, 0.9), seed=5)
    for got in (pack.generate_request(request), pack.run(pack.prepare(request))):
        assert (got.tokens, got.text, got.finish_reason) == (want.tokens, want.text, want.finish_reason)


def test_stop_strings_end_the_text_before_them(pack: Pack) -> None:
    full = pack.generate(PROMPT, 24, k=2)
    assert len(full.text) > 4, full.text
    stop = full.text[2:4]
    first = full.text.index(stop)
    pieces: list[str] = []
    out = pack.generate(PROMPT, 24, k=2, stop=[stop], on_text=pieces.append)
    assert out.finish_reason == "stop" and out.text == full.text[:first] == "".join(pieces)
    assert out.tokens == full.tokens[: len(out.tokens)] and len(out.tokens) <= len(full.tokens)
    unmatched = pack.generate(PROMPT, 24, k=2, stop=["\x00never"])
    assert (unmatched.text, unmatched.tokens, unmatched.finish_reason) == (full.text, full.tokens, full.finish_reason)
