"""The verify and draft policy, written once above every backend's engines (docs/architecture.md, "Backends").

    Target         the loop's TargetModel over a VerifyEngine: the pad row of a greedy single step, q for a
                   deterministic proposal, the rollback of rejected drafts; a tree's accepted path moved into
                   place (its tokens in state.ids, its cache rows: docs/trees.md)
    Draft          the loop's DraftModel over a DraftEngine: rollback never past what the cache holds
    EngineBackend  a Backend of one VerifyEngine and a DraftEngine opened once, on first use, under a lock

Every backend (cpu, cuda, tensorrt, reference) is an EngineBackend: what differs between them is only how
their engines run a graph.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import numpy as np

from specpack.errors import SpecpackError
from specpack.runtime.engine import (
    DraftEngine,
    HeadTreeRun,
    ModelEngine,
    TopRows,
    VerifyEngine,
    VerifyRun,
    tree_refusal,
)
from specpack.runtime.state import DecodeState, Proposal, VerifyResult

if TYPE_CHECKING:
    from specpack.contract.manifest import Manifest
    from specpack.runtime.batched_draft import BatchedGreedyDrafter
    from specpack.runtime.batched_target import BatchedRuns
    from specpack.runtime.engine import TreeDraftEngine

V = TypeVar("V", bound=VerifyEngine)  # a backend's verify engine
D = TypeVar("D", bound=DraftEngine)   # a backend's draft engine


def _rollback(engine: ModelEngine, state: DecodeState, length: int) -> None:
    cache = engine.cache(state.slot)
    cache.rollback(min(length, cache.length))


class Target(Generic[V]):
    """verify.onnx: committed tokens not yet cached + k drafts in; n accepted and the next token out."""

    def __init__(self, engine: V, k_max: int, vocab_size: int, pad_single_steps: bool = True) -> None:
        self.engine, self.k_max, self.vocab_size = engine, k_max, vocab_size
        self.pad_single_steps = pad_single_steps and k_max >= 1
        self._one_hot: dict[int, np.ndarray] = {}  # slot -> host [1, k_max, V], all zero between verifies
        self._rows = np.arange(max(k_max, 1))       # [k_max] row indices of the one-hot writes (no per-step arange)

    def reset(self, state: DecodeState) -> None:
        self.engine.reset(state)

    def rollback(self, state: DecodeState, length: int) -> None:
        _rollback(self.engine, state, length)

    def verify(self, state: DecodeState, proposal: Proposal) -> VerifyResult:
        k, q, parents = proposal.k, proposal.q, proposal.parents
        if k == 0 and self._pads(state):
            return self._single_greedy_step(state)
        if k == 0 or state.params.greedy or (parents is not None and q is None):
            # the greedy verify reads no q (the engine binds its own); nor does a tree of deterministic candidates
            return self._run(state, VerifyRun(state, k, None, parents))
        if q is not None:
            return self._run(state, VerifyRun(state, k, q, parents))
        one_hot = self._one_hot_rows(state.slot)
        rows = self._rows[:k]  # a view
        one_hot[0, rows, proposal.tokens] = 1.0  # a deterministic proposal: q one-hot on each token
        try:
            return self._run(state, VerifyRun(state, k, self.engine.upload_q(state.slot, one_hot, k), parents))
        finally:
            one_hot[0, rows, proposal.tokens] = 0.0  # back to all zeros, whatever happened

    def prefill_chunk(self, state: DecodeState, end: int) -> None:
        """A chunk of the prompt into the cache: the target over state.ids[cached:end], end < state.length, with no
        drafts and nothing emitted (the scheduler's chunked prefill: docs/batching.md). The run is the prefill's own
        (a k = 0 verify over the chunk's rows, its verdict dropped); the uniforms are not drawn, so the request's
        random stream does not depend on its chunks."""
        cached = self.engine.cache(state.slot).length
        if not cached < end < state.length:
            raise ValueError(f"a prefill chunk ends at {end}: expected {cached} < end < {state.length}")
        length = state.length
        state.length = end  # the engine runs state.ids[cached : state.length + k]
        try:
            self.engine.verify(VerifyRun(state, 0, None))
        finally:
            state.length = length
        self.rollback(state, end)

    def _pads(self, state: DecodeState) -> bool:
        """A greedy step over one new token (not the prefill): run as two rows."""
        return (self.pad_single_steps and state.params.greedy
                and state.length - self.engine.cache(state.slot).length == 1)

    def _run(self, state: DecodeState, run: VerifyRun) -> VerifyResult:
        if run.parents is not None and run.k:
            return self._tree(state, run)
        result = self.engine.verify(run)
        self.rollback(state, state.length + result.n_accepted)  # the rejected drafts leave the cache
        return result

    def _tree(self, state: DecodeState, run: VerifyRun) -> VerifyResult:
        """A tree's accepted path, node indices p_0 < p_1 < ... (parents come first), becomes the chain the loop
        commits: node p_i's token moves to state.ids[length + i] and its cache row to length + i, the rest is
        dropped. In place and forward (p_i >= i): each source is read before anything overwrites it."""
        path, next_token = self.engine.verify_tree(run)
        start, n = state.length, len(path)
        if n:
            state.ids[start : start + n] = state.ids[start + path]
            self.engine.cache(state.slot).keep_rows(start, path)
        self.rollback(state, start + n)
        return VerifyResult(n, next_token, path)

    def _single_greedy_step(self, state: DecodeState) -> VerifyResult:
        """A greedy step over one new token, run as two rows: the token and a pad draft after it.

        ONNX Runtime's CPU kernels compute one row with their own paths (MLAS's GEMV, MatMulNBits' M = 1
        kernels) that round differently from the multi-row ones every verify of drafts runs, and MatMulNBits'
        int8 activations turn those last-bit differences into different tokens (2 of 8 HumanEval prompts on the
        real GGUF pair: docs/architecture.md, "One row is never run alone"). With a pad row every step after the
        prefill goes through the multi-row kernels, whose rows do not depend on how many rows run together, so
        the target alone and speculative decoding compute the same logits. The pad (the last committed token)
        is accepted exactly when it is argmax p at the first row, so the token is argmax p there either way;
        its verdict on the pad row's own logits is dropped, and so is its cache entry."""
        start = state.length
        state.ids[start] = state.ids[start - 1]  # the pad draft, where the next token is written anyway
        n, next_token, _ = self.engine.verify(VerifyRun(state, 1, None))
        self.rollback(state, start)  # the cache keeps the committed tokens: the new token is fed next step
        return VerifyResult(0, int(state.ids[start]) if n else next_token)

    def _one_hot_rows(self, slot: int) -> np.ndarray:
        if slot not in self._one_hot:  # allocated on the first deterministic proposal a sampling request verifies
            self._one_hot[slot] = np.zeros((1, self.k_max, self.vocab_size), np.float32)
        return self._one_hot[slot]


class Draft(Generic[D]):
    """draft_step.onnx: S new tokens in, one drawn token and its distribution q out."""

    def __init__(self, engine: D) -> None:
        self.engine = engine

    def reset(self, state: DecodeState) -> None:
        self.engine.reset(state)

    def step(self, state: DecodeState, end: int, row: int) -> int:
        return self.engine.step(state, end, row)

    def q(self, state: DecodeState, k: int) -> Any:
        return self.engine.q(state, k)

    def rollback(self, state: DecodeState, length: int) -> None:
        _rollback(self.engine, state, length)

    @property
    def tree_width(self) -> int:
        """The most children a node of a tree this draft drafts can get (0: it drafts chains only)."""
        return int(getattr(self.engine, "tree_width", 0))

    def tree_step(self, state: DecodeState, run: HeadTreeRun | None) -> TopRows:
        """A tree's run (engine.TreeDraftEngine): only a tree-form head's or draft model's engine has it."""
        if not self.tree_width:
            raise tree_refusal("this pack's draft (a tree needs a draft head or a draft model exported "
                               "with --max-tree-nodes)")
        return cast("TreeDraftEngine", self.engine).tree_step(state, run)


def refuse_cpu_only(manifest: Manifest, backend: str, *, static_heads: bool = False, trees: bool = False) -> None:
    """A backend that cannot run a pack's draft head or tree verify graph yet says so at load (not at the first
    request). static_heads: the backend runs heads of the static form; trees: tree verify graphs (the cuda backend)."""
    head = manifest.head
    if head is not None and static_heads and head.graph.kv_cache != "static":
        raise SpecpackError(f"the {backend} backend runs draft heads of the static form", expected="a head pack "
                            "exported with --kv-cache static", found=f"a head pack with the {head.graph.kv_cache} "
                            "KV cache", hint="re-export with spec-export --kv-cache static --draft-head HEAD (docs/heads.md)")
    if head is not None and not static_heads:
        raise SpecpackError(f"the {backend} backend does not run draft heads yet", expected="--device cpu or cuda for "
                            "a pack exported with --draft-head", found=f"--device {backend}, drafter 'head'",
                            hint="run it with --device cpu or cuda (docs/heads.md says what remains)")
    if manifest.target.graph.tree is not None and not trees:
        raise SpecpackError(f"the {backend} backend does not run tree verify graphs yet", expected="--device cpu or "
                            "cuda for a pack exported with --max-tree-nodes", found=f"--device {backend}, a tree pack",
                            hint="run it with --device cpu or cuda, or export without --max-tree-nodes (docs/trees.md)")


class EngineBackend(Generic[V, D]):
    """A backend: the target's engine (opened at load) and the draft's (opened on first use, once)."""

    name = "engine"

    def __init__(self, target: V, open_draft: Callable[[], D] | None, *, k_max: int,
                 vocab_size: int, pad_single_steps: bool = True, open_draft_now: bool = False) -> None:
        """open_draft: makes the draft's engine (None: the pack has no draft model); open_draft_now: at load (a
        pinned pack reads nothing after load)."""
        self._target = Target(target, k_max, vocab_size, pad_single_steps)
        self._open_draft = open_draft
        self._draft: Draft[D] | None = None
        self._draft_lock = threading.Lock()
        if open_draft_now and open_draft is not None:
            self.draft()

    @property
    def draft_loaded(self) -> bool:
        return self._draft is not None

    def target(self) -> Target[V]:
        return self._target

    def draft(self) -> Draft[D]:
        if self._draft is None:
            with self._draft_lock:  # requests on different slots may ask at once
                if self._draft is None:
                    if self._open_draft is None:
                        raise RuntimeError(f"the {self.name} backend's pack has no draft model")
                    self._draft = Draft(self._open_draft())
        return self._draft

    def warmup_runs(self) -> int:
        """Runs so far of a captured shape before its graph replays (the cuda backend's; 0 where nothing is captured)."""
        return 0

    def precapture_thread(self, batched: BatchedRuns | None, drafter: BatchedGreedyDrafter | None) -> int:
        """The shapes a batcher's steps run, captured on its thread (the cuda backend's; nothing where nothing is)."""
        return 0

    def close(self) -> None:
        self._target.engine.close()
        if self._draft is not None:
            self._draft.engine.close()
