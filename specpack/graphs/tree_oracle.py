"""Numpy reference of acceptance over a token tree: several candidates at a node, exactly (docs/trees.md).

The tree oracle every tree graph is tested against (tree_head.py agrees with it bit for bit on ONNX Runtime's
CPU EP), built on oracle.py: the same transform, the same inverse-CDF draw, the same fp32 rounding.

A tree of T nodes is given as node tokens [T] and parent indices [T] in topological order (parent < index); a
parent of -1 is the root, the last committed token. The target's logits come in T + 1 rows: row 0 is the
distribution after the committed prefix (at the root), row i + 1 the distribution after node i. Uniforms [T + 1]:
u[i] is node i's acceptance test, u[T] the final draw, so a chain (parents -1, 0, 1, ...) takes the uniforms
`oracle.verify` takes, in the same places, and gives the same verdict (tests/graphs/test_tree_oracle.py).

The rule at a node (DESIGN.md, "Acceptance over a tree"). Let p be the target's distribution at the node (after
the transform) and c_1..c_m its children in index order, each drawn from q_i (a deterministic candidate: q_i =
onehot(c_i)). With r_0 = p:

    try c_i:  accept with probability min(1, r_{i-1}(c_i) / q_i(c_i));  accepted: the walk moves to c_i
    rejected: r_i = normalize(max(0, r_{i-1} - q_i))
    after the last rejection: the next token is drawn from r_m

Lemma (Leviathan et al. 2023, Theorem 1; SpecInfer arXiv 2305.09781; RRS arXiv 2402.14160). Whatever q_1..q_m
are, as long as each c_i is drawn from the q_i its test uses, given everything before it, the token this emits
is distributed as r_0 = p. By induction on the candidates left: with none left the token is drawn from r_m.
With c_i next, the rest emits r_i by induction, whatever c_i was (r_i depends on q_i, not on c_i), so

    P(x) = q_i(x) min(1, r(x) / q_i(x)) + P(reject) r_i(x)
         = min(q_i(x), r(x)) + (1 - sum_y min(q_i(y), r(y))) max(0, r(x) - q_i(x)) / sum_y max(0, r(y) - q_i(y))
         = min(q_i(x), r(x)) + max(0, r(x) - q_i(x))            since sum min(q, r) + sum max(0, r - q) = sum r = 1
         = r(x).

Over the tree: the token emitted at a node is distributed as the target's p there; when it is a child's token the
walk continues at that child, whose children are tested against the target's distribution after it, with uniforms
of their own. So each emitted token is distributed as the target's next-token distribution given the tokens before
it, and the tokens of a step, completed by the steps after it, are distributed as the target's own continuations.

The three forms of q_i, one per `Rule`:

- "deterministic" (n-gram tries, a draft's top-w; any candidates fixed by the context): q_i = onehot(c_i), so
  accept with probability r_{i-1}(c_i), and r_i = r_{i-1} with c_i removed, renormalized. Written out,
  r_{i-1}(c_i) = p(c_i) / (1 - S_i), S_i the mass of the distinct tokens of the earlier siblings: accept iff
  u · (1 - S_i) < p(c_i), and the final draw is from p with every child's token removed. A repeated sibling token
  has r(c) = 0: never accepted.
- "with_replacement" (SpecInfer's multi-step speculative sampling): c_i drawn i.i.d. from the draft's q at the
  node; q_i = q (node i's draft_probs row).
- "without_replacement" (recursive rejection sampling): c_i drawn from q with c_1..c_{i-1} removed; q_i = that,
  renormalized.

Greedy (temperature 0), any rule: a child is accepted iff its token is the target's argmax at its parent (the first
such sibling); the next token is the argmax after the deepest accepted node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from specpack.graphs import oracle
from specpack.sampling import SamplingParams

F32 = np.float32
Rule = Literal["deterministic", "with_replacement", "without_replacement"]
RULES: tuple[Rule, ...] = ("deterministic", "with_replacement", "without_replacement")
ChooseChild = Callable[[int, np.ndarray], "int | None"]  # (node, its children) -> the accepted child, or None


@dataclass(frozen=True)
class TreeVerdict:
    """What a tree verify decides: the accepted path (node indices, the root's child first) and the next token."""

    path: tuple[int, ...]
    next_token: int

    @property
    def n_accepted(self) -> int:
        return len(self.path)

    def rows(self, width: int) -> np.ndarray:
        """The graph's `path` output: rows of the run (0: the root, i + 1: node i), root first, -1 padded: [width]."""
        out = np.full(width, -1, np.int64)
        out[: len(self.path) + 1] = [0, *(node + 1 for node in self.path)]
        return out


def check_tree(parents: np.ndarray) -> np.ndarray:
    """parents as int64 [T]; ValueError unless topological (-1 <= parents[i] < i)."""
    parents = np.asarray(parents, dtype=np.int64).reshape(-1)  # [T]
    bad = np.flatnonzero((parents < -1) | (parents >= np.arange(len(parents))))
    if len(bad):
        raise ValueError(f"parents must be topological (-1 <= parents[i] < i); found parents[{bad[0]}] = "
                         f"{parents[bad[0]]}")
    return parents


def ancestors(parents: np.ndarray) -> np.ndarray:
    """Ancestor mask [T, T] bool: A[j, i] iff node i is node j or one of its ancestors (the root not included)."""
    parents = check_tree(parents)
    mask = np.eye(len(parents), dtype=bool)  # [T, T]
    for j, parent in enumerate(parents):
        if parent >= 0:
            mask[j] |= mask[parent]  # topological: the parent's row is complete
    return mask


def depths(parents: np.ndarray) -> np.ndarray:
    """Depth of each node [T] int64: 1 for the root's children (the root, the last committed token, has depth 0)."""
    return ancestors(parents).sum(axis=-1).astype(np.int64)


def tree_attention_mask(parents: np.ndarray) -> np.ndarray:
    """What each row of a tree verify sees among the run's T + 1 rows: [T + 1, T + 1] bool.

    Row 0 (the root) sees itself, row i + 1 (node i) the root, its ancestors and itself: the causal mask of a
    chain, the tree mask of a tree. Every row also sees the whole committed prefix (not part of this mask).
    """
    t = len(parents)
    mask = np.zeros((t + 1, t + 1), dtype=bool)
    mask[:, 0] = True
    mask[1:, 1:] = ancestors(parents)
    return mask


def verify_tree(target_logits: np.ndarray, tokens: np.ndarray, parents: np.ndarray, uniforms: np.ndarray,
                params: SamplingParams, draft_probs: np.ndarray | None = None,
                rule: Rule = "deterministic") -> TreeVerdict:
    """Exact acceptance over a tree (module docstring): the accepted path and the next token.

    target_logits [T+1, V]; tokens [T]; parents [T] (topological, -1: the root); uniforms [T+1] (u[i] for node i's
    test, u[T] for the final draw); draft_probs q [T, V]: node i's row is the distribution node i was drawn from
    (rules "with_replacement" and "without_replacement"; unused by "deterministic" and greedy).
    """
    logits = np.asarray(target_logits, dtype=F32)  # [T+1, V]
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)  # [T]
    parents = check_tree(parents)  # [T]
    u = np.asarray(uniforms, dtype=F32).reshape(-1)  # [T+1]
    children = [np.flatnonzero(parents == node) for node in range(-1, len(tokens))]  # children[node + 1], in order
    if params.greedy:
        best = np.argmax(logits, axis=-1)  # [T+1] argmax at each row
        path = _walk(children, lambda node, kids: next((c for c in kids if tokens[c] == best[_row(node, c)]), None))
        return TreeVerdict(path, int(best[path[-1] + 1 if path else 0]))
    p = oracle.transform(logits, params)  # [T+1, V]
    if rule == "deterministic":
        return _deterministic(p, tokens, children, u)
    if draft_probs is None:
        raise ValueError(f"rule {rule!r} needs draft_probs [T, V]: the distributions the candidates were drawn from")
    q = np.asarray(draft_probs, dtype=F32).reshape(len(tokens), p.shape[-1])  # [T, V]
    return _drawn(p, q, tokens, children, u, rule)


def _walk(children: list[np.ndarray], choose: ChooseChild) -> tuple[int, ...]:
    """Down from the root: at each node `choose(node, children)` gives the accepted child, or None to stop."""
    path: list[int] = []
    node = -1
    while (child := choose(node, children[node + 1])) is not None:
        path.append(child)
        node = child
    return tuple(path)


def _deterministic(p: np.ndarray, tokens: np.ndarray, children: list[np.ndarray], u: np.ndarray) -> TreeVerdict:
    """Rule "deterministic": accept c_i iff u_i · (1 - S_i) < p(c_i), S_i the sequential fp32 sum of p over the
    distinct tokens of the earlier siblings (tree_head.py sums them in the same order)."""

    def choose(node: int, kids: np.ndarray) -> int | None:
        seen: set[int] = set()
        removed = F32(0.0)  # S_i
        for c in kids:
            token = int(tokens[c])
            if token in seen:  # removed with its first occurrence: r(c) = 0
                continue
            seen.add(token)
            mass = p[_row(node, c), token]  # p(c_i)
            if mass > 0 and u[c] * _remaining(removed) < mass:  # u < p(c_i) / (1 - S_i) = r_{i-1}(c_i)
                return int(c)
            removed = F32(removed + mass)
        return None

    path = _walk(children, choose)
    row = p[path[-1] + 1 if path else 0]  # [V] at the deepest accepted node
    residual = _without(row, tokens[children[path[-1] + 1 if path else 0]])  # [V] unnormalised: draw() is scale-free
    return TreeVerdict(path, oracle.draw(residual if residual.max() > 0 else row, float(u[-1])))


def _drawn(p: np.ndarray, q: np.ndarray, tokens: np.ndarray, children: list[np.ndarray], u: np.ndarray,
           rule: Rule) -> TreeVerdict:
    """Rules "with_replacement" and "without_replacement": the lemma's steps, in fp32.

    The residual stays unnormalised until another candidate is tested against it, so a node with one child takes
    exactly oracle.verify's steps (accept iff u · q(x) < p(x); draw from max(0, p - q), or p if that is empty).
    """
    final: dict[str, np.ndarray] = {}

    def choose(node: int, kids: np.ndarray) -> int | None:
        residual = p[node + 1]  # [V] no children: the bonus token's distribution
        for i, c in enumerate(kids):
            # r_0 = p (normalised); r_{i-1} = normalize(max(0, r_{i-2} - q_{i-1}))
            r = residual / oracle.fsum(residual[None])[0] if i else p[_row(node, c)]  # [V]
            q_i = _drawn_from(q[c], tokens[kids[:i]]) if rule == "without_replacement" else q[c]  # [V]
            token = int(tokens[c])
            if u[c] * q_i[token] < r[token]:  # u < r(c) / q_i(c): accept with probability min(1, r / q_i)
                return int(c)
            residual = _residual(r, q_i)  # [V] max(0, r_{i-1} - q_i), unnormalised
            if residual.max() == 0:  # r <= q_i everywhere (fp rounding when r ~ q_i): keep r
                residual = r
        final["residual"] = residual
        return None

    path = _walk(children, choose)
    return TreeVerdict(path, oracle.draw(final["residual"], float(u[-1])))


# The steps below are module functions so that tests/mutations.py can replace one at a time.

def _row(node: int, child: int) -> int:
    """The target row a child of `node` is tested against: the distribution after its parent."""
    return node + 1


def _remaining(removed: np.float32) -> np.float32:
    """1 - S_i: the mass of r_{i-1} before renormalising (p sums to 1)."""
    return F32(F32(1.0) - removed)


def _without(row: np.ndarray, removed: np.ndarray) -> np.ndarray:
    """row [V] with the tokens `removed` zeroed (not renormalised)."""
    out = row.copy()
    out[removed] = 0.0
    return out


def _residual(r: np.ndarray, q: np.ndarray) -> np.ndarray:
    """max(0, r - q) [V]: r_i before renormalising."""
    return np.maximum(r - q, F32(0.0))


def _drawn_from(q: np.ndarray, earlier: np.ndarray) -> np.ndarray:
    """q_i of rule "without_replacement": q [V] with the earlier siblings' tokens removed, renormalised."""
    if not len(earlier):
        return q
    kept = _without(q, earlier)
    return kept / oracle.fsum(kept[None])[0]

