"""The server listens only once the thread that decodes has captured its shapes (Decoder.ready): a first request never
waits for captures (8.4 s at 16 clients on an H200 before: bench/README.md), and captures that fail stop the server
from starting instead of failing every request."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from conftest import MODEL

import specpack
from specpack.errors import SpecpackError
from specpack.runtime.backend import BackendOptions
from specpack.serve.app import build_app
from specpack.serve.config import ServeConfig
from specpack.serve.server import serve_in_thread

CAPTURE_S = 0.6  # a capture long enough that a server listening before it ends is seen


class SlowCaptures:
    """Wraps a backend's precapture_thread: sleeps, then records that it ended (or raises `error`)."""

    def __init__(self, backend: Any, error: Exception | None = None) -> None:
        self.inner, self.error = backend.precapture_thread, error
        self.done = threading.Event()
        self.thread: str | None = None

    def __call__(self, *args: Any) -> int:
        time.sleep(CAPTURE_S)
        self.thread = threading.current_thread().name
        if self.error is not None:
            raise self.error
        runs = int(self.inner(*args))
        self.done.set()
        return runs


@pytest.mark.parametrize("max_batch", [1, 2])
def test_the_server_listens_once_the_decoding_thread_captured(tiny_pack, monkeypatch, max_batch: int) -> None:
    pack_dir: Path = tiny_pack("qwen2", "noisy")[0]
    pack = specpack.load(pack_dir, options=BackendOptions(slots=max_batch))
    captures = SlowCaptures(pack.backend)
    monkeypatch.setattr(pack.backend, "precapture_thread", captures)
    try:
        app = build_app(pack, ServeConfig(pack_dir, max_batch=max_batch, model_name=MODEL))
        t0 = time.monotonic()
        with serve_in_thread(app) as url:
            assert captures.done.is_set(), "the server listened before the captures ended"
            assert time.monotonic() - t0 >= CAPTURE_S
            # on the thread that decodes: the batcher's, or (max_batch 1) the decoder's worker
            assert captures.thread is not None
            assert captures.thread.startswith("specpack-batcher" if max_batch > 1 else "specpack-decode")
            with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
                out = client.completions.create(model=MODEL, prompt="def f(x):\n", max_tokens=4, temperature=0)
            assert out.usage is not None and out.usage.completion_tokens == 4
    finally:
        pack.close()


@pytest.mark.parametrize("max_batch", [1, 2])
def test_captures_that_fail_stop_the_server_from_starting(tiny_pack, monkeypatch, max_batch: int) -> None:
    pack_dir: Path = tiny_pack("qwen2", "noisy")[0]
    pack = specpack.load(pack_dir, options=BackendOptions(slots=max_batch))
    monkeypatch.setattr(pack.backend, "precapture_thread",
                        SlowCaptures(pack.backend, RuntimeError("a capture failed (planted)")))
    try:
        app = build_app(pack, ServeConfig(pack_dir, max_batch=max_batch, model_name=MODEL))
        with pytest.raises(SpecpackError, match="the server did not start"), serve_in_thread(app):
            pass
    finally:
        pack.close()
