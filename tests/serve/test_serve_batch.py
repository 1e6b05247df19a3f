"""`specpack serve --max-batch 3`: requests decoded together by the runtime's scheduler (docs/batching.md), each
answered with the text it gets alone, the bounded queue (429) counted past the rows, a client that leaves cancelling
its row only. Places: --max-queue waiting or being tokenized, plus a place per free row beyond the first."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from conftest import MODEL, Live
from serve_harness import SlowPack, metric, wait_until

import specpack
from specpack.runtime.backend import BackendOptions
from specpack.serve.app import build_app
from specpack.serve.config import ServeConfig
from specpack.serve.server import serve_in_thread

PROMPTS = ["def fibonacci(n):\n    ", "import numpy as np\n", "class Stack:\n", "x = [1, 2, 3]\n"]


@pytest.fixture(scope="module")
def batched(tiny_pack, live: Live) -> Iterator[Live]:
    pack_dir: Path = tiny_pack("qwen2", "noisy")[0]
    pack = SlowPack(specpack.load(pack_dir, options=BackendOptions(slots=3)))
    app = build_app(pack, ServeConfig(pack_dir, max_queue=2, max_batch=3, model_name=MODEL))  # type: ignore[arg-type]
    with serve_in_thread(app) as url:
        yield Live(url, pack, live.reference, app, pack_dir)
    pack.close()


def _scrape(live: Live, client: openai.OpenAI, name: str) -> float:
    return metric(client.with_options(base_url=live.url).get("/metrics", cast_to=str), name)


def test_concurrent_clients_get_their_own_text(batched: Live) -> None:
    """Four clients at once (three rows, one waiting), greedy and seeded sampling: each its lone run's text."""
    expected = [batched.reference.generate(p, 24).text for p in PROMPTS]
    sampled = [batched.reference.generate(p, 24, temperature=1.0, seed=5 + i).text for i, p in enumerate(PROMPTS)]
    got: dict[tuple[int, bool], str] = {}

    def ask(i: int, sample: bool) -> None:
        with batched.client() as client:
            extra = {"temperature": 1.0, "seed": 5 + i} if sample else {"temperature": 0}
            out = client.completions.create(model=MODEL, prompt=PROMPTS[i], max_tokens=24, **extra)  # type: ignore[call-overload]
            got[(i, sample)] = out.choices[0].text

    for sample in (False, True):
        threads = [threading.Thread(target=ask, args=(i, sample)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert [got[(i, False)] for i in range(4)] == expected
    assert [got[(i, True)] for i in range(4)] == sampled
    with batched.client() as client:
        assert _scrape(batched, client, "specpack_batch_rows_count") > 0
        assert _scrape(batched, client, 'specpack_batch_rows_bucket{le="2.0"}') < _scrape(
            batched, client, 'specpack_batch_rows_bucket{le="4.0"}')  # some steps decoded 3 rows together


def test_the_queue_bound_counts_past_the_rows_and_a_leaving_client_frees_its_row(batched: Live) -> None:
    """Three streams decode, two requests wait (--max-queue 2): the next is answered 429. A stream that is closed
    cancels its row only: the others finish with their lone text, and a waiting request takes the row."""
    client = batched.client()
    batched.pack.delay = 0.02
    try:
        before = _scrape(batched, client, 'specpack_requests_cancelled_total{reason="disconnect"}')
        streams = [client.completions.create(model=MODEL, prompt=p, max_tokens=40, temperature=0, stream=True)
                   for p in PROMPTS[:3]]
        first = [next(s).choices[0].text for s in streams]
        assert wait_until(lambda: _scrape(batched, client, "specpack_running_requests") == 3)
        waiting: list[str] = []
        waiters = [threading.Thread(target=lambda: waiting.append(client.completions.create(
            model=MODEL, prompt=PROMPTS[3], max_tokens=8, temperature=0).choices[0].text)) for _ in range(2)]
        for waiter in waiters:
            waiter.start()
        assert wait_until(lambda: _scrape(batched, client, "specpack_queue_depth") == 2)
        with pytest.raises(openai.RateLimitError) as info:
            client.completions.create(model=MODEL, prompt="y", max_tokens=2)
        assert info.value.status_code == 429 and info.value.code == "queue_full"
        streams[1].close()  # this client leaves: its row is cancelled, the waiting request takes it
        assert wait_until(lambda: _scrape(batched, client, 'specpack_requests_cancelled_total{reason="disconnect"}')
                          == before + 1)
        batched.pack.delay = 0.0
        texts = [first[i] + "".join(c.choices[0].text for c in streams[i]) for i in (0, 2)]
        for waiter in waiters:
            waiter.join(60)
        assert texts == [batched.reference.generate(PROMPTS[i], 40).text for i in (0, 2)]
        assert waiting == [batched.reference.generate(PROMPTS[3], 8).text] * 2
    finally:
        batched.pack.delay = 0.0
        client.close()


def test_max_batch_above_the_slots_is_refused(live: Live) -> None:
    with pytest.raises(specpack.SpecpackError, match="max_batch <= 1"):
        build_app(live.reference, ServeConfig(live.pack_dir, max_batch=2))


def test_a_timeout_cancels_its_row_only(batched: Live) -> None:
    batched.pack.delay = 0.02
    client = batched.client()
    try:
        batched.decoder.timeout_s = 0.5  # the timer is set as a request is queued: this one only
        late: list[BaseException] = []
        doomed = threading.Thread(target=lambda: _capture(late, lambda: client.completions.create(
            model=MODEL, prompt=PROMPTS[0], max_tokens=200, temperature=0)))
        doomed.start()
        assert wait_until(lambda: _scrape(batched, client, "specpack_running_requests") == 1)
        batched.decoder.timeout_s = 600.0
        out = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=24, temperature=0)
        doomed.join(30)
        assert len(late) == 1 and getattr(late[0], "status_code", None) == 504, late
        assert out.choices[0].text == batched.reference.generate(PROMPTS[1], 24).text
    finally:
        batched.decoder.timeout_s = 600.0
        batched.pack.delay = 0.0
        client.close()


def test_shutdown_ends_every_row_cleanly(tiny_pack, live: Live) -> None:
    """Leaving the server (as SIGTERM does) with two streams decoding and no grace: each stream ends with an error
    event and [DONE], and the pack's batch ends (nothing hangs)."""
    pack_dir: Path = tiny_pack("qwen2", "noisy")[0]
    pack = SlowPack(specpack.load(pack_dir, options=BackendOptions(slots=2)))
    pack.delay = 0.05
    app = build_app(pack, ServeConfig(pack_dir, max_batch=2, shutdown_grace_s=0.0, model_name=MODEL))  # type: ignore[arg-type]
    ends: list[BaseException | None] = []
    with serve_in_thread(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
        streams = [client.completions.create(model=MODEL, prompt=p, max_tokens=200, temperature=0, stream=True)
                   for p in PROMPTS[:2]]
        for s in streams:
            next(s)

        def drain(stream: openai.Stream) -> None:  # type: ignore[type-arg]
            try:
                for _ in stream:
                    pass
                ends.append(None)
            except openai.APIError as err:
                ends.append(err)

        readers = [threading.Thread(target=drain, args=(s,)) for s in streams]
        for reader in readers:
            reader.start()
    for reader in readers:
        reader.join(30)
    assert len(ends) == 2 and all(isinstance(e, openai.APIError) and "shutting down" in e.message for e in ends), ends
    pack.close()


def _capture(into: list[BaseException], call) -> None:  # type: ignore[no-untyped-def]
    try:
        call()
    except BaseException as err:
        into.append(err)
