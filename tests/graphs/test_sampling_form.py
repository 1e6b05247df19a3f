"""The plain sampling form (graphs/sampling_form.py): no control flow left, and for every request it serves
(temperature > 0, neither top-k nor top-p on) the same outputs as the head as exported, bit for bit, on ONNX
Runtime's CPU EP; the oracle agrees with both (test_heads.py's cases)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest

from specpack.graphs import heads
from specpack.graphs.sampling_form import CONTROL_FLOW, plain_sampling_form
from specpack.sampling import SamplingParams

from .cases import VOCABS, cpu_session, draft_case, verify_case

CASES = 1500


def _plain(model: onnx.ModelProto, tmp_path) -> onnx.ModelProto:  # type: ignore[no-untyped-def]
    path = tmp_path / "head.onnx"
    onnx.save(model, str(path))
    form = onnx.load_from_string(plain_sampling_form(path))
    assert not [n.op_type for n in form.graph.node if n.op_type in CONTROL_FLOW]
    onnx.checker.check_model(form)
    return form


def _plain_params(rng: np.random.Generator, vocab: int, params: SamplingParams) -> SamplingParams:
    """The case's temperature with the filters off as a client leaves them (top_k 0 or >= V, top_p 1)."""
    top_k = int(rng.choice([0, vocab, vocab + 5]))
    return replace(params, temperature=params.temperature or 0.7, top_k=top_k, top_p=1.0)


def test_the_draft_head_plain_form_matches_the_head(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = heads.draft_head_model()
    exported, plain = cpu_session(model), cpu_session(_plain(model, tmp_path))
    rng = np.random.default_rng(7)
    for i in range(CASES):
        vocab = int(rng.choice(VOCABS))
        case = draft_case(rng, "temperature", vocab)
        case = replace(case, params=_plain_params(rng, vocab, case.params))
        assert not case.params.greedy and not case.params.filters(vocab)
        want = exported.run(["token", "probs"], case.feeds())
        got = plain.run(["token", "probs"], case.feeds())
        assert got[0].tolist() == want[0].tolist() and np.array_equal(got[1], want[1]), (i, case.params, vocab)
        oracle_token, oracle_q = case.expected()
        assert got[0].tolist() == [oracle_token] and np.array_equal(got[1][0], oracle_q)


def test_the_verify_head_plain_form_matches_the_head(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = heads.verify_head_model()
    exported, plain = cpu_session(model), cpu_session(_plain(model, tmp_path))
    rng = np.random.default_rng(8)
    rejected = 0
    for i in range(CASES):
        vocab, k = int(rng.choice(VOCABS)), int(rng.integers(0, 9))
        case = verify_case(rng, "temperature", vocab, k)
        case = replace(case, params=_plain_params(rng, vocab, case.params))
        want = exported.run(["n_accepted", "next_token"], case.feeds())
        got = plain.run(["n_accepted", "next_token"], case.feeds())
        assert [g.tolist() for g in got] == [w.tolist() for w in want], (i, case.params, vocab, k)
        rejected += int(got[0][0]) < k
    assert rejected >= CASES // 10, "too few rejections: the residual path is barely compared"


@pytest.mark.parametrize(("temperature", "top_k", "top_p", "plain"), [
    (0.0, 0, 1.0, False),      # greedy: the greedy form's
    (0.7, 0, 1.0, True),
    (0.7, 100, 1.0, True),     # top_k >= V filters nothing
    (0.7, 99, 1.0, False),
    (0.7, 0, 0.999, False),
    (0.7, 0, 1.0 - 1e-9, True),  # rounds to 1.0 in fp32, as the graph reads it
    (0.7, 0, 1.0 - 2.0**-25, True),  # the midpoint: to even, 1.0
    (0.7, 0, 1.0 - 2.0**-24, False),  # the float32 just below 1
])
def test_which_requests_the_plain_form_serves(temperature: float, top_k: int, top_p: float, plain: bool) -> None:
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    assert (not params.greedy and not params.filters(vocab=100)) is plain


def test_a_graph_without_the_filter_if_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The greedy form has no head If left: nothing to inline, so no plain form (the caller keeps the exported one)."""
    from specpack.graphs.greedy_form import greedy_form

    path = tmp_path / "head.onnx"
    onnx.save(heads.verify_head_model(), str(path))
    greedy = tmp_path / "greedy.onnx"
    greedy.write_bytes(greedy_form(path))
    with pytest.raises(ValueError, match="expected one head If"):
        plain_sampling_form(greedy)
