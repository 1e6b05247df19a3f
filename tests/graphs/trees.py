"""Token trees for the tree tests: a tiny target and draft over a small vocabulary, trees built or drawn from the
draft, the exact distribution of a tree step's tokens by enumeration, and one sampled step.

A `World` is a target and a draft as functions of the context (the tokens after the committed prefix): logits made
from a generator seeded by the context, so every node of every tree sees a fixed, context-dependent distribution.
Outcomes are the first `length` tokens a step emits (accepted path, then the next token), completed by the target
itself when the step emits fewer: what the next steps would add. Their exact distribution is the target's own.

`exact_step` enumerates a tree step in closed form, from the lemma of specpack/graphs/tree_oracle.py (float64):
every candidate list with its probability, and at each node the chance of each acceptance and of the final draw.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from specpack.graphs import oracle, tree_oracle
from specpack.graphs.tree_oracle import Rule
from specpack.sampling import SamplingParams
from tests.distribution import exact_continuations

F32 = np.float32
Context = tuple[int, ...]
Outcome = tuple[int, ...]
ChildMaker = Callable[[Context, int], list[int]]  # (a node's context, how many) -> its children's tokens
Candidates = tuple[Context, float, list[np.ndarray]]  # (child tokens, probability of drawing them, q_i of each [V])


@dataclass
class World:
    """A target and a draft over V tokens, and the sampling parameters both are transformed with."""

    vocab: int
    params: SamplingParams
    seed: int = 0
    closeness: float = 1.0  # draft logits = target logits + noise of this scale
    _cache: dict[tuple[str, Context], np.ndarray] = field(default_factory=dict)

    def logits(self, who: str, ctx: Context) -> np.ndarray:
        """fp32 logits [V] of the target ("p") or the draft ("q") after ctx; integer-ish, so ties occur."""
        key = (who, ctx)
        if key not in self._cache:
            rng = np.random.default_rng([self.seed, len(ctx), *ctx])
            target = np.round(rng.normal(0.0, 1.5, self.vocab) * 2) / 2
            noise = rng.normal(0.0, self.closeness, self.vocab)
            self._cache[key] = (target if who == "p" else target + noise).astype(F32)
        return self._cache[key]

    def probs(self, who: str, ctx: Context) -> np.ndarray:
        """The transformed distribution [V], fp32 as the oracle computes it."""
        key = (who + "/probs", ctx)
        if key not in self._cache:
            self._cache[key] = oracle.transform(self.logits(who, ctx)[None], self.params)[0]
        return self._cache[key]

    def exact(self, who: str, ctx: Context) -> np.ndarray:
        """The same in float64, normalised."""
        probs = self.probs(who, ctx).astype(np.float64)
        return probs / probs.sum()

    def target_outcomes(self, length: int) -> dict[Outcome, float]:
        """The target's own distribution of its first `length` tokens."""
        return exact_continuations(lambda ctx: self.exact("p", tuple(ctx)), [], length, frozenset())


@dataclass(frozen=True)
class Tree:
    """A token tree as the verify takes it, with each node's context."""

    tokens: np.ndarray  # [T] int64
    parents: np.ndarray  # [T] int64, topological, -1: the root
    contexts: list[Context]  # [T + 1]: the root's (), then node i's (its path's tokens)

    def logits(self, world: World) -> np.ndarray:
        return np.stack([world.logits("p", ctx) for ctx in self.contexts])  # [T+1, V]

    def draft_probs(self, world: World, rule: Rule) -> np.ndarray:
        """q [T, V]: each node's row is the distribution it was drawn from (its parent's draft distribution)."""
        rows = [world.probs("q", self.contexts[parent + 1]) for parent in self.parents]
        return np.stack(rows) if rows else np.zeros((0, world.vocab), F32)


def build_tree(widths: tuple[int, ...], children: ChildMaker) -> Tree:
    """Breadth-first: every node at depth d gets the children `children(ctx, width)` makes, widths[d] of them."""
    tokens: list[int] = []
    parents: list[int] = []
    contexts: list[Context] = [()]
    frontier = [(-1, ())]
    for width in widths:
        grown = []
        for node, ctx in frontier:
            for token in children(ctx, width):
                tokens.append(token)
                parents.append(node)
                contexts.append((*ctx, token))
                grown.append((len(tokens) - 1, (*ctx, token)))
        frontier = grown
    return Tree(np.array(tokens, np.int64), np.array(parents, np.int64), contexts)



def top_w(world: World, duplicate: bool = False) -> ChildMaker:
    """Deterministic candidates: the draft's w most probable tokens (EAGLE-2's top-w); `duplicate` repeats the first."""

    def make(ctx: Context, width: int) -> list[int]:
        order = np.argsort(-world.logits("q", ctx), kind="stable")
        picked = [int(t) for t in order[:width]]
        return [*picked[:-1], picked[0]] if duplicate and width > 1 else picked

    return make


def drawn(world: World, rule: Rule, rng: np.random.Generator) -> ChildMaker:
    """Sampled candidates: i.i.d. from the draft's q ("with_replacement") or without replacement."""

    def make(ctx: Context, width: int) -> list[int]:
        q = world.exact("q", ctx)
        if rule == "with_replacement":
            return [int(t) for t in rng.choice(world.vocab, size=width, p=q)]
        width = min(width, int((q > 0).sum()))
        return [int(t) for t in rng.choice(world.vocab, size=width, replace=False, p=q)]

    return make


def exact_step(world: World, widths: tuple[int, ...], rule: Rule, length: int,
               duplicate: bool = False) -> dict[Outcome, float]:
    """The exact distribution of the first `length` tokens of one tree step (completed by the target), float64."""
    out: dict[Outcome, float] = {}
    for emitted, mass in _node(world, widths, rule, (), duplicate):
        for rest, more in _completions(world, emitted, length):
            key = (*emitted, *rest)[:length]
            out[key] = out.get(key, 0.0) + mass * more
    return out


def _node(world: World, widths: tuple[int, ...], rule: Rule, ctx: Context,
          duplicate: bool) -> Iterator[tuple[Outcome, float]]:
    """(tokens emitted from this node on, probability), over the candidate draws and the accept / reject events."""
    p = world.exact("p", ctx)
    if not widths:
        yield from (((int(t),), float(p[t])) for t in np.flatnonzero(p > 0))
        return
    for kids, drawn_mass, qs in _candidates(world, widths[0], rule, ctx, duplicate):
        r, reach = p, drawn_mass
        for token, q_i in zip(kids, qs, strict=True):
            accept = min(1.0, r[token] / q_i[token])
            if accept > 0:
                for emitted, mass in _node(world, widths[1:], rule, (*ctx, token), duplicate):
                    yield (token, *emitted), reach * accept * mass
            reach *= 1.0 - accept
            residual = np.maximum(r - q_i, 0.0)
            if residual.sum() <= 0:
                break  # reach is 0 (r == q_i): nothing follows
            r = residual / residual.sum()
        if reach > 0:
            yield from (((int(t),), reach * float(r[t])) for t in np.flatnonzero(r > 0))


def _candidates(world: World, width: int, rule: Rule, ctx: Context, duplicate: bool) -> Iterator[Candidates]:
    """Every list of children a node can get, with its probability and the q_i each was drawn from."""
    vocab = world.vocab
    if rule == "deterministic":
        kids = top_w(world, duplicate)(ctx, width)
        yield tuple(kids), 1.0, [np.eye(vocab)[t] for t in kids]  # a repeated token: r(t) = 0 by then, never accepted
        return
    q = world.exact("q", ctx)
    if rule == "with_replacement":
        for kids in itertools.product(np.flatnonzero(q > 0).tolist(), repeat=width):
            yield kids, float(np.prod(q[list(kids)])), [q] * width
        return
    support = np.flatnonzero(q > 0).tolist()
    for kids in itertools.permutations(support, min(width, len(support))):
        mass, qs, left = 1.0, [], q.copy()
        for t in kids:
            q_i = left / left.sum()
            mass *= q_i[t]
            qs.append(q_i)
            left[t] = 0.0
        yield kids, mass, qs


def _completions(world: World, emitted: Outcome, length: int) -> Iterator[tuple[Outcome, float]]:
    """The target's continuations of `emitted` up to `length` tokens in all, with their probabilities."""
    need = length - len(emitted)
    if need <= 0:
        yield (), 1.0
        return
    rest = exact_continuations(lambda ctx: world.exact("p", tuple(ctx)), list(emitted), need, frozenset())
    yield from rest.items()


def sample_step(world: World, widths: tuple[int, ...], rule: Rule, length: int, rng: np.random.Generator,
                duplicate: bool = False) -> Outcome:
    """One tree step through tree_oracle.verify_tree with uniforms from rng, completed by the target."""
    maker = top_w(world, duplicate) if rule == "deterministic" else drawn(world, rule, rng)
    tree = build_tree(widths, maker)
    uniforms = rng.random(len(tree.tokens) + 1, dtype=F32)
    verdict = tree_oracle.verify_tree(tree.logits(world), tree.tokens, tree.parents, uniforms, world.params,
                                      tree.draft_probs(world, rule), rule)
    emitted = [int(t) for t in tree.tokens[list(verdict.path)]] + [verdict.next_token]
    while len(emitted) < length:
        emitted.append(int(rng.choice(world.vocab, p=world.exact("p", tuple(emitted)))))
    return tuple(emitted[:length])
