"""The batched verify head on a real tiny pack's target (runtime/batched_verify.py: BatchedTarget over the batched
static form with graphs/batched_head.py): sampling requests through the scheduler, one run per step.

- N seeded requests together (sampling at several settings, greedy, model and n-gram drafters, k 0 to 4) give each the
  tokens it gives alone on the per-slot pack: the same uniforms, the same chain rule per row.
- Cancelling one row leaves the others' tokens as they are alone.
- Chi-square per request under batching: STREAMS of generations (each its own setting and k) run mixed in batches of
  up to 4 rows through the scheduler; each stream's continuations against exact probabilities from the target's
  transformers model (tests/e2e/test_sampling_distribution.py's partitions). The same test with the head built by
  the `draft_counts_ignored` mutation (tests/mutations.py) fails it. The same with solo rows that join the batch
  (scheduler.py): p 0.15 / 0.61 / 0.60 at 600 (each generation's tokens are its lone tokens, so the streams' p equal
  the batched ones'); a join that marks its rows cached without running them fails it (p 0 for the k 3 stream).

Power (docs/testing.md). SAMPLES = 600 generations per stream (three streams in one scheduler), P_FAIL = 1e-3: each
stream's bins detect an effect of Cohen's w >= 0.31-0.35 with 99 % power (`detectable_effect`); the slow set repeats
it at 3,000 (w >= 0.15-0.17). Measured 2026-11-27 (2-core EPYC): correct p = 0.15, 0.61, 0.60 at 600 and 0.29, 0.24,
0.07 at 3,000; the mutation at 600: p = 5e-12 (k 1), 7e-36 (k 2), 0 (k 3: an impossible continuation) - a row's
k falls below the batch's K near its budget too. A second check of the chain rule the head's bit-exact test
(tests/graphs/test_batched_head.py) pins row by row, through the whole path: scheduler, engine, graph.
The batched graph is exported once per code version into the tiny store (~20 s); the head is attached per test (~1 s).
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import specpack
from specpack.graphs.attach import build_batched_verify_graph
from specpack.runtime.backend import BackendOptions
from specpack.runtime.batch_k import NoCap
from specpack.runtime.batched_verify import BatchedTarget
from specpack.runtime.k_policy import FixedK
from specpack.runtime.loop import Decoding
from specpack.runtime.pack import Pack
from specpack.runtime.request import GenerateRequest
from specpack.runtime.scheduler import Row, Scheduler, SchedulerConfig
from specpack.runtime.state import DecodeState
from specpack.runtime.stats import DecodeStats
from specpack.sampling import SamplingParams, Uniforms
from tests.distribution import chi_square_pvalue, detectable_effect
from tests.e2e.test_sampling_distribution import PartitionFor, TargetLogits, partitions
from tests.mutations import batched_head_mutation

FAMILY, DRAFT, SLOTS = "qwen2", "noisy", 4
PROMPT = "def add(a, b):"
SAMPLES, P_FAIL = 600, 1e-3
SIZES = [SAMPLES, pytest.param(3_000, marks=pytest.mark.slow)]  # the slow set: the same streams at 5x
STREAMS = [(SamplingParams(1.0), 1), (SamplingParams(0.5), 2), (SamplingParams(1.0, top_k=5), 3)]  # (params, k)
# the batched verify's plain form serves temperature-only rows (graphs/batched_plain_form.py)
PLAIN_STREAMS = [(SamplingParams(1.0), 1), (SamplingParams(0.5), 2), (SamplingParams(0.8), 3)]


@pytest.fixture(scope="module")
def batched_plain(tiny_batched_plain) -> Path:  # type: ignore[no-untyped-def]
    return tiny_batched_plain(FAMILY, DRAFT)


def batched_tokens(pack: Pack, requests: list[GenerateRequest]) -> tuple[list[list[int]], int]:
    """Every request submitted at once through the pack's batched engines (BatchedTarget and the batched draft, no cap
    on k): each request's tokens, and the most rows one verify ran."""
    batcher = pack.start_batching(batch_policy=NoCap(), solo=False)
    target = batcher.scheduler.verifier
    assert isinstance(target, BatchedTarget) and batcher.scheduler.row_drafter is not None
    tokens = [h.result(timeout=120).tokens for h in [pack.submit(r) for r in requests]]
    return tokens, max(target.runs)


def verify_graph(plain: Path, out_dir: Path, vocab: int) -> Path:
    """The batched verify graph in out_dir."""
    return attached_copy(plain, out_dir / "verify_batched.onnx", vocab, build_batched_verify_graph)


def attached_copy(plain: Path, out: Path, vocab: int, build: Callable[[Path, Path, int], None]) -> Path:
    """`build` (a graphs/attach.py builder) over a copy of the plain graph beside `out` (attach moves its weights)."""
    for path in plain.parent.iterdir():
        if path.name.startswith(plain.name):
            shutil.copy(path, out.parent / path.name)
    build(out.parent / plain.name, out, vocab)
    return out


@pytest.fixture(scope="module")
def pack_dir(tiny_pack) -> Path:  # type: ignore[no-untyped-def]
    return tiny_pack(FAMILY, DRAFT)[0]


@pytest.fixture(scope="module")
def alone(pack_dir: Path) -> Iterator[Pack]:
    with specpack.load(pack_dir, threads=1) as pack:
        yield pack


@pytest.fixture(scope="module")
def slots_pack(pack_dir: Path) -> Iterator[Pack]:
    """The pack with SLOTS cache slots: its per-slot draft model drafts for the chi-square's rows."""
    with specpack.load(pack_dir, threads=1, options=BackendOptions(slots=SLOTS)) as pack:
        yield pack


@pytest.fixture(scope="module")
def graph(batched_plain: Path, alone: Pack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return verify_graph(batched_plain, tmp_path_factory.mktemp("batched"), alone.manifest.vocab_size)


def engine(path: Path, pack: Pack) -> BatchedTarget:
    m, t = pack.manifest, pack.manifest.target
    return BatchedTarget(path, vocab_size=m.vocab_size, num_layers=t.num_layers, kv_heads=t.kv_heads,
                         head_dim=t.head_dim, width=m.max_len + m.k_max + 1, slots=SLOTS, k_max=m.k_max, threads=1)


def _requests(pack: Pack) -> list[GenerateRequest]:
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, pack.manifest.vocab_size - 8, 8 + 3 * i).tolist() for i in range(5)]
    kinds: list[dict[str, object]] = [
        {"k": 2, "temperature": 1.0, "seed": 1}, {"k": 4, "temperature": 0.7, "top_k": 20, "seed": 2},
        {"k": 3, "drafter": "ngram", "temperature": 1.2, "top_p": 0.9, "seed": 3}, {"k": 0, "temperature": 1.0, "seed": 4},
        {"k": 3}]  # the last greedy
    return [GenerateRequest.of(p, 16, limits=pack.limits, **kind)  # type: ignore[arg-type]
            for p, kind in zip(prompts, kinds, strict=True)]


def test_seeded_requests_get_their_lone_tokens(pack_dir: Path, alone: Pack, graph: Path) -> None:
    """Five requests (four sampling, one greedy) on four rows: each its lone tokens, most steps one run of all."""
    requests = _requests(alone)
    expected = [alone.generate_request(r).tokens for r in requests]
    with specpack.load(pack_dir, threads=1, options=BackendOptions(slots=SLOTS)) as pack:
        target = engine(graph, pack)
        pack.start_batching(batched=target, batch_policy=NoCap(), solo=False)
        got = [h.result(timeout=120).tokens for h in [pack.submit(r) for r in requests]]
    assert got == expected
    assert target.runs.count(SLOTS) > len(target.runs) // 3  # the rows verified together


def test_cancelling_one_row_leaves_the_others_alone(pack_dir: Path, alone: Pack, graph: Path) -> None:
    requests = _requests(alone)[:3]
    expected = [alone.generate_request(r).tokens for r in requests]
    with specpack.load(pack_dir, threads=1, options=BackendOptions(slots=SLOTS)) as pack:
        pack.start_batching(batched=engine(graph, pack), batch_policy=NoCap(), solo=False)
        pieces: list[str] = []
        handles = [pack.submit(r) for r in requests[:1]]
        doomed = pack.submit(requests[1], on_text=pieces.append)
        handles.append(pack.submit(requests[2]))
        while len(pieces) < 2:  # it decodes alongside the others: cancel mid-stream
            threading.Event().wait(0.001)
        doomed.cancel()
        out = [h.result(timeout=120) for h in handles]
        assert doomed.result(timeout=120).finish_reason == "cancelled"
    assert [o.tokens for o in out] == [expected[0], expected[2]]


# -------------------------------------------------------------------------------- chi-square per request


@pytest.fixture(scope="module")
def exact(tiny_pack, alone: Pack) -> PartitionFor:  # type: ignore[no-untyped-def]
    return partitions(TargetLogits(tiny_pack(FAMILY, DRAFT)[2], alone.encode(PROMPT)), alone.eos_ids)


def draw_streams(pack: Pack, graph: Path, exact: PartitionFor, n: int, together: bool = False,
                 swapped: bool = False, streams: list[tuple[SamplingParams, int]] = STREAMS, solo: bool = False
                 ) -> list[list[tuple[int, ...]]]:
    """n generations per `streams` stream, submitted round-robin to one scheduler over BatchedTarget: rows of different
    settings and k verify together. Each generation has its own seed, asks k + 2 tokens, and leaves as soon as its
    tokens fix its bin (a halted row: the scheduler's leave phase). together: the joining rows' prefills in one run
    (Scheduler.row_prefill, as on a GPU), so their first tokens are drawn in one run; swapped (a planted defect):
    that run's results handed to its rows in reverse order. solo: solo rows that join the batch (scheduler.py, as on
    a GPU): round i's generation of stream i % len(streams) is admitted alone (its prefill and one step on the pack's
    per-slot target), then the round's others, whose admission moves it onto the batched target; rounds one after the
    other. A graph without top_k / top_p inputs (the plain form) is handed the others only, as DeviceCaches binds a
    form's own inputs."""
    m, prompt = pack.manifest, pack.encode(PROMPT)
    target = engine(graph, pack)
    wanted, run = target.caches.input_names, target.caches.run
    target.caches.run = lambda inputs, outputs, **kw: run({k: v for k, v in inputs.items() if k in wanted},  # type: ignore[method-assign]
                                                          outputs, **kw)
    if swapped:
        verify_rows = target.verify_rows

        def reversed_prefills(rows):  # type: ignore[no-untyped-def]
            results = verify_rows(rows)
            first = all(state.length == state.prompt_length for state, _ in rows)  # prefills proper
            return results[::-1] if first else results

        target.verify_rows = reversed_prefills  # type: ignore[method-assign]
    out: list[list[tuple[int, ...]]] = [[] for _ in streams]
    with pack.exclusive():
        drafter = pack.drafters["model"]

        def open_row(job: tuple[int, int], slot: int, verifier: Any = target) -> Row[tuple[int, int]]:
            s, i = job
            params, k = streams[s]
            part = exact(params, k + 2, n)
            state = DecodeState.start(prompt, k + 2, params, Uniforms(params, m.k_max, seed=1000 * s + i),
                                      eos_ids=pack.eos_ids, max_len=m.max_len, k_max=m.k_max, stats=DecodeStats(k=k),
                                      slot=slot)
            halt = threading.Event()

            def on_tokens(new: list[int]) -> None:
                if part.decided(tuple(state.out)):
                    halt.set()

            return Row(job, slot, Decoding(state, verifier, drafter, FixedK(k), on_tokens), halt, own_k=True)

        def finish_row(row: Row[tuple[int, int]], outcome: str | BaseException) -> None:
            if isinstance(outcome, BaseException):
                raise outcome
            out[row.job[0]].append(tuple(row.state.out))

        per_slot = pack.backend.target()
        scheduler = Scheduler(SchedulerConfig(max_batch=SLOTS), target, open_row, finish_row, target,
                              batch_policy=NoCap(), row_prefill=target if together else None,
                              open_solo=partial(open_row, verifier=per_slot) if solo else None, solo_joins=solo)
        if solo:
            for i in range(n):
                first = i % len(streams)
                scheduler.add((first, i))
                scheduler.step()  # admitted alone: its prefill and a step on the per-slot target
                for s in range(len(streams)):
                    if s != first:
                        scheduler.add((s, i))
                while not scheduler.idle:
                    scheduler.step()
        else:
            for i in range(n):
                for s in range(len(streams)):
                    scheduler.add((s, i))
            while not scheduler.idle:
                scheduler.step()
    target.close()
    assert max(target.runs) == (len(streams) if solo else SLOTS)  # solo: a round's rows, the joined one among them
    return out


def pvalues(samples: list[list[tuple[int, ...]]], exact: PartitionFor, n: int,
            streams: list[tuple[SamplingParams, int]] = STREAMS) -> list[float]:
    ps = []
    for (params, k), continuations in zip(streams, samples, strict=True):
        part = exact(params, k + 2, n)
        ps.append(chi_square_pvalue([part.bin_of(c) for c in continuations], part.probs))
    return ps


@pytest.mark.parametrize("together", [False, True])
@pytest.mark.parametrize("n", SIZES)
def test_each_request_has_the_targets_distribution_under_batching(slots_pack: Pack, graph: Path,
                                                                  exact: PartitionFor, n: int, together: bool) -> None:
    ps = pvalues(draw_streams(slots_pack, graph, exact, n, together), exact, n)
    print(f"batched streams {STREAMS} n={n} prefills together {together}: p = {ps}, detectable w = "
          f"{[round(detectable_effect(n, len(exact(p, k + 2, n).probs)), 3) for p, k in STREAMS]}")
    assert min(ps) > P_FAIL


def test_solo_rows_that_join_the_batch_keep_each_requests_distribution(slots_pack: Pack, graph: Path,
                                                                      exact: PartitionFor) -> None:
    """Solo rows (scheduler.py): a generation admitted alone draws its first token and a step on the per-slot target,
    then joins the batch (its rows in the batched caches from one prefill run) as the others are admitted; every
    stream's chi-square, a third of its generations so."""
    ps = pvalues(draw_streams(slots_pack, graph, exact, SAMPLES, solo=True), exact, SAMPLES)
    print(f"solo rows joining: p = {ps}")
    assert min(ps) > P_FAIL


def test_solo_rows_joining_without_their_cache_rows_fail_it(slots_pack: Pack, graph: Path, exact: PartitionFor,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The join's planted defect: its prefill run marks the rows cached without running (the batched caches hold a
    previous request's rows there), so the joined row's next steps read a wrong context."""
    def marked(self: BatchedTarget, state: DecodeState, end: int) -> None:
        self.lengths[state.slot] = end

    monkeypatch.setattr(BatchedTarget, "prefill_chunk", marked)
    ps = pvalues(draw_streams(slots_pack, graph, exact, SAMPLES, solo=True), exact, SAMPLES)
    print(f"solo rows joining without their rows: p = {ps}")
    assert min(ps) < P_FAIL


def test_a_head_that_ignores_draft_counts_fails_it(batched_plain: Path, slots_pack: Pack, exact: PartitionFor,
                                                   tmp_path: Path) -> None:
    with batched_head_mutation("draft_counts_ignored"):
        broken = verify_graph(batched_plain, tmp_path, slots_pack.manifest.vocab_size)
    ps = pvalues(draw_streams(slots_pack, broken, exact, SAMPLES), exact, SAMPLES)
    print(f"draft_counts ignored: p = {ps}")
    assert ps[0] < P_FAIL  # the k = 1 stream, batched with k = 2 and 3 rows


def test_prefills_together_with_their_first_tokens_swapped_fail_it(graph: Path, slots_pack: Pack,
                                                                    exact: PartitionFor) -> None:
    """The together path's planted defect: the joining rows' first tokens handed out in reverse order (rows of
    temperature 1 and 0.5, top-k 5, drawn in one run, get each other's)."""
    ps = pvalues(draw_streams(slots_pack, graph, exact, SAMPLES, together=True, swapped=True), exact, SAMPLES)
    print(f"first tokens swapped: p = {ps}")
    assert min(ps) < P_FAIL



def plain_form(graph: Path) -> Path:
    """The batched verify graph's plain form beside it (its weights in the same data file)."""
    from specpack.graphs.batched_plain_form import batched_plain_form

    out = graph.with_name(graph.stem + "_plain.onnx")
    out.write_bytes(batched_plain_form(graph))
    return out


@pytest.mark.parametrize("counts_ignored", [False, True], ids=["plain-form", "plain-form-draft-counts-ignored"])
def test_the_plain_form_keeps_each_requests_distribution(batched_plain: Path, graph: Path, slots_pack: Pack,
                                                         exact: PartitionFor, tmp_path: Path,
                                                         counts_ignored: bool) -> None:
    """The batched verify's plain form (what a device runs for batches of greedy and temperature-only rows): the same
    chi-square per stream, PLAIN_STREAMS mixed in one scheduler; and the plain form of a head built with the
    `draft_counts_ignored` defect (every row verifies K drafts: pad drafts, q and uniforms read as its own) fails it."""
    source = graph
    if counts_ignored:
        with batched_head_mutation("draft_counts_ignored"):
            source = verify_graph(batched_plain, tmp_path, slots_pack.manifest.vocab_size)
    ps = pvalues(draw_streams(slots_pack, plain_form(source), exact, SAMPLES, streams=PLAIN_STREAMS), exact, SAMPLES,
                 PLAIN_STREAMS)
    print(f"plain form, draft counts ignored {counts_ignored}: p = {ps}")
    if counts_ignored:
        assert min(ps) < P_FAIL
    else:
        assert min(ps) > P_FAIL


# ------------------------------------------------------------------------------------------- into the pack


@pytest.mark.slow  # a pack export with --max-batch (~60 s on 2 cores)
def test_a_pack_exported_with_max_batch_batches_with_its_own_graphs(tiny_export, alone: Pack) -> None:  # type: ignore[no-untyped-def]
    """spec-export --max-batch 4 writes verify_batched.onnx and draft_batched.onnx, the manifest records them, and
    start_batching picks them: greedy rows draft together, every row verifies in one run, each request its lone tokens
    (the pack without --max-batch is `alone`: old packs load and decode as before)."""
    from specpack.errors import SpecpackError
    from specpack.names import BATCHED_FILES

    pack_dir = tiny_export(FAMILY, DRAFT, max_batch=SLOTS)
    requests = _requests(alone)
    expected = [alone.generate_request(r).tokens for r in requests]
    assert alone.manifest.target.batched is None
    with specpack.load(pack_dir, threads=1, options=BackendOptions(slots=SLOTS)) as pack:
        m = pack.manifest
        assert m.target.batched is not None and m.draft.batched is not None
        assert (m.target.batched.max_batch, m.target.batched.head, m.draft.batched.head) == (SLOTS, "verify", "greedy")
        assert [m.target.batched.graph.path, m.draft.batched.graph.path] == [BATCHED_FILES["target"],
                                                                            BATCHED_FILES["draft"]]
        assert batched_tokens(pack, requests) == (expected, SLOTS)
    with specpack.load(pack_dir, threads=1, options=BackendOptions(slots=SLOTS + 1)) as pack, \
            pytest.raises(SpecpackError, match="exported for"):
        pack.start_batching(solo=False)
