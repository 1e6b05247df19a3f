"""The TensorRT-form heads (sampling_trt.py) on ONNX Runtime's CPU EP: the oracle's distribution, not its bits.

fp32 exp instead of fp64 moves probabilities by ulps, so q is compared by total variation (at most 1e-4 per
case: a token at the rounding edge of exp underflow or of the top-p cutoff), greedy tokens must be identical,
and the verify head's sampled (n_accepted, next_token) pass a chi-square against the exact rejection-sampling
distribution. Each test runs twice: with TensorRT's TopK limit, and with a limit of 16 candidates so that the
bisection paths (top_k beyond the candidates, top-p mass beyond them) run on these small vocabularies.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial

import numpy as np
import onnxruntime as ort
import pytest

from specpack.graphs import heads, oracle, sampling_graph, sampling_trt
from specpack.graphs.heads import Transform
from specpack.graphs.onnx_builder import INT64_MAX, GraphBuilder, Value
from specpack.sampling import SamplingParams
from tests.distribution import chi_square_pvalue
from tests.graphs.trt_ops import problems, walk_nodes

from .cases import MODES, VOCABS, VerifyCase, draft_case, verify_case

F32 = np.float32
CASES_PER_MODE = 400
MAX_TV = 1e-4
LIMITS = [sampling_trt.TOPK_LIMIT, 16]
P_FAIL = 1e-3


def _transform(limit: int) -> Transform:
    keep = partial(sampling_trt.keep_threshold, limit=limit)

    def transform(b: GraphBuilder, logits: Value, t: Value, k: Value, p: Value, vocab: int | None) -> Value:
        return sampling_graph.transform(b, logits, t, k, p, vocab, exp=sampling_trt.exp_fp32, keep=keep)

    return transform


def _session(model: object) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])  # type: ignore[attr-defined]


def _beyond_candidates(logits: np.ndarray, params: SamplingParams, limit: int) -> bool:
    """Whether the threshold lies past the `limit` largest logits (a bisection runs) for these logits [N, V]."""
    vocab = logits.shape[-1]
    if params.greedy or limit >= vocab:
        return False
    if 0 < params.top_k < vocab and params.top_k > limit:
        return True
    if params.top_p >= 1.0:
        return False
    q = oracle.transform(logits, SamplingParams(params.temperature, top_k=params.top_k))  # [N, V] top-k only
    mass = np.sort(q, axis=-1)[:, ::-1][:, :limit].sum(axis=-1)  # [N]
    return bool((mass < params.top_p).any())


def test_heads_at_a_real_vocabulary_pass_the_tensorrt_check() -> None:
    """V = 151,936: no fp64, one sorted TopK of K = 3839, every node supported (trt_ops.py)."""
    for model in (heads.draft_head_model(vocab=151_936, transform=sampling_trt.transform),
                  heads.verify_head_model(vocab=151_936, transform=sampling_trt.transform)):
        assert problems(model) == []
        topks = [n for n, _ in walk_nodes(model.graph) if n.op_type == "TopK"]
        assert len(topks) == 1 and all(a.i == 1 for a in topks[0].attribute if a.name == "sorted")


@pytest.mark.parametrize("limit", LIMITS)
@pytest.mark.parametrize("mode", MODES)
def test_draft_head_q_within_rounding_of_oracle(limit: int, mode: str) -> None:
    session = _session(heads.draft_head_model(transform=_transform(limit)))
    rng = np.random.default_rng(MODES.index(mode))
    worst, same_token, bisected = 0.0, 0, 0
    for _ in range(CASES_PER_MODE):
        case = draft_case(rng, mode, int(rng.choice(VOCABS)))
        token, probs = session.run(["token", "probs"], case.feeds())
        want_token, want_q = case.expected()
        worst = max(worst, 0.5 * float(np.abs(probs[0].astype(np.float64) - want_q).sum()))
        same_token += int(token[0]) == want_token
        if case.params.greedy:
            assert int(token[0]) == want_token
        bisected += _beyond_candidates(case.logits[0, -1:], case.params, limit)
    assert worst <= MAX_TV, f"total variation {worst} from the oracle's q"
    assert same_token >= 0.99 * CASES_PER_MODE, f"{CASES_PER_MODE - same_token} draws differ from the oracle's"
    if limit == 16 and mode in ("top_k", "top_p", "top_k_top_p"):
        assert bisected >= 20, f"only {bisected} cases ran a bisection"


@pytest.mark.parametrize("limit", LIMITS)
@pytest.mark.parametrize("mode", ["greedy", "mixed"])
def test_verify_head_greedy_identical_and_sampling_within_rounding(limit: int, mode: str) -> None:
    """Greedy: identical to the oracle. Sampled: the same (n, next) for all but a few cases at rounding edges."""
    session = _session(heads.verify_head_model(transform=_transform(limit)))
    rng = np.random.default_rng(200 + MODES.index(mode))
    differ = 0
    for _ in range(CASES_PER_MODE):
        case = verify_case(rng, mode, int(rng.choice(VOCABS)), int(rng.integers(0, 9)))
        n, next_token = session.run(["n_accepted", "next_token"], case.feeds())
        got, want = (int(n[0]), int(next_token[0])), case.expected()
        if case.params.greedy:
            assert got == want, (case.params, got, want)
        differ += got != want
    assert differ <= 0.01 * CASES_PER_MODE, f"{differ} of {CASES_PER_MODE} verify outcomes differ"


SETTINGS = [SamplingParams(1.0), SamplingParams(0.7, top_k=30), SamplingParams(1.0, top_p=0.9),
            SamplingParams(1.3, top_k=40, top_p=0.95)]


def _exact_outcomes(case: VerifyCase) -> dict[tuple[int, int], float]:
    """P(n_accepted = j, next_token = t) for fixed drafts x, q and target logits (Leviathan et al. 2023)."""
    k = case.draft_probs.shape[1]
    p = oracle.transform(case.logits[0, -(k + 1):].astype(F32), case.params).astype(np.float64)  # [k+1, V]
    p /= p.sum(axis=-1, keepdims=True)
    q = case.draft_probs[0].astype(np.float64)  # [k, V]
    q /= q.sum(axis=-1, keepdims=True)
    x = case.input_ids[0, -k:]
    out: dict[tuple[int, int], float] = {}
    reach = 1.0  # P(the first j drafts were accepted)
    for j in range(k + 1):
        if j < k:
            accept = min(1.0, p[j, x[j]] / q[j, x[j]])
            residual = np.maximum(p[j] - q[j], 0.0)
            dist = residual / residual.sum() if residual.sum() > 0 else p[j]
            stop = reach * (1.0 - accept)
        else:
            dist, stop = p[k], reach
        for t in np.flatnonzero(dist > 0):
            out[(j, int(t))] = out.get((j, int(t)), 0.0) + stop * float(dist[t])
        if j < k:
            reach *= accept
    return out


# (TopK limit, params, samples): with 16 candidates the bisections run (a Loop of 64 steps: ~4 ms a run here).
# Power: (n, next) falls in 34-85 bins (27-71 at 4,000 draws); a test detects Cohen's w >= 0.08-0.10 at 10,000
# draws (0.13-0.15 at 4,000) with 99 % power at P_FAIL (tests/distribution.py, detectable_effect); GRAPH_MUTATIONS below are
# rejected at these very sizes and seeds.
CHI_SQUARE_CASES = [*((sampling_trt.TOPK_LIMIT, p, 10_000) for p in SETTINGS), (16, SETTINGS[1], 4000),
                    (16, SETTINGS[3], 4000)]


def _temperature_twice(inner: Transform) -> Transform:
    """A defect of the graph builder: the logits divided by the temperature before the transform divides again."""

    def transform(b: GraphBuilder, logits: Value, t: Value, k: Value, p: Value, vocab: int | None) -> Value:
        return inner(b, b.op("Div", logits, t), t, k, p, vocab)

    return transform


def _rows_shifted(inner: Transform) -> Transform:
    """A defect of the graph builder: the target's distribution read one position late (p_{i+1} tests draft i)."""

    def transform(b: GraphBuilder, logits: Value, t: Value, k: Value, p: Value, vocab: int | None) -> Value:
        probs = inner(b, logits, t, k, p, vocab)  # [k+1, V]
        return b.op("Concat", b.slice(probs, 1, INT64_MAX, axis=0), b.slice(probs, -1, INT64_MAX, axis=0), axis=0)

    return transform


GRAPH_MUTATIONS: dict[str, Callable[[Transform], Transform]] = {"temperature_twice": _temperature_twice,
                                                                "rows_shifted": _rows_shifted}


def _verify_head_pvalue(limit: int, params: SamplingParams, samples: int,
                        mutation: Callable[[Transform], Transform] | None = None) -> tuple[float, set[int]]:
    """Verify runs with fresh uniforms on one case: chi-square p of (n, next) against the exact distribution, and
    the n seen. `mutation` builds the head with a defect; the case, its draws and the exact side stay the same."""
    transform = _transform(limit) if mutation is None else mutation(_transform(limit))
    session = _session(heads.verify_head_model(transform=transform))
    rng = np.random.default_rng(5)
    vocab, k = 60, 3
    target = (rng.standard_normal((k + 1, vocab)) * 1.5).astype(F32)  # [k+1, V]
    draft_logits = target[:k] + (rng.standard_normal((k, vocab)) * 0.7).astype(F32)  # [k, V] a near draft
    drafts, q = zip(*(oracle.draft_step(row, float(rng.random()), params) for row in draft_logits), strict=True)
    ids = np.array([[5, *drafts]], np.int64)  # [1, k+1]
    case = VerifyCase(target[None], ids, np.stack(q)[None], np.zeros((1, k + 1), F32), params)
    feeds = case.feeds()
    outcomes = Counter[tuple[int, int]]()
    for u in rng.random((samples, 1, k + 1), dtype=F32):
        n, next_token = session.run(["n_accepted", "next_token"], {**feeds, "uniforms": u})
        outcomes[(int(n[0]), int(next_token[0]))] += 1
    return chi_square_pvalue(list(outcomes.elements()), _exact_outcomes(case)), {n for n, _ in outcomes}


@pytest.mark.parametrize(("limit", "params", "samples"), CHI_SQUARE_CASES,
                         ids=[f"K{c[0]}-T{c[1].temperature:g}-k{c[1].top_k}-p{c[1].top_p:g}" for c in CHI_SQUARE_CASES])
def test_verify_head_sampling_chi_square(limit: int, params: SamplingParams, samples: int) -> None:
    """Verify runs with fresh uniforms on one case: (n, next) against the exact distribution."""
    p_value, seen = _verify_head_pvalue(limit, params, samples)
    assert p_value > P_FAIL, f"chi-square p = {p_value:.2e}"
    assert len(seen) > 1, "every draw ended at the same n: the acceptance test went untested"


MUTATION_CASES = [(name, CHI_SQUARE_CASES[i]) for name in GRAPH_MUTATIONS for i in (1, 4)]


@pytest.mark.parametrize(("mutation", "case"), MUTATION_CASES,
                         ids=[f"{m}-K{c[0]}-T{c[1].temperature:g}" for m, c in MUTATION_CASES])
def test_verify_head_chi_square_catches_graph_defects(mutation: str, case: tuple[int, SamplingParams, int]) -> None:
    """test_verify_head_sampling_chi_square's own case, draws and size, on a head built with a defect: rejected."""
    p_value, _ = _verify_head_pvalue(*case, mutation=GRAPH_MUTATIONS[mutation])
    assert p_value < P_FAIL, f"{mutation}: chi-square p = {p_value:.2e}"
