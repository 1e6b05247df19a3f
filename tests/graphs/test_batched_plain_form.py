"""The plain form of the batched verify head (graphs/batched_plain_form.py): no control flow, and for batches of
greedy rows and temperature-only sampling rows the Scan's verdicts bit for bit on ONNX Runtime's CPU EP (and the
oracle's); a planted defect (the bonus row's q not zeroed) is caught by the same comparison."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from specpack.graphs.batched_head import batched_verify_head_model
from specpack.graphs.batched_plain_form import PLAIN_DROPPED, batched_plain_form
from specpack.sampling import SamplingParams

from .cases import VOCABS, cpu_session, verify_case
from .test_batched_head import batch_feeds, oracle_rows

BATCHES = 300


def _plain_params(rng: np.random.Generator, vocab: int, params: SamplingParams) -> SamplingParams:
    """Greedy a third of the time, else the case's temperature with the filters off (top_k 0 or >= V, top_p 1)."""
    if rng.random() < 1 / 3:
        return SamplingParams()
    return replace(params, temperature=params.temperature or 0.7, top_k=int(rng.choice([0, vocab])), top_p=1.0)


def _forms(tmp_path: Path) -> tuple[object, object]:
    path = tmp_path / "head.onnx"
    onnx.save(batched_verify_head_model(), str(path))
    plain = onnx.load_from_string(batched_plain_form(path))
    assert not [n.op_type for n in plain.graph.node if n.op_type in ("If", "Loop", "Scan")]
    assert not {i.name for i in plain.graph.input} & set(PLAIN_DROPPED)
    return cpu_session(onnx.load(str(path))), cpu_session(plain)


def test_the_plain_form_gives_the_scans_verdicts(tmp_path: Path) -> None:
    scan, plain = _forms(tmp_path)
    rng = np.random.default_rng(61)
    rows = rejected = sampled = 0
    for i in range(BATCHES):
        vocab = int(rng.choice(VOCABS))
        cases = []
        for _ in range(int(rng.integers(1, 6))):
            case = verify_case(rng, "temperature", vocab, int(rng.integers(0, 7)))
            cases.append(replace(case, params=_plain_params(rng, vocab, case.params)))
        feeds = batch_feeds(rng, cases, vocab)
        want = scan.run(["n_accepted", "next_token"], feeds)
        got = plain.run(["n_accepted", "next_token"], {k: v for k, v in feeds.items() if k not in PLAIN_DROPPED})
        assert [g.tolist() for g in got] == [w.tolist() for w in want], (i, [c.params for c in cases])
        oracle_n, oracle_next = oracle_rows(feeds, [c.params for c in cases])
        assert got[0].tolist() == list(oracle_n) and got[1].tolist() == list(oracle_next)
        rows += len(cases)
        sampled += sum(not c.params.greedy for c in cases)
        rejected += int(sum(n < c.draft_probs.shape[1] for n, c in zip(got[0], cases, strict=True)))
    assert sampled >= rows // 2 and rejected >= rows // 5, (rows, sampled, rejected)


def test_a_bonus_row_that_reads_a_pad_q_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted defect: after a full acceptance of k_b < K drafts the residual subtracts the pad row q[k_b] (a real-
    looking q in batch_feeds) instead of zeros; the comparison with the Scan finds it."""
    from specpack.graphs import batched_plain_form as form

    monkeypatch.setattr(form, "_bonus_mask", lambda b, n, counts: b.const([[True]], np.bool_))
    scan, plain = _forms(tmp_path)
    rng = np.random.default_rng(62)
    differ = 0
    for _ in range(BATCHES):
        vocab = int(rng.choice(VOCABS))
        cases = [replace(c, params=SamplingParams(1.0)) for c in
                 (verify_case(rng, "temperature", vocab, int(rng.integers(0, 4))) for _ in range(3))]
        feeds = batch_feeds(rng, [*cases, replace(verify_case(rng, "temperature", vocab, 6), params=SamplingParams(1.0))],
                            vocab)
        want = scan.run(["n_accepted", "next_token"], feeds)
        got = plain.run(["n_accepted", "next_token"], {k: v for k, v in feeds.items() if k not in PLAIN_DROPPED})
        differ += got[1].tolist() != want[1].tolist()
    assert differ >= 5, differ
