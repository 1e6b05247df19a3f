"""Defects injected on purpose, so that each statistical test shows it can fail (docs/testing.md).

Each mutation is a context manager that patches the numpy oracle (specpack/graphs/oracle.py), which the reference
backend calls at run time; the graph builder's mutations are transforms passed to the head builders
(tests/graphs/test_heads_trt.py). Exact distributions are computed before a mutation is entered, so the
expected side stays the oracle's while the sampled side carries the defect.

    q_before_transform   the draft reports q = softmax(raw logits) but draws from the transformed distribution
                         (transformers #32867): acceptance ratios use the wrong q
    residual_next_row    at a rejection at position n, the correction is drawn from max(0, p - q) of position n + 1
    top_p_drops_ties     top-p keeps exactly the shortest sorted prefix reaching top_p, cutting a tie group at the
                         cutoff (transformers' sort does; specpack keeps the whole group)
    temperature_twice    logits divided by the temperature twice

Tree mutations (TREE_MUTATIONS, `tree_mutation`) replace one step of specpack/graphs/tree_oracle.py:

    siblings_see_p           deterministic: a sibling is tested against p, not the residual r_{i-1} (the earlier
                             siblings' mass is not removed: accept with p(c_i), not p(c_i) / (1 - S_i))
    children_kept            deterministic: the final draw is from p at the deepest accepted node, its rejected
                             children not removed
    tested_at_the_root       every child is tested against the root's p, not the distribution after its parent
    residual_not_updated     drawn candidates: after a rejection the next sibling is tried against the same
                             residual (r_i = r_{i-1}, q not subtracted)
    q_not_renormalized       without replacement: q_i has the earlier siblings removed but is not renormalised

Runtime mutations (RUNTIME_MUTATIONS, `runtime_mutation`) replace one step of the runtime:

    features_not_compacted   after a tree verify, a head pack's features cache keeps its rows in node order (the
                             cpu backend's keep_feature_rows does nothing): the head reads rejected nodes' features

Drafter mutations (classes wrapping a pack's Draft, handed to a HeadDrafter; or wrapping a Drafter):

    TemperedQ                a head that reports each q row squared and renormalized (q at half the temperature the
                             token was drawn at): a q that is not the distribution its drafts came from
    PeekingTrees             a tree drafter whose tree depends on the verify's own uniform of the first node's test
                             (state.uniforms.verify[0, 0], drawn before the step): at u >= 1/2 its first root child
                             becomes a token the test names (the target's most likely: that test then rejects it); the
                             deterministic rule is exact only for candidates fixed before the uniforms are looked at

Batched verify head mutations (BATCHED_HEAD_MUTATIONS, `batched_head_mutation`) change the graph built while they
are active (specpack/graphs/batched_head.py):

    draft_counts_ignored     every row verifies K = max k_b drafts: a row with fewer reads pad drafts, pad q and pad
                             uniforms as its own
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from specpack.graphs import batched_head, oracle, tree_oracle
from specpack.graphs.onnx_builder import GraphBuilder, Value
from specpack.sampling import SamplingParams

F32 = np.float32
_transform, _verify, _draft_step = oracle.transform, oracle.verify, oracle.draft_step


def _q_before_transform_draft_step(logits: np.ndarray, u: float, params: SamplingParams) -> tuple[int, np.ndarray]:
    token, _ = _draft_step(logits, u, params)
    return token, _transform(np.asarray(logits, F32)[None], SamplingParams(1.0))[0]  # [V] q of the raw logits


def _residual_next_row_verify(target_logits: np.ndarray, draft_tokens: np.ndarray, draft_probs: np.ndarray,
                              uniforms: np.ndarray, params: SamplingParams) -> tuple[int, int]:
    n, token = _verify(target_logits, draft_tokens, draft_probs, uniforms, params)
    k = len(draft_tokens)
    if params.greedy or n == k:
        return n, token
    p = _transform(np.asarray(target_logits, F32), params)  # [k+1, V]
    q_ext = np.concatenate([np.asarray(draft_probs, F32).reshape(k, -1), np.zeros((1, p.shape[-1]), F32)])
    residual = np.maximum(p[n + 1] - q_ext[n + 1], F32(0.0))  # [V] one row too far
    return n, oracle.draw(residual if residual.max() > 0 else p[n + 1], float(np.asarray(uniforms)[k]))


def _top_p_drops_ties_transform(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    probs = _transform(logits, params)  # [N, V]
    if params.greedy or params.top_p >= 1.0:
        return probs
    x = np.asarray(logits, F32)
    out = probs.copy()
    for row, p in enumerate(probs):
        kept = np.flatnonzero(p > 0)
        lowest = x[row, kept].min()
        tied = kept[x[row, kept] == lowest]  # the group at the cutoff, in token order
        out[row, tied[1:]] = 0.0  # keep one of the tied tokens, as a sort-based cut does
        out[row] /= out[row].sum()
    return out


def _temperature_twice_transform(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    if params.greedy:
        return _transform(logits, params)
    return _transform(np.asarray(logits, F32) / F32(params.temperature), params)


_PATCHES: dict[str, tuple[str, Callable[..., object]]] = {
    "q_before_transform": ("draft_step", _q_before_transform_draft_step),
    "residual_next_row": ("verify", _residual_next_row_verify),
    "top_p_drops_ties": ("transform", _top_p_drops_ties_transform),
    "temperature_twice": ("transform", _temperature_twice_transform),
}
ORACLE_MUTATIONS = tuple(_PATCHES)


def oracle_mutation(name: str) -> contextlib.AbstractContextManager[None]:
    """The oracle with the defect `name` (ORACLE_MUTATIONS) for the duration of the block."""
    return _patched(oracle, *_PATCHES[name])


@contextlib.contextmanager
def _patched(module: object, attribute: str, replacement: Callable[..., object]) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, attribute, replacement)
        yield


_TREE_PATCHES: dict[str, tuple[str, Callable[..., object]]] = {
    "siblings_see_p": ("_remaining", lambda removed: F32(1.0)),
    "children_kept": ("_without", lambda row, removed: row.copy()),
    "tested_at_the_root": ("_row", lambda node, child: 0),
    "residual_not_updated": ("_residual", lambda r, q: r),
    "q_not_renormalized": ("_drawn_from", lambda q, earlier: tree_oracle._without(q, earlier)),
}
TREE_MUTATIONS = tuple(_TREE_PATCHES)


def tree_mutation(name: str) -> contextlib.AbstractContextManager[None]:
    """The tree oracle with the defect `name` (TREE_MUTATIONS) for the duration of the block."""
    return _patched(tree_oracle, *_TREE_PATCHES[name])


def _every_row_k(b: GraphBuilder) -> Value:
    """K for every row: [B] = draft_probs.shape[1] broadcast over the batch."""
    k = b.op("Shape", "draft_probs", start=1, end=2)  # [1]
    return b.op("Expand", k, b.op("Shape", "draft_counts"))  # [B]


_BATCHED_HEAD_PATCHES: dict[str, tuple[str, Callable[..., object]]] = {
    "draft_counts_ignored": ("row_counts", _every_row_k),
}
BATCHED_HEAD_MUTATIONS = tuple(_BATCHED_HEAD_PATCHES)


def batched_head_mutation(name: str) -> contextlib.AbstractContextManager[None]:
    """The batched verify head built with the defect `name` (BATCHED_HEAD_MUTATIONS) inside the block."""
    return _patched(batched_head, *_BATCHED_HEAD_PATCHES[name])


def _runtime_patches() -> dict[str, tuple[object, str, Callable[..., object]]]:
    from specpack.runtime.backends import cpu

    return {"features_not_compacted": (cpu, "keep_feature_rows", lambda features, start, path: None)}


RUNTIME_MUTATIONS = ("features_not_compacted",)


def runtime_mutation(name: str) -> contextlib.AbstractContextManager[None]:
    """The runtime with the defect `name` (RUNTIME_MUTATIONS) for the duration of the block."""
    return _patched(*_runtime_patches()[name])


class TemperedQ:
    """A head's Draft (`real`) with each q row it reports squared and renormalized; `q` gives host arrays [1, k, V]
    (the cpu backend's); tests/runtime/test_cuda_head.py's TemperedDeviceQ puts them on the device."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def reset(self, state: Any) -> None:
        self.real.reset(state)

    def step(self, state: Any, end: int, row: int) -> int:
        return int(self.real.step(state, end, row))

    def tempered(self, q: np.ndarray) -> np.ndarray:
        """q [1, k, V] -> q^2 / sum(q^2) per row."""
        return q * q / (q * q).sum(-1, keepdims=True)

    def q(self, state: Any, k: int) -> Any:
        return self.tempered(np.asarray(self.real.q(state, k), F32))

    def rollback(self, state: Any, length: int) -> None:
        self.real.rollback(state, length)


class PeekingTrees:
    """A tree Drafter (`real`) whose proposals peek at the verify's uniforms (module docstring): `best(state)` gives the
    token put first at u >= 1/2 (where it is not among the proposal's tokens already: siblings stay distinct)."""

    def __init__(self, real: Any, best: Callable[[Any], int]) -> None:
        self.real, self.best = real, best

    def begin(self, state: Any) -> None:
        self.real.begin(state)

    def propose(self, state: Any, k: int) -> Any:
        proposal = self.real.propose(state, k)
        if proposal.k and proposal.parents is not None and state.uniforms.verify[0, 0] >= 0.5:
            best = self.best(state)
            if best not in proposal.tokens.tolist():
                proposal.tokens[0] = best
        return proposal

    def commit(self, state: Any) -> None:
        self.real.commit(state)
