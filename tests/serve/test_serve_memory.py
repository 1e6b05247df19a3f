"""Memory is bounded before a request is queued: a request takes its place in the queue (429 when there is none)
before its prompt is tokenized, and prompts are tokenized one at a time. The server's RSS is measured."""

from __future__ import annotations

import gc
import json
import threading
import time
from typing import Any

import openai
import psutil
import pytest
from conftest import MODEL, Live
from raw_http import post

from specpack.serve.app import build_app
from specpack.serve.config import ServeConfig
from specpack.serve.server import serve_in_thread

CLIENTS = 24
BOUND_MB = 150  # measured +27 to +34 MiB (the bodies and their parsing); tokenizing them all took +1.9 GiB


class PeakRSS:
    """This process's resident memory, sampled every 2 ms in a thread: peak - baseline, in MiB."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        gc.collect()
        self.baseline = self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.002)

    def growth_mb(self) -> float:
        self._stop.set()
        self._thread.join()
        return (self.peak - self.baseline) / 2**20


def large_body(config: ServeConfig) -> bytes:
    """A completion request as large as --max-body-bytes allows."""
    filler = "hello world, "
    prompt = filler * ((config.max_body_bytes - 100) // len(filler))
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 2}).encode()
    assert config.max_body_bytes - 200 < len(body) <= config.max_body_bytes
    return body


def post_all(url: str, body: bytes, clients: int) -> list[int]:
    """The statuses of `clients` POSTs of `body`, sent at once."""
    statuses: list[int] = []
    barrier = threading.Barrier(clients)

    def send() -> None:
        barrier.wait()
        statuses.append(post(url, "/v1/completions", body)[0])

    threads = [threading.Thread(target=send) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return statuses


def test_large_prompts_meeting_a_full_queue_are_refused_before_they_are_tokenized(client: openai.OpenAI,
                                                                                  live: Live) -> None:
    """The finding: 24 concurrent 1 MiB prompts took the server from 96 MB to 2.9 GB, none answered 429 (this test on
    the code before: +1.9 GiB, all tokenized, then refused for their length). Now each is answered 429 at once."""
    config = ServeConfig(live.pack_dir, model_name=MODEL, max_queue=0)
    body = large_body(config)
    with serve_in_thread(build_app(live.pack, config)) as url:
        busy = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
        # the decoder stays busy for >= 22 s (>= 22 text pieces): at 0.25 s a piece (>= 5 s), a CI run on 2 busy cores
        # once took longer to deliver the 24 bodies, two were admitted after it and refused for their length (400)
        live.pack.delay = 1.0
        running = busy.completions.create(model=MODEL, prompt="x", max_tokens=200, stream=True)
        next(running)  # the decoder is busy and no request may wait: the queue is full
        rss = PeakRSS()
        statuses = post_all(url, body, CLIENTS)
        growth = rss.growth_mb()
        running.close()
        busy.close()
    measured = f"RSS grew by {growth:.0f} MiB; statuses {statuses}"
    assert statuses == [429] * CLIENTS, measured
    assert growth < BOUND_MB, measured


def test_prompts_are_tokenized_one_at_a_time(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests that hold a place are tokenized in turn: tokenizing costs about 100 times the text in memory at its
    peak (1 MiB of text: +250 to +280 MiB measured), so concurrent tokenizations would add up."""
    config = ServeConfig(live.pack_dir, model_name=MODEL, max_body_bytes=64 << 10)
    inside, most = 0, 0
    encode = live.pack.encode

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        try:
            time.sleep(0.05)
            return encode(*args, **kwargs)
        finally:
            inside -= 1

    monkeypatch.setattr(live.pack, "encode", counting, raising=False)
    with serve_in_thread(build_app(live.pack, config)) as url:
        statuses = post_all(url, large_body(config), 6)
    assert statuses == [400] * 6 and most == 1, (statuses, most)  # each too long for the context, after its turn
