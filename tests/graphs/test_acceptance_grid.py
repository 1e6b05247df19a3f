"""The acceptance rule's exact distribution over a grid of uniforms: computed, not drawn.

With one draft (k = 1), a verify is a function of its two uniforms: accept x iff u_0 < p_0(x) / q(x), then the next
token by inverse CDF on u_1 (from normalize(max(0, p_0 - q)) after a rejection, from p_1 after an acceptance). Each
outcome (n, t) is a rectangle of the unit square, so the share of the midpoints of a G x G grid that give it is
within 2 / G of its exact probability:

    P(0, t) = (1 - a) r(t),   P(1, t) = a p_1(t),   a = min(1, p_0(x) / q(x)),   r = normalize(max(0, p_0 - q))

The numpy oracle and the verify head graph on ONNX Runtime are checked at G = 64 (every outcome within 0.031 of its
probability, deterministically), over random cases with ties, filters and a draft q equal to p's, near it or far
from it; each oracle mutation of tests/mutations.py that applies to a verify with a given q moves some outcome by more
than that (measured: temperature twice 0.10, ties dropped 0.13, residual of the next row 0.42) and is rejected by
the same comparison.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
import pytest

from specpack.graphs import heads, oracle
from specpack.sampling import SamplingParams
from tests.mutations import oracle_mutation

F32 = np.float32
V = 12
CASES = [SamplingParams(1.0), SamplingParams(0.6), SamplingParams(1.0, top_k=4), SamplingParams(1.0, top_p=0.7),
         SamplingParams(1.4, top_k=6, top_p=0.9)]
Outcome = tuple[int, int]
Verify = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], Outcome]  # (target [2, V], x [1], q [1, V], u [2])


def _case(seed: int, params: SamplingParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(target logits [2, V], draft x [1], q [1, V]): integer logits (ties at the cutoffs), x drawn from q."""
    rng = np.random.default_rng(seed)
    target = np.round(rng.normal(0, 1.5, (2, V))).astype(F32)
    draft_logits = target[0] + rng.normal(0, (0.0, 0.5, 2.0)[seed % 3], V).astype(F32)
    x, q = oracle.draft_step(draft_logits, float(rng.random()), params)
    return target, np.array([x]), q[None]


def _exact(target: np.ndarray, x: np.ndarray, q: np.ndarray, params: SamplingParams) -> dict[Outcome, float]:
    p = oracle.transform(target, params).astype(np.float64)  # [2, V]
    p /= p.sum(axis=-1, keepdims=True)
    q64 = q[0].astype(np.float64) / q[0].sum()
    a = min(1.0, p[0, x[0]] / q64[x[0]])
    residual = np.maximum(p[0] - q64, 0.0)
    r = residual / residual.sum() if residual.sum() > 0 else p[0]
    out = {(0, int(t)): (1 - a) * float(r[t]) for t in np.flatnonzero(r > 0) if a < 1}
    out.update({(1, int(t)): a * float(p[1, t]) for t in np.flatnonzero(p[1] > 0)})
    return out


def _grid_shares(verify: Verify, target: np.ndarray, x: np.ndarray, q: np.ndarray, g: int) -> dict[Outcome, float]:
    mid = (np.arange(g, dtype=np.float64) + 0.5) / g
    counts = Counter(verify(target, x, q, np.array([u0, u1], F32)) for u0 in mid for u1 in mid)
    return {outcome: c / g**2 for outcome, c in counts.items()}


def _worst_gap(shares: dict[Outcome, float], exact: dict[Outcome, float]) -> float:
    return max(abs(shares.get(o, 0.0) - exact.get(o, 0.0)) for o in {*shares, *exact})


def _oracle_verify(params: SamplingParams) -> Verify:
    return lambda target, x, q, u: oracle.verify(target, x, q, u, params)


G_ORACLE, G_GRAPH = 64, 64


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("params", CASES, ids=str)
def test_oracle_verify_is_exact_on_the_grid(params: SamplingParams, seed: int) -> None:
    target, x, q = _case(seed, params)
    exact = _exact(target, x, q, params)
    assert abs(sum(exact.values()) - 1.0) < 1e-9
    assert _worst_gap(_grid_shares(_oracle_verify(params), target, x, q, G_ORACLE), exact) <= 2 / G_ORACLE


@pytest.fixture(scope="module")
def verify_session() -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(heads.verify_head_model().SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("params", CASES, ids=str)
def test_verify_head_is_exact_on_the_grid(verify_session: ort.InferenceSession, params: SamplingParams) -> None:
    target, x, q = _case(1, params)
    feeds = {"logits": target[None], "input_ids": np.array([[7, x[0]]], np.int64), "draft_probs": q[None],
             **{name: value for name, value in params.graph_inputs().items()}}

    def verify(_t: np.ndarray, _x: np.ndarray, _q: np.ndarray, u: np.ndarray) -> Outcome:
        n, token = verify_session.run(["n_accepted", "next_token"], {**feeds, "uniforms": u[None]})
        return int(n[0]), int(token[0])

    assert _worst_gap(_grid_shares(verify, target, x, q, G_GRAPH), _exact(target, x, q, params)) <= 2 / G_GRAPH


# mutation -> the case it must be caught on (params, seed): the grid comparison of the oracle rejects it
MUTATIONS = {"residual_next_row": (CASES[0], 2), "temperature_twice": (CASES[1], 2),
             "top_p_drops_ties": (CASES[3], 0)}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_grid_catches_oracle_mutations(mutation: str) -> None:
    params, seed = MUTATIONS[mutation]
    target, x, q = _case(seed, params)
    exact = _exact(target, x, q, params)
    with oracle_mutation(mutation):
        shares = _grid_shares(_oracle_verify(params), target, x, q, G_ORACLE)
    assert _worst_gap(shares, exact) > 2 / G_ORACLE
