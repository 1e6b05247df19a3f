"""The incremental stop-string matcher against a one-shot reference, over every way of splitting the text."""

from __future__ import annotations

import itertools
import random

import pytest

from specpack.errors import SpecpackError
from specpack.runtime.stop_strings import StopMatcher


def reference(text: str, stops: list[str]) -> tuple[str, bool]:
    """OpenAI semantics in one shot: the text before the earliest stop string, and whether there was one."""
    hits = [i for s in stops if (i := text.find(s)) >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


def run(pieces: list[str], stops: list[str]) -> tuple[str, bool]:
    matcher = StopMatcher(stops)
    out = []
    for piece in pieces:
        got = matcher.push(piece)
        out.append(got.text)
        if got.stopped:
            return "".join(out), True
    return "".join(out) + matcher.flush(), False


def random_split(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, max(0, len(text) - 1)))) if len(text) > 1 else []
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("stops", [["\n\n"], ["abc", "b"], ["aab"], ["ab", "abab", "ba"], ["x" * 5, "xy"], ["🙂!"]])
def test_matches_the_reference_for_any_split(stops: list[str]) -> None:
    rng = random.Random(0)
    alphabet = "abxy\n🙂! "
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        assert run(random_split(text, rng), stops) == reference(text, stops), (text, stops)


def test_holds_back_only_what_could_begin_a_stop_string() -> None:
    m = StopMatcher(["</end>"])
    assert m.push("done </e") == ("done ", False)      # "</e" could begin the stop string
    assert m.push("x") == ("</ex", False)               # it did not: released
    assert m.push(" </en") == (" ", False)
    assert m.push("d> more") == ("", True)              # hit across pieces; the stop string is not emitted
    assert m.hit == "</end>"
    assert m.push("after") == ("", True)                # nothing after a hit


def test_no_stop_strings_passes_text_through() -> None:
    m = StopMatcher([])
    assert m.push("abc") == ("abc", False)
    assert m.flush() == ""


def test_flush_releases_the_held_tail() -> None:
    m = StopMatcher(["###"])
    assert m.push("x ##") == ("x ", False)
    assert m.flush() == "##"


def test_empty_stop_string_is_refused() -> None:
    with pytest.raises(SpecpackError, match="invalid stop string"):
        StopMatcher(["ok", ""])
