"""Continuous batching on a real tiny pack (ONNX Runtime, CPU): requests submitted together, each decoded on its own
cache slot by the scheduler (runtime/scheduler.py) on the batcher's thread, give each request the tokens it gives
alone (greedy: any k, any drafter; sampling: the same seed), whatever joins, leaves or is cancelled beside it."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import specpack
from specpack.errors import SpecpackError
from specpack.runtime.backend import BackendOptions
from specpack.runtime.batcher import QueueFull
from specpack.runtime.pack import Pack
from specpack.runtime.request import GenerateRequest

SAMPLED = {"temperature": 1.0, "top_k": 40, "top_p": 0.95}


@pytest.fixture(scope="module")
def pack_dir(tiny_pack) -> Path:
    return tiny_pack("qwen2", "noisy")[0]


@pytest.fixture(scope="module")
def alone(pack_dir: Path) -> Pack:
    with specpack.load(pack_dir, threads=1) as pack:
        yield pack


def _load(pack_dir: Path, slots: int) -> Pack:
    return specpack.load(pack_dir, threads=1, options=BackendOptions(slots=slots))


def _prompts(pack: Pack, n: int, length: int = 12, seed: int = 3) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, pack.manifest.vocab_size - 8, length - i).tolist() for i in range(n)]


def _requests(pack: Pack, prompts: list[list[int]], **sampling: float) -> list[GenerateRequest]:
    """One request per prompt, each with its own k and drafter: adaptive, the target alone, fixed k, prompt lookup."""
    kinds = [{"k": None}, {"k": 0}, {"k": 3}, {"k": 4, "drafter": "ngram"}, {"k": 8}]
    return [GenerateRequest.of(p, 20, limits=pack.limits, seed=11 + i if sampling else None, **kinds[i % len(kinds)],
                               **sampling) for i, p in enumerate(prompts)]


@pytest.mark.parametrize("sampling", [{}, SAMPLED], ids=["greedy", "sampled"])
def test_a_batch_gives_each_request_its_own_tokens(pack_dir: Path, alone: Pack, sampling: dict[str, float]) -> None:
    prompts = _prompts(alone, 5)
    expected = [alone.generate_request(r).tokens for r in _requests(alone, prompts, **sampling)]
    with _load(pack_dir, 4) as pack:
        batcher = pack.start_batching(max_waiting=4)
        handles = [pack.submit(r) for r in _requests(pack, prompts, **sampling)]  # 5 requests, 4 rows: one waits
        assert [h.result(timeout=60).tokens for h in handles] == expected
        assert max(batcher.batch_sizes) == 4 and pack.slots == 4
    assert all(len(t) == 20 or t[-1] in alone.eos_ids for t in expected)


def test_requests_join_a_running_batch_and_stream_their_text(pack_dir: Path, alone: Pack) -> None:
    """Submitted from several threads at different times (one while others decode), streamed by iterating the
    handle: the text equals the Generation's, and each request its lone run's."""
    prompts = _prompts(alone, 4, seed=5)
    requests = _requests(alone, prompts)
    expected = [alone.generate_request(r) for r in requests]
    with _load(pack_dir, 3) as pack:
        pack.start_batching()
        results: dict[int, tuple[str, list[int]]] = {}

        def client(i: int, after: threading.Event | None, started: threading.Event) -> None:
            if after is not None:
                assert after.wait(30)
            handle = pack.submit(requests[i])
            started.set()
            pieces = list(handle)
            results[i] = ("".join(pieces), handle.result().tokens)

        started = [threading.Event() for _ in requests]
        threads = [threading.Thread(target=client, args=(i, started[i - 1] if i else None, started[i]))
                   for i in range(len(requests))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert [results[i] for i in range(len(requests))] == [(g.text, g.tokens) for g in expected]


def test_cancelling_one_request_leaves_the_others_alone(pack_dir: Path, alone: Pack) -> None:
    prompts = _prompts(alone, 3, seed=7)
    requests = [GenerateRequest.of(p, 30, k=3, limits=alone.limits, seed=1, **SAMPLED) for p in prompts]
    expected = [alone.generate_request(r).tokens for r in requests]
    with _load(pack_dir, 3) as pack:
        pack.start_batching()
        seen: list[str] = []

        def cancel_after_two(piece: str) -> None:  # runs on the batcher's thread, between steps of every row
            seen.append(piece)
            if len(seen) == 2:
                handles[1].cancel()

        handles = [pack.submit(requests[0]), pack.submit(requests[1], on_text=cancel_after_two),
                   pack.submit(requests[2])]
        out = [h.result(timeout=60) for h in handles]
    assert out[1].finish_reason == "cancelled" and out[1].tokens == expected[1][: len(out[1].tokens)]
    assert len(out[1].tokens) < len(expected[1])
    assert [out[0].tokens, out[2].tokens] == [expected[0], expected[2]]


def test_a_failing_on_text_ends_its_request_only(pack_dir: Path, alone: Pack) -> None:
    prompts = _prompts(alone, 2, seed=9)
    requests = [GenerateRequest.of(p, 16, limits=alone.limits) for p in prompts]
    expected = alone.generate_request(requests[1]).tokens

    def boom(piece: str) -> None:
        raise ConnectionResetError("client went away")

    with _load(pack_dir, 2) as pack:
        failing, other = pack.submit(requests[0], on_text=boom), pack.submit(requests[1])
        with pytest.raises(ConnectionResetError):
            failing.result(timeout=60)
        assert other.result(timeout=60).tokens == expected
        assert pack.generate(prompts[0], 16).tokens == alone.generate(prompts[0], 16).tokens  # the slot is reusable


def test_admission_is_bounded_by_rows_and_waiting_places(pack_dir: Path, alone: Pack) -> None:
    """max_batch rows decode and max_waiting more wait; the next submit is refused at once (QueueFull), and a place
    frees up when a request ends. The batcher is held between steps (the pack's lock) so nothing finishes meanwhile."""
    request = GenerateRequest.of(_prompts(alone, 1)[0], 8, limits=alone.limits)
    with _load(pack_dir, 2) as pack:
        batcher = pack.start_batching(max_batch=2, max_waiting=1)
        with pack.exclusive():
            handles = [pack.submit(request) for _ in range(3)]
            with pytest.raises(QueueFull, match=r"at most 3 in flight \(max_batch 2 \+ max_waiting 1\)"):
                pack.submit(request)
        tokens = [h.result(timeout=60).tokens for h in handles]
        assert tokens == [alone.generate_request(request).tokens] * 3
        assert max(batcher.batch_sizes) == 2 and batcher.in_flight == 0
        pack.submit(request).result(timeout=60)
        with pytest.raises(SpecpackError, match="max_batch <= 2"):
            _load(pack_dir, 2).start_batching(max_batch=3)


def test_a_long_prompt_is_prefilled_in_chunks(pack_dir: Path, alone: Pack) -> None:
    """A prompt longer than prefill_chunk runs in chunks (one per iteration, beside the decoding rows) and gives the
    tokens of its unchunked prefill; so does the short request decoding beside it."""
    long_prompt, short_prompt = _prompts(alone, 1, length=45, seed=13)[0], _prompts(alone, 1, length=6, seed=17)[0]
    requests = [GenerateRequest.of(p, 12, k=3, limits=alone.limits) for p in (short_prompt, long_prompt)]
    expected = [alone.generate_request(r).tokens for r in requests]
    with _load(pack_dir, 2) as pack:
        batcher = pack.start_batching(prefill_chunk=8)
        target = pack.backend.target()
        chunks: list[int] = []
        real = target.prefill_chunk
        target.prefill_chunk = lambda state, end: (chunks.append(end), real(state, end))  # type: ignore[method-assign]
        handles = [pack.submit(r) for r in requests]
        assert [h.result(timeout=60).tokens for h in handles] == expected
    assert chunks == [8, 16, 24, 32, 40] and batcher.steps >= 6


def test_close_ends_requests_in_flight(pack_dir: Path, alone: Pack) -> None:
    """Every request in flight ends (two rows admitted, one waiting), each with its result or the closing error."""
    pack = _load(pack_dir, 2)
    request = GenerateRequest.of(_prompts(alone, 1)[0], 30, limits=alone.limits)
    with pack.exclusive():  # nothing decodes until close() takes over
        handles = [pack.submit(request) for _ in range(3)]
        closer = threading.Thread(target=pack.close)
        closer.start()
    closer.join(30)
    for handle in handles:
        try:
            handle.result(timeout=30)  # the first two may have run a step or all of them; the waiting one never started
        except SpecpackError as err:
            assert "closed while the request was in flight" in str(err)
    with pytest.raises(SpecpackError, match="closed"):
        pack.submit(request)
