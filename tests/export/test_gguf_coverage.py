"""A GGUF whose tensors do not cover the model is refused, naming the tensors, and never cached; temp dirs of
killed conversions are removed by the next one."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from specpack.errors import SpecpackError
from specpack.export.gguf import convert_gguf
from specpack.export.staging import temp_prefix
from tests.export import test_gguf as tiny

Tensors = dict[str, np.ndarray]


def _write(path: Path, edit: Callable[[Tensors], None], monkeypatch: pytest.MonkeyPatch) -> Path:
    build = tiny._tensors

    def edited(vocab: int) -> Tensors:
        tensors = build(vocab)
        edit(tensors)
        return tensors

    with monkeypatch.context() as m:
        m.setattr(tiny, "_tensors", edited)
        tiny.write_tiny_gguf(path)
    return path


EDITS: dict[str, tuple[Callable[[Tensors], None], str]] = {
    "missing": (lambda t: t.pop("blk.1.ffn_up.weight"), "missing: blk.1.ffn_up.weight"),
    "extra": (lambda t: t.update({"blk.7.ffn_up.weight": t["blk.1.ffn_up.weight"]}), "extra: blk.7.ffn_up.weight"),
    "mis-shaped": (lambda t: t.update({"blk.1.ffn_up.weight": t["blk.1.ffn_up.weight"][:, :32].copy()}),
                   "wrong shape: blk.1.ffn_up.weight [128, 32] (the model needs [128, 64])"),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_tensors_must_cover_the_model(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's finding: tensors missing exported with random weights (exit 0), and the result was cached."""
    edit, says = EDITS[case]
    gguf = _write(tmp_path / f"{case}.gguf", edit, monkeypatch)
    cache = tmp_path / "cache"
    with pytest.raises(SpecpackError) as err:
        convert_gguf(gguf, cache)
    assert "do not cover the model" in str(err.value) and says in str(err.value)
    assert list(cache.iterdir()) == []


def test_killed_conversions_leave_nothing_for_long(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = _write(tmp_path / "ok.gguf", lambda t: None, monkeypatch)
    cache = tmp_path / "cache"
    cache.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = cache / f"{temp_prefix('.tmp-').replace(str(os.getpid()), str(dead.pid))}ok-0123"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    out = convert_gguf(gguf, cache)
    assert sorted(p.name for p in cache.iterdir()) == [out.name]
