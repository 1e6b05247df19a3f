"""The `reference` backend: the numpy oracle's sampling and acceptance over logits functions, with no KV cache.

It is the oracle for the other backends (docs/architecture.md, "Backends"): every call recomputes the
logits of the whole prefix, so there is no cache to get wrong, and the draw and the acceptance test are
graphs/oracle.py's. Over in-memory logits functions (bigram tables) it needs nothing but numpy, so the
loop is tested on its own; over a pack (`load`, device "reference") the logits come from the pack's own
graphs with their internal `logits` exposed, run by ONNX Runtime on the CPU, which needs onnx (the
`export` extra) and fits small packs only.

It also checks the loop's side of the contract: a verify runs over at least k + 1 new tokens, and a
draft step over at least one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from specpack import names
from specpack.contract.manifest import Manifest, ModelEntry
from specpack.graphs import oracle, tree_oracle
from specpack.runtime.backend import BackendOptions
from specpack.runtime.engine import TreeResult, VerifyRun
from specpack.runtime.kv_cache import LengthCache
from specpack.runtime.state import DecodeState, VerifyResult
from specpack.runtime.target import EngineBackend, refuse_cpu_only
from specpack.sampling import SamplingParams

LogitsFn = Callable[[np.ndarray, int], np.ndarray]  # (ids [n], rows) -> logits [rows, V] of the last rows positions


def bigram_logits(table: np.ndarray) -> LogitsFn:
    """A model whose next-token logits depend on the last token only: table [V, V]."""
    return lambda ids, rows: table[ids[len(ids) - rows :]]


class _ReferenceModel:
    def __init__(self, logits_fn: LogitsFn, slots: int) -> None:
        self.logits_fn = logits_fn
        self.caches = [LengthCache() for _ in range(slots)]
        self.calls = 0
        self.new_tokens: list[int] = []  # S of every call

    def cache(self, slot: int) -> LengthCache:
        return self.caches[slot]

    def reset(self, state: DecodeState) -> None:
        self.caches[state.slot].reset()

    def close(self) -> None:
        pass

    def _logits(self, state: DecodeState, end: int, rows: int) -> np.ndarray:
        """Logits [rows, V] of the last `rows` of ids[:end], which must all be new to this model."""
        cache = self.caches[state.slot]
        if end - cache.length < rows:
            raise RuntimeError(f"run over ids[{cache.length}:{end}]: fewer new tokens than the {rows} rows it needs")
        self.calls += 1
        self.new_tokens.append(end - cache.length)
        cache.advance(end - cache.length)
        return np.asarray(self.logits_fn(state.ids[:end], rows), dtype=np.float32)  # [rows, V]


class ReferenceDraft(_ReferenceModel):
    def __init__(self, logits_fn: LogitsFn, slots: int, k_max: int, vocab_size: int) -> None:
        super().__init__(logits_fn, slots)
        self._q = [np.zeros((1, k_max, vocab_size), np.float32) for _ in range(slots)]  # [1, k_max, V] per slot

    def step(self, state: DecodeState, end: int, row: int) -> int:
        logits = self._logits(state, end, 1)[-1]  # [V]
        token, q = oracle.draft_step(logits, float(state.uniforms.draft[row]), state.params)
        self._q[state.slot][0, row] = q
        return token

    def q(self, state: DecodeState, k: int) -> np.ndarray:
        return self._q[state.slot][:, :k]  # [1, k, V]


class ReferenceTarget(_ReferenceModel):
    def __init__(self, logits_fn: LogitsFn, slots: int, k_max: int, vocab_size: int) -> None:
        super().__init__(logits_fn, slots)
        self._zero_q = np.zeros((1, k_max, vocab_size), np.float32)  # [1, k_max, V]: q of a verify that reads none

    def verify(self, run: VerifyRun) -> VerifyResult:
        state, k = run.state, run.k
        logits = self._logits(state, state.length + k, k + 1)  # [k+1, V]
        q = np.asarray(self._zero_q[:, :k] if run.q is None else run.q)[0]  # [k, V]
        n, token = oracle.verify(logits, state.ids[state.length : state.length + k], q,
                                 state.uniforms.verify[0, : k + 1], state.params)
        return VerifyResult(n, token)

    def verify_tree(self, run: VerifyRun) -> TreeResult:
        """The tree oracle over each node's logits, computed on its own root path (no tree mask to get wrong)."""
        state, k, parents = run.state, run.k, run.parents
        assert parents is not None
        start, ids = state.length, state.ids
        tokens = ids[start : start + k]
        self._logits(state, start + k, k + 1)  # the bookkeeping of a run over the k nodes (its rows unused)
        rows = [np.asarray(self.logits_fn(ids[:start], 1), np.float32)[-1]]  # [V] at the root
        for node in range(k):
            path = [node]
            while parents[path[-1]] >= 0:
                path.append(int(parents[path[-1]]))
            prefix = np.concatenate([ids[:start], tokens[path[::-1]]])
            rows.append(np.asarray(self.logits_fn(prefix, 1), np.float32)[-1])
        q = None if run.q is None else np.asarray(run.q)[0]  # [k, V]
        verdict = tree_oracle.verify_tree(np.stack(rows), tokens, parents, state.uniforms.verify[0, : k + 1],
                                          state.params, q, "deterministic" if q is None else "with_replacement")
        return TreeResult(np.asarray(verdict.path, np.int64), verdict.next_token)

    def upload_q(self, slot: int, host_q: np.ndarray, k: int) -> np.ndarray:
        return host_q[:, :k]  # [1, k, V]


class ReferenceBackend(EngineBackend[ReferenceTarget, ReferenceDraft]):
    name = "reference"

    def __init__(self, target: LogitsFn, draft: Callable[[], LogitsFn] | None, vocab_size: int, k_max: int,
                 slots: int = 1, pad_single_steps: bool = True, open_draft_now: bool = False) -> None:
        """target: the target's logits function; draft: makes the draft's, called on first use (None: no draft)."""
        self.vocab_size, self.k_max, self.slots = vocab_size, k_max, slots
        open_draft = None if draft is None else (lambda: ReferenceDraft(draft(), slots, k_max, vocab_size))
        super().__init__(ReferenceTarget(target, slots, k_max, vocab_size), open_draft, k_max=k_max,
                         vocab_size=vocab_size, pad_single_steps=pad_single_steps, open_draft_now=open_draft_now)


def load(path: Path, manifest: Manifest, options: BackendOptions) -> ReferenceBackend:
    """The reference backend over a pack: its graphs' logits, recomputed over the whole prefix every call."""
    m = manifest
    refuse_cpu_only(m, "reference")
    verified = manifest if options.verified_reads else None
    draft = None if m.draft_model is None else (lambda: pack_logits(path, m.draft, m.vocab_size, options.threads,
                                                                      verified))
    return ReferenceBackend(pack_logits(path, m.target, m.vocab_size, options.threads, verified), draft, m.vocab_size,
                            m.k_max, options.slots, options.pad_single_steps,
                            open_draft_now=verified is not None)  # pinned: every graph opens at load


def pack_logits(path: Path, entry: ModelEntry, vocab_size: int, threads: int | None,
                verified: Manifest | None = None) -> LogitsFn:
    """A LogitsFn over one pack graph: no past (L = 0), every position fed; the head's inputs get zeros.
    A torch export of the static form takes past buffers as long as its mask ([1, H, M, D], M = the n positions
    fed, all zeros: rows [0, n) are written and read); other graphs an empty past ([1, H, 0, D]).
    `verified`: the pinned manifest, whose files are read as bytes and hashed as they are read."""
    import onnxruntime as ort

    from specpack.contract.verified_read import graph_bytes
    from specpack.graphs.logits_output import with_logits_output
    from specpack.limits import numpy_dtype
    from specpack.runtime.ort_session import session_options

    source = graph_bytes(path, verified, entry.graph) if verified is not None else None
    session = ort.InferenceSession(with_logits_output(path / entry.graph.path, entry.dtype, source),
                                   sess_options=session_options(threads), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    past_names = names.kv_names(entry.num_layers, "past")
    static = entry.graph.kv_cache == "static" and entry.graph.exporter == "torch"  # past as long as the mask
    constant = {**SamplingParams().graph_inputs(), names.UNIFORM: np.zeros(1, np.float32)}

    def logits(ids: np.ndarray, rows: int) -> np.ndarray:
        n = len(ids)
        past = np.zeros((1, entry.kv_heads, n if static else 0, entry.head_dim), numpy_dtype(entry.dtype))  # [1, H, *, D]
        feed = {**constant, **dict.fromkeys(past_names, past), names.INPUT_IDS: np.asarray(ids, np.int64)[None],
                names.POSITION_IDS: np.arange(n)[None],
                names.ATTENTION_MASK: np.ones((1, n), np.int64),
                names.DRAFT_PROBS: np.zeros((1, rows - 1, vocab_size), np.float32),  # rows = k + 1 in the verify
                names.UNIFORMS: np.zeros((1, rows), np.float32)}
        (out,) = session.run([names.LOGITS], {name: value for name, value in feed.items() if name in wanted})
        return np.asarray(out[0, -rows:, :vocab_size], np.float32)  # [rows, V]

    return logits
