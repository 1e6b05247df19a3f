"""The batched static form (export/batched_attention.py, batched_export.py) and its greedy engine
(runtime/batched_target.py): rows of different committed lengths in one ONNX Runtime run, each with the logits it has
alone, and requests through the scheduler with one run per step giving the tokens they give alone.

Slow (its checks against transformers and the greedy-only engine); the batched plain graphs come from the tiny store
(conftest.py's tiny_batched_plain), exported once per code version."""

from __future__ import annotations

from pathlib import Path

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
        pack.start_batching(batched=engine)
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

        def engine(path: Path, model: object) -> BatchedGreedyTarget:
            return BatchedGreedyTarget(path, num_layers=model.num_layers, kv_heads=model.kv_heads,  # type: ignore[attr-defined]
                                       head_dim=model.head_dim, width=m.max_len + m.k_max + 1, slots=3,  # type: ignore[attr-defined]
                                       k_max=m.k_max, threads=1)

        draft_engine = engine(batched_draft_graph, m.draft)
        pack.start_batching(batched=engine(batched_graph[1], m.target), batched_draft=BatchedGreedyDrafter(draft_engine),
                            batch_policy=NoCap())  # every row drafts its own k (the cap would follow this machine)
        out = [h.result(timeout=60) for h in [pack.submit(r) for r in requests]]
    assert [o.tokens for o in out] == [g.tokens for g in lone]
    assert [o.stats.accepted for o in out] == [g.stats.accepted for g in lone]
    assert draft_engine.runs.count(3) > 3  # the rows' drafts ran together
