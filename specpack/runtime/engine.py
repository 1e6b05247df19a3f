"""The per-backend engines: what a backend runs, below the verify and draft policy (docs/architecture.md, "Backends").

An engine is one model's graph on one kind of device: its sessions, buffers, bindings and one KV cache per
slot. It runs what it is told over the rows it is told and reports the graph's raw outputs; it decides
nothing. The rules that hold on every backend (the pad row of a greedy single step, q for a deterministic
proposal, rollback after a verify, the draft opened once on first use) are written once above it, in
runtime/target.py.

    VerifyRun       one verify: a request's uncached committed tokens and k drafts (a chain or a tree), with q
    TreeResult      what a tree verify decides: the accepted path's nodes and the next token
    VerifyEngine    the target's verify graph: run a VerifyRun (verify, or verify_tree for a tree), upload a host q
    DraftEngine     the draft's step graph: one drawn token per run, its q row kept on the device

A VerifyRun is the unit the engine call takes, so that what a verify covers can grow (a token tree's parent
indices, several slots in one call) as fields of the run, without changing the engine's callers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from specpack.errors import SpecpackError

if TYPE_CHECKING:
    from specpack.contract.manifest import Manifest
    from specpack.runtime.kv_cache import KVCache
    from specpack.runtime.state import DecodeState, VerifyResult


class VerifyRun(NamedTuple):
    """One verify over one request: state.ids[cached : state.length + k], the last k of them drafts.

    The engine binds state.uniforms.verify[:, : k + 1] and the request's sampling inputs (taken at reset)."""

    state: DecodeState
    k: int                  # drafts verified (0: a plain target step; the prefill too)
    q: Any | None           # [1, k, V] fp32 on the engine's device; None: greedy, q is not read (the engine
                            # binds a buffer of its own of that shape), or a tree of deterministic candidates
    parents: np.ndarray | None = None  # int64 [k]: the drafts are a tree's nodes (docs/trees.md); None: a chain


class TreeResult(NamedTuple):
    path: np.ndarray        # int64 [n]: the accepted nodes, root's child first (increasing: parents come first)
    next_token: int         # the correction after the last accepted node, or the bonus after a leaf


class HeadTreeRun(NamedTuple):
    """One run of a drafted tree past the catch-up (docs/heads.md, "Trees drafted by the head"; a draft model's too:
    docs/trees.md, "Trees drafted by the draft model"): W own rows, one per node expanded, all at one depth. Each reads
    the cache rows [0, committed) (a head's computed from target features; a draft model's every committed token),
    `ancestors[j]` (the rows of node j's expanded ancestors) and its own row, which this run writes."""

    tokens: np.ndarray      # int64 [W]: the nodes' tokens (the rows' x_{t+1})
    hidden: np.ndarray      # int64 [W]: where the output o of the row that predicted each node is kept (TopRows.hidden;
                            # a head's: a draft model ignores it)
    position: int           # the rows' position: committed + the nodes' depth - 2 (a head: the last committed
                            # token's + depth - 1; a draft model, committed = the committed length: root's + depth)
    committed: int          # head cache rows every row reads
    ancestors: np.ndarray   # int64 [W, d - 1]: each row's expanded ancestors' cache rows (d: the nodes' depth)


class TopRows(NamedTuple):
    """What a tree step gives back for its R rows (the catch-up: its last row; an expansion: its own rows)."""

    tokens: np.ndarray      # int64 [R, K]: each row's top-K tokens, best first
    logprobs: np.ndarray    # fp32 [R, K]: their log-probabilities under the head or draft model (temperature 1)
    hidden: np.ndarray      # int64 [R]: where each row's output o is kept (a later HeadTreeRun.hidden)
    rows: np.ndarray        # int64 [R]: the cache row each row was written at


def head_rows(cached: int, end: int, committed: int) -> tuple[int, int]:
    """The rows of a draft head's step to `end` (docs/heads.md, "How the runtime binds it"): (C, W), C catch-up rows
    t = cached .. end - 2 from the target's features (every row has them: end <= committed), or W = 1 drafted row
    t = end - 2 fed the head's own last output. The head's cache holds `cached` rows."""
    if end <= committed:
        c, w = end - 1 - cached, 0
    elif cached == end - 2:
        c, w = 0, 1
    else:
        raise RuntimeError(f"head step to {end}: its cache holds {cached} rows, the committed length is {committed}")
    if c + w < 1:
        raise RuntimeError(f"head step to {end}: no row to run ({cached} cached)")
    return c, w


def feature_buffer_shape(m: Manifest) -> tuple[int, ...]:
    """A head pack's per-slot features: the static target's features cache [1, 1, max_len, F] (bound in place), or
    [1, max_len + k_max + 1, F] for the concat target's output rows, written at their positions."""
    assert m.head is not None
    if m.target.graph.kv_cache == "static":
        return (1, 1, m.max_len, m.head.feature_dim)
    return (1, m.max_len + m.k_max + 1, m.head.feature_dim)


def tree_refusal(engine: str) -> SpecpackError:
    """What an engine without a tree verify says when asked for one."""
    return SpecpackError(f"{engine} cannot verify a token tree", expected="a chain of drafts (drafter without trees)",
                         found="a tree proposal", hint="docs/trees.md says which backends and packs verify trees")


class ModelEngine(Protocol):
    """What both engines have: a KV cache per slot, a reset per request, close."""

    def cache(self, slot: int) -> KVCache:
        """The KV cache of `slot`: positions [0, length) are valid."""
        ...

    def reset(self, state: DecodeState) -> None:
        """A new request on state.slot: its cache emptied, its sampling inputs taken (constant for the request)."""
        ...

    def close(self) -> None: ...


class VerifyEngine(ModelEngine, Protocol):
    def verify(self, run: VerifyRun) -> VerifyResult:
        """Run the verify graph over the run's rows; the graph's n_accepted and next_token as it wrote them.
        The cache advances over every row run (the caller rolls the rejected drafts back)."""
        ...

    def verify_tree(self, run: VerifyRun) -> TreeResult:
        """A verify of a tree (run.parents set): every node attends to the committed prefix and its ancestors; node
        i's cache row is written at position state.length + i. The cache advances over every row run."""
        ...

    def upload_q(self, slot: int, host_q: np.ndarray, k: int) -> Any:
        """q [1, k, V] for a verify on `slot`, from its first k rows on the host (host_q [1, k_max, V] fp32):
        a handle the verify binds, valid until the next upload on that slot."""
        ...


class DraftEngine(ModelEngine, Protocol):
    def step(self, state: DecodeState, end: int, row: int) -> int:
        """Run the draft graph over state.ids[cached:end] (S >= 1), drawing with state.uniforms.draft[row]; its q
        written into row `row` of the slot's q buffer; the drawn token read back. The cache advances to `end`."""
        ...

    def q(self, state: DecodeState, k: int) -> Any:
        """Rows [0, k) of the slot's q buffer ([1, k, V] fp32 on the device): what the verify reads."""
        ...


class TreeDraftEngine(DraftEngine, Protocol):
    """A draft of the tree form (a tree pack's head_step.onnx, or its draft model's draft_step.onnx): it also runs a
    token tree's rows."""

    tree_width: int         # K: the most children a node can get (the graph's TopK)

    def tree_step(self, state: DecodeState, run: HeadTreeRun | None) -> TopRows:
        """run None: the catch-up to the committed length (a head: rows from target features; a draft model: the
        committed tokens not yet cached; its last row's top-K, the root's children); else `run`'s own rows. The cache
        advances over every row run."""
        ...
