"""Bench fixtures: `fake_pack`, a Pack on the numpy reference engines that `specpack.runtime.pack.load` returns."""

from __future__ import annotations

import pytest
from bench_fakes import make_fake_pack

from specpack.runtime.pack import Pack


@pytest.fixture
def fake_pack(monkeypatch: pytest.MonkeyPatch) -> Pack:
    """A fake pack that `specpack.runtime.pack.load` returns, whatever the path."""
    pack = make_fake_pack()
    monkeypatch.setattr("specpack.runtime.pack.load", lambda path, device="cpu", threads=None: pack)
    return pack
