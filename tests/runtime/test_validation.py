"""The Python API checks its arguments exactly as the CLI does (one request type, specpack/runtime/request.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import specpack
from specpack.cli.main import cli
from specpack.errors import SpecpackError
from specpack.runtime.request import GenerateRequest


@pytest.fixture(scope="module")
def pack(tiny_pack) -> specpack.Pack:
    return specpack.load(tiny_pack("qwen2", "noisy")[0])


@pytest.mark.parametrize(("prompt", "says"), [
    (b"hi", "bytes"),
    (bytearray(b"hi"), "bytearray"),
    ([1.0, 2.0], "item 0: float"),
    ([1, 2.5], "item 1: float"),
    (["5"], "item 0: str"),
    ([True], "item 0: bool"),
    ([np.bool_(True)], "item 0: bool"),
    ([np.float32(3)], "item 0: float32"),
    (None, "NoneType"),
    (math.nan, "float"),
    ([math.nan], "item 0: float"),
    (np.array([[1, 2], [3, 4]]), "2-D"),
    (np.array([1.0, 2.0]), "float64"),
    ([[1, 2]], "item 0: list"),
    ({1, 2}, "set"),
    (iter([1, 2]), "list_iterator"),
    ([], "empty prompt"),
    ("", "empty prompt"),
    ("bad \ud800 text", "lone surrogate"),
    ([-1], "out of range"),
    ([330], "out of range"),
    ([2**70], "out of range"),
])
def test_bad_prompts_are_refused(pack: specpack.Pack, prompt: object, says: str) -> None:
    with pytest.raises(SpecpackError) as err:
        pack.generate(prompt, 4)  # type: ignore[arg-type]
    assert says in str(err.value) and "expected" in str(err.value)


def test_good_prompts(pack: specpack.Pack) -> None:
    ids = pack.encode("def add(a, b):")
    want = pack.generate(ids, 6, k=2).tokens
    assert pack.generate(np.array(ids, dtype=np.int32), 6, k=2).tokens == want
    assert pack.generate(tuple(np.int64(t) for t in ids), 6, k=2).tokens == want
    assert pack.generate("def add(a, b):", 6, k=np.int64(2)).tokens == want


def test_chat_with_ids_is_an_error(pack: specpack.Pack) -> None:
    with pytest.raises(SpecpackError, match="chat=True needs a text prompt"):
        pack.generate([1, 2, 3], 4, chat=True)


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"k": 9}, "invalid k"), ({"k": -1}, "invalid k"), ({"k": True}, "invalid k"), ({"k": 2.0}, "invalid k"),
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"max_new_tokens": 10**9}, "max_new_tokens"),
    ({"max_new_tokens": "4"}, "max_new_tokens"),
    ({"seed": -1}, "invalid seed"), ({"seed": 2**64}, "invalid seed"), ({"seed": 1.5}, "invalid seed"),
    ({"top_k": 99999999999999999999}, "invalid top_k"), ({"top_k": -3}, "invalid top_k"),
    ({"temperature": math.nan}, "invalid temperature"), ({"temperature": 10**400}, "invalid temperature"),
    ({"temperature": "0.7"}, "invalid temperature"), ({"top_p": 0}, "invalid top_p"),
    ({"chat": "yes"}, "invalid chat"), ({"on_text": 3}, "invalid on_text"),
    ({"cancel": True}, "invalid cancel"), ({"cancel": "stop"}, "invalid cancel"),  # not an AttributeError mid-loop
])
def test_bad_arguments_are_refused(pack: specpack.Pack, kwargs: dict[str, object], says: str) -> None:
    args = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(SpecpackError) as err:
        pack.generate("hi", **args)  # type: ignore[arg-type]
    assert says in str(err.value)


@pytest.mark.parametrize("path", [None, 3, b"pack"])
def test_load_refuses_a_path_that_is_not_one(path: object) -> None:
    with pytest.raises(SpecpackError, match="invalid pack path"):
        specpack.load(path)  # type: ignore[arg-type]


def test_the_cli_uses_the_same_function() -> None:
    """The CLI's refusals are the API's: the same messages for the same values."""
    for kwargs, flag in (({"seed": -1}, ["--seed", "-1"]), ({"top_k": 99999999999999999999}, ["--top-k", "99999999999999999999"]),
                         ({"k": 17}, ["--k", "17"])):
        with pytest.raises(SpecpackError) as err:
            GenerateRequest.of("hi", 4, **kwargs)  # type: ignore[arg-type]
        result = CliRunner().invoke(cli, ["generate", "no-such-pack", "--prompt", "hi", "--max-new-tokens", "4",
                                          "--temperature", "0.7", *flag])
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert str(err.value) in result.output


def test_cli_prompt_file_that_is_not_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café".encode("latin-1"))
    result = CliRunner().invoke(cli, ["generate", "no-such-pack", "--prompt-file", str(bad)])
    assert result.exit_code == 2 and "not UTF-8" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("how", ["flag", "group", "env"])
def test_debug_shows_the_traceback(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["generate", "no-such-pack", "--prompt", "hi", "--seed", "-1"]
    plain = CliRunner().invoke(cli, args)
    assert plain.exit_code == 2 and "Traceback" not in plain.output
    if how == "env":
        monkeypatch.setenv("SPECPACK_DEBUG", "1")
    args = {"flag": [*args, "--debug"], "group": ["--debug", *args], "env": args}[how]
    debug = CliRunner().invoke(cli, args)
    assert debug.exit_code == 2 and "Traceback" in debug.output and "invalid seed" in debug.output
