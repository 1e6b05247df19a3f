"""The batched static form (export/batched_attention.py, batched_export.py) and its greedy engine
(runtime/batched_target.py): rows of different committed lengths in one ONNX Runtime run, each with the logits it has
alone, and requests through the scheduler with one run per step giving the tokens they give alone.

Slow (its checks against transformers and the greedy-only engine); the batched plain graphs come from the tiny store
(conftest.py's tiny_batched_plain), exported once per code version."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import specpack
from specpack import names
from specpack.errors import SpecpackError
from specpack.graphs.attach import build_batched_greedy_graph
from specpack.runtime.backend import BackendOptions
from specpack.runtime.batch_k import NoCap
from specpack.runtime.batched_target import BatchedGreedyTarget
from specpack.runtime.request import GenerateRequest
from tests.runtime.test_batched_sampling import attached_copy

pytestmark = pytest.mark.slow
VOCAB = 330  # the tiny pairs' vocabulary (tests/tiny.py)


@pytest.fixture(scope="module")
def batched_graph(tiny_batched_plain, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the batched plain graph, a copy with the greedy head) of the qwen2 noisy pair's target."""
    plain = tiny_batched_plain("qwen2", "noisy")
    out = tmp_path_factory.mktemp("batched") / "target_greedy.onnx"
    return plain, attached_copy(plain, out, VOCAB, build_batched_greedy_graph)


@pytest.fixture(scope="module")
def batched_draft_graph(tiny_batched_plain, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pair's draft in the batched form, with the greedy head."""
    out = tmp_path_factory.mktemp("batched") / "draft_greedy.onnx"
    return attached_copy(tiny_batched_plain("qwen2", "noisy", "draft"), out, VOCAB, build_batched_greedy_graph)


def _engine(path: Path, model: Any, manifest: Any, slots: int) -> BatchedGreedyTarget:
    """A greedy batched engine over `path` with `model`'s cache shape and the pack's serving width."""
    return BatchedGreedyTarget(path, num_layers=model.num_layers, kv_heads=model.kv_heads, head_dim=model.head_dim,
                               width=manifest.max_len + manifest.k_max + 1, slots=slots, k_max=manifest.k_max, threads=1)


def test_each_row_has_the_logits_it_has_alone(tiny_pairs, batched_graph: tuple[Path, Path]) -> None:
    """Three rows cached to lengths 0, 4 and 9 (a run of 9 tokens each, then lengths set as a rollback would), then one
    run of 3 new tokens per row: each row's logits are transformers' over its own sequence."""
    import onnxruntime as ort
    import torch
    from transformers import AutoModelForCausalLM

    from specpack.export.model_info import read_model_info

    target_dir = tiny_pairs("qwen2", "noisy")[1]
    info = read_model_info(target_dir)
    session = ort.InferenceSession(str(batched_graph[0]), providers=["CPUExecutionProvider"])
    lengths, seq, width = [0, 4, 9], 3, 32
    rng = np.random.default_rng(0)
    seqs = rng.integers(0, 300, (len(lengths), 20))  # [B, 20] ids (the tiny vocabulary is 330)
    past = [np.zeros((len(lengths), info.kv_heads, width, info.head_dim), np.float32)
            for _ in range(2 * info.num_layers)]

    def run(starts: list[int], n: int) -> np.ndarray:
        mask = (np.arange(width)[None] < np.array(starts)[:, None] + n).astype(np.int64)  # [B, M]
        feeds = {names.INPUT_IDS: np.stack([s[st : st + n] for s, st in zip(seqs, starts, strict=True)]),
                 names.POSITION_IDS: np.stack([np.arange(st, st + n) for st in starts]), names.ATTENTION_MASK: mask,
                 **dict(zip(names.kv_names(info.num_layers, "past"), past, strict=True))}
        logits, *present = session.run(None, feeds)
        past[:] = present
        return logits  # [B, n, V]

    run([0, 0, 0], 9)
    logits = run(lengths, seq)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for b, length in enumerate(lengths):
            want = model(torch.tensor(seqs[b : b + 1, : length + seq])).logits[0, length:].numpy()
            np.testing.assert_allclose(logits[b], want, atol=2e-5)


def test_requests_through_one_run_per_step(tiny_pack, batched_graph: tuple[Path, Path]) -> None:
    pack_dir = tiny_pack("qwen2", "noisy")[0]
    with specpack.load(pack_dir, threads=1) as alone, \
            specpack.load(pack_dir, threads=1, options=BackendOptions(slots=4)) as pack:
        m, t = pack.manifest, pack.manifest.target
        rng = np.random.default_rng(3)
        prompts = [rng.integers(0, m.vocab_size - 8, 12 - i).tolist() for i in range(4)]
        kinds: list[dict[str, object]] = [{"k": None}, {"k": 0}, {"k": 3}, {"k": 4, "drafter": "ngram"}]
        requests = [GenerateRequest.of(p, 20, limits=pack.limits, **kinds[i])  # type: ignore[arg-type]
                    for i, p in enumerate(prompts)]
        expected = [alone.generate_request(r).tokens for r in requests]
        engine = BatchedGreedyTarget(batched_graph[1], num_layers=t.num_layers, kv_heads=t.kv_heads,
                                     head_dim=t.head_dim, width=m.max_len + m.k_max + 1, slots=4, k_max=m.k_max,
                                     threads=1)
        pack.start_batching(batched=engine, solo=False)
        handles = [pack.submit(r) for r in requests]
        assert [h.result(timeout=60).tokens for h in handles] == expected
        assert max(engine.runs) == 4 and engine.runs.count(4) > len(engine.runs) // 2  # most steps: all rows at once
        cap = pack._batcher.scheduler.batch_policy  # type: ignore[union-attr]
        assert sum(map(len, cap.verify)) > 0  # the batched steps' costs measured: the cap on k follows them
        sampled = pack.submit(GenerateRequest.of(prompts[0], 4, temperature=1.0, limits=pack.limits))
        with pytest.raises(SpecpackError, match="greedy chains only"):
            sampled.result(timeout=60)


def test_drafts_and_verifies_through_one_run_each(tiny_pack, batched_graph: tuple[Path, Path],
                                                  batched_draft_graph: Path) -> None:
    """The draft model batched too: every row's j-th draft in one run, then one verify run; each request its lone
    tokens, with the same acceptance as per-slot drafting (the same model, the same greedy drafts)."""
    from specpack.runtime.batched_draft import BatchedGreedyDrafter

    pack_dir = tiny_pack("qwen2", "noisy")[0]
    with specpack.load(pack_dir, threads=1) as alone, \
            specpack.load(pack_dir, threads=1, options=BackendOptions(slots=3)) as pack:
        m = pack.manifest
        rng = np.random.default_rng(5)
        prompts = [rng.integers(0, m.vocab_size - 8, 10 + 3 * i).tolist() for i in range(3)]
        requests = [GenerateRequest.of(p, 24, k=k, drafter="model", limits=pack.limits)
                    for p, k in zip(prompts, (2, 4, 6), strict=True)]
        lone = [alone.generate_request(r) for r in requests]
        draft_engine = _engine(batched_draft_graph, m.draft, m, slots=3)
        pack.start_batching(batched=_engine(batched_graph[1], m.target, m, slots=3),
                            batched_draft=BatchedGreedyDrafter(draft_engine),
                            batch_policy=NoCap(), solo=False)  # every row drafts its own k (the cap would follow this machine)
        out = [h.result(timeout=60) for h in [pack.submit(r) for r in requests]]
    assert [o.tokens for o in out] == [g.tokens for g in lone]
    assert [o.stats.accepted for o in out] == [g.stats.accepted for g in lone]
    assert draft_engine.runs.count(3) > 3  # the rows' drafts ran together


def test_rows_catch_up_together_where_a_run_costs_its_launch(tiny_pack, batched_graph: tuple[Path, Path],
                                                              batched_draft_graph: Path) -> None:
    """`together` (a GPU's default): rows whose draft trails (new requests, rows after k 0 steps) catch up in shared
    runs, every row padded to the longest: the same drafts and tokens as one run per row (the CPU's default), in
    fewer draft runs, one of them over several rows' catch-ups."""
    from specpack.runtime.batched_draft import BatchedGreedyDrafter

    pack_dir = tiny_pack("qwen2", "noisy")[0]
    outcomes, runs = {}, {}
    for together in (False, True):
        with specpack.load(pack_dir, threads=1, options=BackendOptions(slots=3)) as pack:
            m = pack.manifest
            rng = np.random.default_rng(5)
            requests = [GenerateRequest.of(rng.integers(0, m.vocab_size - 8, 10 + 7 * i).tolist(), 24, k=k,
                                           drafter="model", limits=pack.limits) for i, k in enumerate((3, 0, 5))]
            draft_engine = _engine(batched_draft_graph, m.draft, m, slots=3)
            drafter = BatchedGreedyDrafter(draft_engine, together=together)
            caught: list[int] = []  # rows of each catch-up run
            real_run = draft_engine.run

            def spy(tokens, real_run=real_run, caught=caught):  # type: ignore[no-untyped-def]
                if min(len(t) for t in tokens.values()) > 2:  # a catch-up (a draft run feeds 1 or 2 tokens a row)
                    caught.append(len(tokens))
                return real_run(tokens)

            draft_engine.run = spy  # type: ignore[method-assign]
            pack.start_batching(batched=_engine(batched_graph[1], m.target, m, slots=3), batched_draft=drafter,
                                batch_policy=NoCap(), solo=False)
            out = [h.result(timeout=60) for h in [pack.submit(r) for r in requests]]
            outcomes[together] = [(o.tokens, o.stats.accepted) for o in out]
            runs[together] = (len(draft_engine.runs), caught)
    assert outcomes[True] == outcomes[False]
    assert max(runs[False][1]) == 1 and max(runs[True][1]) > 1, runs  # apart: one row a run; together: several
    assert runs[True][0] < runs[False][0], runs


def _earlier_greedy_graph(plain: Path, out: Path, vocab: int) -> None:
    """The batched greedy head of packs exported before 2026-12-06: the argmax at every position (`best` [B, S], no
    draft_counts / token_counts), for the engine's reading of older packs."""
    from specpack.graphs.attach import _attach
    from specpack.graphs.batched_head import add_batched_greedy_head
    from specpack.graphs.heads import HeadIO
    from specpack.graphs.onnx_builder import INT64, tensor_info

    io = HeadIO(inputs=[], outputs=[tensor_info(names.BEST, INT64, ["batch_size", "sequence_length"])],
                rows=lambda b: b.op("Shape", names.INPUT_IDS, start=1, end=2), select=lambda b, x: x)
    _attach(plain, out, vocab, add_batched_greedy_head, io)


def test_the_greedy_head_reads_each_rows_last_positions(tiny_pairs, tiny_batched_plain, tmp_path: Path) -> None:
    """best [B, K+1]: row b's argmax at its positions S_b - k_b - 1 .. S_b - 1 (the lm_head computes K + 1 rows per
    batch row), what the earlier head's argmax at every position gives there."""
    import onnxruntime as ort

    from specpack.export.model_info import read_model_info

    plain = tiny_batched_plain("qwen2", "noisy")
    sessions = {}
    for name, build in (("now", build_batched_greedy_graph), ("earlier", _earlier_greedy_graph)):
        (tmp_path / name).mkdir()
        path = attached_copy(plain, tmp_path / name / f"{name}.onnx", VOCAB, build)
        sessions[name] = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert {i.name for i in sessions["now"].get_inputs()} >= {names.DRAFT_COUNTS, names.TOKEN_COUNTS}
    info, width = read_model_info(tiny_pairs("qwen2", "noisy")[1]), 16
    past = dict.fromkeys(names.kv_names(info.num_layers, "past"),
                         np.zeros((3, info.kv_heads, width, info.head_dim), np.float32))
    ids = np.random.default_rng(7).integers(0, 300, (3, 9))  # [B, S]
    feeds = {names.INPUT_IDS: ids, names.POSITION_IDS: np.tile(np.arange(9), (3, 1)),
             names.ATTENTION_MASK: (np.arange(width)[None] < 9).astype(np.int64).repeat(3, 0), **past}
    every = sessions["earlier"].run([names.BEST], feeds)[0]  # [B, S]
    counts, lengths = np.array([0, 2, 1]), np.array([9, 5, 3])  # row 1: tokens 0-4, drafts at 3, 4; row 2: 0-2
    best = sessions["now"].run([names.BEST], {**feeds, names.DRAFT_COUNTS: counts, names.TOKEN_COUNTS: lengths})[0]
    assert best.shape == (3, 3)  # K + 1 = 3 positions per row, not S = 9
    for b in range(3):
        k, n = counts[b], lengths[b]
        np.testing.assert_array_equal(best[b, : k + 1], every[b, n - k - 1 : n])


def test_an_earlier_packs_greedy_head_drafts_the_same(tiny_pack, batched_draft_graph: Path, batched_graph: tuple[Path, Path],
                                                      tmp_path: Path, tiny_batched_plain) -> None:
    """A draft_batched.onnx with the earlier head (every position) drafts, through the same engine, the tokens the
    current head drafts: the engine reads its form from the graph's inputs."""
    from specpack.runtime.batched_draft import BatchedGreedyDrafter

    earlier = attached_copy(tiny_batched_plain("qwen2", "noisy", "draft"), tmp_path / "draft_earlier.onnx", VOCAB,
                            _earlier_greedy_graph)
    pack_dir = tiny_pack("qwen2", "noisy")[0]
    tokens = []
    for draft_graph in (batched_draft_graph, earlier):
        with specpack.load(pack_dir, threads=1, options=BackendOptions(slots=2)) as pack:
            m = pack.manifest
            drafts = _engine(draft_graph, m.draft, m, slots=2)
            pack.start_batching(batched=_engine(batched_graph[1], m.target, m, slots=2),
                                batched_draft=BatchedGreedyDrafter(drafts),
                                batch_policy=NoCap(), solo=False)
            rng = np.random.default_rng(11)
            requests = [GenerateRequest.of(rng.integers(0, m.vocab_size - 8, 7 + 5 * i).tolist(), 16, k=3,
                                           drafter="model", limits=pack.limits) for i in range(2)]
            out = [h.result(timeout=60) for h in [pack.submit(r) for r in requests]]
            tokens.append([(o.tokens, o.stats.accepted) for o in out])
    assert tokens[0] == tokens[1]
    assert sum(accepted for _, accepted in tokens[0]) > 0  # drafts were made and accepted
