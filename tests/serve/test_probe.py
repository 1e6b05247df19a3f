"""The replica health probe (specpack/serve/probe.py): a pack that cannot generate one token fails it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import specpack
from specpack.errors import SpecpackError
from specpack.serve.probe import check_pack, generate_one_token


class FakeDecoder:
    def __init__(self, *, draining: bool = False, idle: bool = True) -> None:
        self.draining, self.idle = draining, idle


class BrokenPack:
    """A loaded pack whose run fails (its device lost, say), or hangs until released."""

    def __init__(self, pack: Any, *, hang: threading.Event | None = None) -> None:
        self._pack, self.hang = pack, hang

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pack, name)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        if self.hang is not None:
            self.hang.wait()
        raise SpecpackError("the engine failed", found="a lost device")


@pytest.fixture(scope="module")
def pack(tiny_pack: Callable[..., tuple[Path, Path, Path]]) -> Any:
    loaded = specpack.load(tiny_pack("qwen2", "noisy")[0])
    yield loaded
    loaded.close()


def test_a_working_pack_passes(pack: Any) -> None:
    generate_one_token(pack)
    asyncio.run(check_pack(pack, FakeDecoder()))  # type: ignore[arg-type]


def test_a_pack_that_cannot_generate_fails(pack: Any) -> None:
    with pytest.raises(SpecpackError, match="the engine failed"):
        asyncio.run(check_pack(BrokenPack(pack), FakeDecoder()))  # type: ignore[arg-type]


def test_a_hung_pack_fails_within_the_timeout(pack: Any) -> None:
    release = threading.Event()
    threading.Timer(1.0, release.set).start()  # after the probe gave up: asyncio.run waits for its thread to end
    with pytest.raises(SpecpackError, match="timed out") as err:
        asyncio.run(check_pack(BrokenPack(pack, hang=release), FakeDecoder(), timeout_s=0.2))  # type: ignore[arg-type]
    assert "one token within 0.2 s" in str(err.value)


def test_a_draining_replica_fails_and_a_busy_one_is_not_probed(pack: Any) -> None:
    with pytest.raises(SpecpackError, match="shutting down"):
        asyncio.run(check_pack(pack, FakeDecoder(draining=True)))  # type: ignore[arg-type]
    asyncio.run(check_pack(BrokenPack(pack), FakeDecoder(idle=False)))  # type: ignore[arg-type]  (requests decode)
