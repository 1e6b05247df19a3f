"""Solo rows (runtime/scheduler.py; docs/batching.md, "A lone request"): with batched engines, a request admitted when
no other is there decodes alone on the per-slot engines of slot 0, as `generate` decodes it without a batch; requests
that arrive meanwhile batch on the other slots. On the cpu backend and the cuda backend's code on the CPU EP, over
test_cuda_batched's pack (the tiny pair's static pack with its batched graphs for 4 rows):

- a lone request (seeded sampling) runs no batched run and gives its lone tokens; with `solo=False` the same request
  runs through the batched graphs (the scheduler's old way), the same tokens;
- a long greedy request admitted alone stays solo while five more (greedy and seeded sampling, model and n-gram
  drafters) join and batch beside it, never on its slot: every request its lone tokens;
- where a batched run costs its launch (the caches set launch-bound, as on a GPU), a solo row (greedy or seeded
  sampling) joins the batch as the first other row is admitted (`solo_joins`: its cache rows there from one prefill
  run, a greedy row's drafts from the batched draft): every request its lone tokens, no solo row beside others.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specpack.contract.manifest import Manifest
from specpack.runtime.backends.cpu import OrtBackend
from specpack.runtime.backends.cuda import CudaBackend
from specpack.runtime.pack import Pack
from specpack.runtime.request import GenerateRequest
from specpack.runtime.scheduler import Row, Scheduler
from tests.runtime.test_cuda_batched import SLOTS, batched_pack, open_pack, requests

__all__ = ["batched_pack"]  # the fixture, used by name

BACKENDS: dict[str, tuple[Callable[..., object], dict[str, Any]]] = {
    "cpu": (OrtBackend, {}), "cuda-on-cpu-ep": (CudaBackend, {"device": "cpu", "precapture": False})}


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_lone_request_decodes_solo_with_its_lone_tokens(batched_pack: tuple[Path, Manifest], backend: str) -> None:
    pack_dir, m = batched_pack
    kind, options = BACKENDS[backend]
    request = requests(m.vocab_size)[0]  # seeded sampling, the model drafter, k 2
    for solo in (True, False):
        with open_pack(pack_dir, m, kind, **options) as pack:
            want = pack.generate_request(request).tokens  # no batcher yet: alone
            batcher = pack.start_batching(solo=solo)
            got = pack.submit(request).result(timeout=120).tokens
            runs = batcher.scheduler.verifier.runs  # type: ignore[attr-defined]  # the batched target's runs
        assert got == want, solo
        assert (runs == []) == solo, (solo, runs)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_requests_joining_a_solo_row_batch_beside_it(batched_pack: tuple[Path, Manifest], backend: str) -> None:
    pack_dir, m = batched_pack
    kind, options = BACKENDS[backend]
    long = GenerateRequest.of(requests(m.vocab_size)[2].prompt, 32, k=3)  # greedy, the model drafter
    with open_pack(pack_dir, m, kind, **options) as pack:
        want, got, seen, runs = _joined(pack, long, lambda: pack.start_batching())
    assert got == want
    assert seen[0] == [(0, True)]  # admitted alone: solo on slot 0
    assert all((0, True) in rows for rows in seen)  # solo to its end
    beside = [rows for rows in seen if len(rows) > 1]
    assert beside and all(slot != 0 for rows in beside for slot, solo in rows if not solo)  # never on its slot
    assert max(runs) >= 2  # the others batched together


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded-sampling"])
def test_a_solo_row_joins_the_batch_where_a_run_costs_its_launch(batched_pack: tuple[Path, Manifest], sampled: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pack_dir, m = batched_pack
    long = dataclasses.replace(requests(m.vocab_size)[1 if sampled else 2],  # seeded T 0.7 top-k 20 k 4, or greedy k 3
                               max_new_tokens=32)
    kind, options = BACKENDS["cuda-on-cpu-ep"]
    joined: list[tuple[int, int]] = []  # (the row's committed tokens, its cached rows in the batched target) at its join
    real = Scheduler._join_batch

    def join_batch(self: Scheduler[Any], row: Row[Any]) -> None:
        real(self, row)
        joined.append((row.state.length, engines.target.lengths[row.slot]))

    monkeypatch.setattr(Scheduler, "_join_batch", join_batch)
    with open_pack(pack_dir, m, kind, **options) as pack:
        engines = pack.backend.batched_engines(SLOTS)  # type: ignore[attr-defined]
        for caches in (engines.target.caches, engines.drafter.engine.caches):
            caches.staged = caches.launch_bound = True  # as on a GPU (test_cuda_batched's way)
        want, got, seen, runs = _joined(pack, long, lambda: pack.start_batching(
            batched=engines.target, batched_draft=engines.drafter))
    assert got == want
    # its cache rows in the batched caches from its own run (every committed token but the last), not fed again with
    # its next drafts in the batch's verify run (which would pad every row of that run to its length)
    assert len(joined) == 1 and joined[0][1] == joined[0][0] - 1 > 0, joined
    assert seen[0] == [(0, True)]  # admitted alone: solo on slot 0
    beside = [rows for rows in seen if len(rows) > 1]
    assert beside and all(not solo for rows in beside for _, solo in rows)  # joined: no solo row beside others
    assert any((0, False) in rows for rows in beside)  # it went on in the batch, on its slot
    assert max(runs) >= 2


def _joined(pack: Pack, long: GenerateRequest, start: Callable[[], object]
            ) -> tuple[list[list[int]], list[list[int]], list[list[tuple[int, bool]]], list[int]]:
    """The long request admitted alone, the six of test_cuda_batched submitted once it has its first text: (every
    request's lone tokens, its tokens so, (slot, solo) of every row at each text piece of the long one, the batched
    target's runs)."""
    others = requests(pack.manifest.vocab_size)
    started, submitted = threading.Event(), threading.Event()
    seen: list[list[tuple[int, bool]]] = []
    want = [pack.generate_request(r).tokens for r in (long, *others)]
    start()
    batcher = pack._batcher
    assert batcher is not None

    def on_text(_: str) -> None:  # on the batcher's thread, between steps
        seen.append([(row.slot, row.solo) for row in batcher.scheduler.rows])
        if not started.is_set():
            started.set()
            assert submitted.wait(60)  # the others queued while this row is alone

    first = pack.submit(long, on_text=on_text)
    assert started.wait(60)
    handles = [pack.submit(r) for r in others]
    submitted.set()
    got = [h.result(timeout=120).tokens for h in (first, *handles)]
    return want, got, seen, list(batcher.scheduler.verifier.runs)  # type: ignore[attr-defined]
