"""The cuda backend's batched engines on a GPU (ONNX Runtime's CUDA EP; backends/cuda_batched.py). Marked `gpu`: skipped
where the CUDA execution provider is missing; run on the test GPU.

    greedy   a tiny fp16 pack exported with --max-batch 4 (static cache, standard attention: the batched form's
             attention, so the lone run and the batched one compute the same ops): four greedy requests (k 0, 2, 4,
             auto) through the scheduler over the batched graphs, caches on the device, each the tokens it gets alone
             through the pack's batch-1 graphs on the same GPU (captured CUDA graphs), most verify steps one run of
             all four rows. A mismatch prints each request's first differing position: fp16 kernels of another shape
             may round a near-tie apart (docs/batching.md, "What remains"). Decode steps run as captured CUDA graphs
             (greedy batches on the verify graph's greedy form, the draft's greedy graph as exported): the test says
             how many shapes each captured, and fails if a capture was refused (each session's `error`). The batcher
             captures every decode step shape on its own thread before its first step (CUDA graphs are kept per
             thread: Backend.precapture_thread), so the requests run no warm-up run.
    sampling greedy and temperature-only sampling rows on the verify graph's plain form, captured, the model rows' q
             in place; first differences from the lone runs printed
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import specpack
from specpack.runtime.backend import BackendOptions
from specpack.runtime.backends.cuda_batched import DeviceCaches
from specpack.runtime.batch_k import NoCap
from specpack.runtime.batched_verify import BatchedTarget
from specpack.runtime.pack import Pack
from specpack.runtime.request import GenerateRequest

ort = pytest.importorskip("onnxruntime")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                                                  reason="needs ONNX Runtime's CUDA execution provider and a GPU")]

SLOTS = 4


def _pack(tiny_export: Any) -> Path:
    """A tiny fp16 pack with --max-batch SLOTS (static cache, standard attention: the batched form's attention)."""
    return tiny_export("qwen2", "noisy", k=4, dtype="fp16", kv_cache="static", attention="standard", max_batch=SLOTS)


def _lone(pack_dir: Path, kinds: list[dict[str, object]], seed: int) -> tuple[list[GenerateRequest], list[list[int]]]:
    """One request per kind (random prompts of 6, 10, 14, ... tokens, the kind's "new" tokens, else 32), and each
    one's tokens alone through the pack's batch-1 graphs on the GPU."""
    with specpack.load(pack_dir, device="cuda") as alone:
        vocab = alone.manifest.vocab_size
        rng = np.random.default_rng(seed)
        requests = [GenerateRequest.of(rng.integers(0, vocab - 8, 6 + 4 * i).tolist(), int(kind.get("new", 32)),  # type: ignore[call-overload]
                                       **{key: value for key, value in kind.items() if key != "new"})  # type: ignore[arg-type]
                    for i, kind in enumerate(kinds)]
        return requests, [alone.generate_request(r).tokens for r in requests]


@contextmanager
def _batching(pack_dir: Path) -> Iterator[tuple[Pack, BatchedTarget, DeviceCaches, Any]]:
    """The pack on SLOTS slots, batching (no cap on k) once the batcher's thread captured its shapes: (pack, its
    batched verify, that verify's device caches, the batcher)."""
    with specpack.load(pack_dir, device="cuda", options=BackendOptions(slots=SLOTS)) as pack:
        batcher = pack.start_batching(batch_policy=NoCap(), solo=False)
        target = batcher.scheduler.verifier
        assert isinstance(target, BatchedTarget) and isinstance(target.caches, DeviceCaches)
        assert batcher.prepared.wait(300) and batcher.broken is None, batcher.broken
        yield pack, target, target.caches, batcher


def _first_differences(tokens: list[list[int]], lone: list[list[int]]) -> list[int | None]:
    return [next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
            for got, want in zip(tokens, lone, strict=True)]


def test_fp16_batched_greedy_requests_get_their_lone_tokens_on_the_gpu(tiny_export: Any) -> None:
    requests, lone = _lone(_pack(tiny_export), [{"k": k} for k in (0, 2, 4, None)], seed=7)
    with _batching(_pack(tiny_export)) as (pack, target, caches, batcher):
        before = pack.backend.warmup_runs()
        tokens = [h.result(timeout=300).tokens for h in [pack.submit(r) for r in requests]]
        during = pack.backend.warmup_runs() - before
        draft = batcher.scheduler.row_drafter.engine.caches
        sessions = {"verify greedy form": caches.greedy_session, "draft": draft.session}
        captured = {label: (s.graphs_captured, s.error) for label, s in sessions.items() if s is not None}
    first_difference = _first_differences(tokens, lone)
    print(f"batched fp16 on {ort.get_device()}: verify runs {len(target.runs)}, rows per run {sorted(set(target.runs))}, "
          f"first difference per request {first_difference}; captured (shapes, refusal) {captured}; warm-up runs "
          f"before the requests {before}, during them {during}")
    assert tokens == lone, first_difference
    assert all(shapes > 0 and error is None for shapes, error in captured.values()), captured
    assert len(captured) == 2
    assert before > 0 and during == 0, (before, during)
    assert target.runs.count(SLOTS) > len(target.runs) // 3


def test_fp16_batched_sampling_rows_run_captured_on_the_plain_form(tiny_export: Any) -> None:
    """Greedy and temperature-only sampling rows (the model's drafts, q in place; one n-gram row, a host one-hot q)
    through the batcher on the GPU: the verify graph's plain form (graphs/batched_plain_form.py) captures its shapes
    with no refusal and serves those batches, the model rows' q bound in place once the n-gram row has left (a batch
    with an n-gram sampling row takes the host path: docs/cuda_backend.md; the first GPU run, H100 2026-12-07, had
    the n-gram row live in every batch and no run in place); each request's first difference from
    its lone run is printed (informative: fp16 kernels of another shape may round apart, and a sampled token follows
    its uniforms from there)."""
    kinds: list[dict[str, object]] = [{"k": 2}, {"k": 3, "temperature": 0.8, "seed": 1},
                                      {"k": None, "temperature": 1.0, "seed": 2},
                                      {"k": 2, "temperature": 0.9, "seed": 3, "drafter": "ngram", "new": 4}]
    requests, lone = _lone(_pack(tiny_export), kinds, seed=8)
    with _batching(_pack(tiny_export)) as (pack, target, caches, _):
        in_place: list[int] = []
        real_rows = target.q_rows
        assert real_rows is not None

        def counted(lo: int, hi: int, rows: Any) -> Any:
            in_place.append(hi - lo)
            return real_rows(lo, hi, rows)

        target.q_rows = counted
        tokens = [h.result(timeout=300).tokens for h in [pack.submit(r) for r in requests]]
        plain = caches.plain_session
        assert plain is not None
        captured = (plain.graphs_captured, plain.capture, plain.error)
    print(f"batched fp16 sampling rows on {ort.get_device()}: plain form (shapes, capture, refusal) {captured}; runs "
          f"with q in place {len(in_place)}; first difference per request from its lone run "
          f"{_first_differences(tokens, lone)}")
    assert all(len(t) > 0 for t in tokens)
    assert captured[0] > 0 and captured[1] and captured[2] is None, captured
    assert in_place, "no batched run bound the model rows' q in place"


def test_a_lone_request_runs_solo_on_the_captured_batch_1_graphs(tiny_export: Any) -> None:
    """A request alone on a batching pack (start_batching's default: solo rows, docs/batching.md "A lone request")
    decodes on slot 0's batch-1 graphs, captured on the batcher's thread before its first step: its lone tokens, no
    batched run, no warm-up run during it; then a second request joining a solo one (the solo row moves into the
    batch: launch-bound caches) keeps both requests' tokens within what fp16 kernels of another shape round apart
    (first differences printed)."""
    requests, lone = _lone(_pack(tiny_export), [{"k": None, "new": 48}, {"k": 2}], seed=9)
    with specpack.load(_pack(tiny_export), device="cuda", options=BackendOptions(slots=SLOTS, precapture="batcher")) as pack:
        batcher = pack.start_batching(batch_policy=NoCap())
        assert batcher.prepared.wait(300) and batcher.broken is None, batcher.broken
        target = batcher.scheduler.verifier
        before, runs_before = pack.backend.warmup_runs(), len(target.runs)  # the batcher's captures ran it already
        alone = pack.submit(requests[0]).result(timeout=300).tokens
        during, runs_alone = pack.backend.warmup_runs() - before, target.runs[runs_before:]
        first = pack.submit(requests[0])
        joined = [h.result(timeout=300).tokens for h in (first, pack.submit(requests[1]))]
    print(f"solo on {ort.get_device()}: warm-up runs before {before}, during the lone request {during}; batched runs "
          f"then {runs_alone}; joined: first differences {_first_differences(joined, lone)}, batched runs {len(target.runs)}")
    assert alone == lone[0]
    assert runs_alone == [] and during == 0, (runs_alone, during)
    assert all(len(t) > 0 for t in joined)
