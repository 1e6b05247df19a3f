"""The target over a batched static-form graph (docs/batching.md): every row of a step in one ONNX Runtime run.

    rows = slots: buffers [slots, kv_heads, M, head_dim] per cache tensor (row b = slot b's cache), bound as both past
    and present; a run binds the rows [lo, hi) of the slots it covers (contiguous views: the first axis), so a single
    row runs at batch 1 and a step of rows 0..B-1 at batch B

    a run over rows with S_b new tokens each:  S = max(2, max S_b)  (every row at least two: the multi-row kernels,
    docs/architecture.md "One row is never run alone"); row b's tokens right-padded, at positions L_b .. L_b + S - 1,
    its mask ones at [0, L_b + S); a row of [lo, hi) that is not in the run is a pad row (its writes land past its
    length, where nothing reads them: the rollback rule). Needs L_b + S <= M for every row of [lo, hi).

Where the caches live is the backend's (runtime/batched_caches.py): host numpy buffers (the cpu backend: the graph's
path or OrtGraph given here) or device buffers bound by pointer offset (backends/cuda_batched.py: a CacheOpener given
here); the row layout and the acceptance below are the same for both.

BatchedRuns holds that; its heads: BatchedGreedyTarget (argmax, `best` [B, K+1], graphs/attach.py's
build_batched_greedy_graph; the acceptance on the host from those integers, graphs/oracle.py's greedy_verify: greedy rows only,
the batched greedy draft's engine) and BatchedTarget (runtime/batched_verify.py: the batched verify head,
graphs/batched_head.py, for every request). Each is both the loop's TargetModel (prefill, a single row's verify) and
the scheduler's RowVerifier (a step's rows in one run), over the same caches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from specpack import names
from specpack.errors import SpecpackError
from specpack.graphs.oracle import greedy_verify
from specpack.runtime.batched_caches import BatchedCaches, Bound, CacheOpener, HostCaches, KVLayout
from specpack.runtime.ort_session import OrtGraph
from specpack.runtime.state import DecodeState, Proposal, VerifyResult

MIN_WIDTH = 2  # every row of a run at least this wide: the multi-row kernels (docs/architecture.md, "One row is never
               # run alone"); runtime/batch_k.py prices a step with it


class BatchedRuns:
    """The caches and the run of a batched static-form graph, whatever its head (module docstring): `bind` lays out a
    run's rows, the subclass adds its head's inputs and outputs."""

    def __init__(self, graph: Path | OrtGraph | CacheOpener, *, num_layers: int, kv_heads: int, head_dim: int,
                 width: int, slots: int, k_max: int, threads: int | None = None,
                 clock: Callable[[], float] = time.perf_counter, dtype: np.dtype | type = np.float32) -> None:
        """graph: the graph's path or its session opened by a backend (host caches), or a backend's CacheOpener (its
        own caches, e.g. on a device); width: M, the cache rows per slot (max_len + k_max + 1: a padded row never runs
        off the buffer); dtype: the caches' (the graph's KV dtype)."""
        layout = KVLayout(num_layers, kv_heads, head_dim, width, slots, np.dtype(dtype))
        if isinstance(graph, Path):
            graph = OrtGraph(graph, threads=threads)
        self.caches: BatchedCaches = HostCaches(graph, layout) if isinstance(graph, OrtGraph) else graph(layout)
        self.width, self.slots, self.clock = width, slots, clock
        rows = max(k_max + 1, width)  # the longest run: a prompt (or its chunk), or k_max + 1 verify rows
        self._mask = np.zeros((slots, width), np.int64)      # [slots, M]
        self._ids = np.zeros(slots * rows, np.int64)         # flat: [B, S] views of its first B*S entries
        self._pos = np.zeros(slots * rows, np.int64)
        self.rows, self.k_max = rows, k_max
        self._arange = np.arange(width, dtype=np.int64)      # [M] positions (views)
        self.lengths = [0] * slots                           # cached rows of each slot
        self.runs: list[int] = []                            # rows (B) of each run: tests

    def reset(self, state: DecodeState) -> None:
        self.lengths[state.slot] = 0

    def rollback(self, state: DecodeState, length: int) -> None:
        self.lengths[state.slot] = min(length, self.lengths[state.slot])

    def verify(self, state: DecodeState, proposal: Proposal) -> VerifyResult:
        return self.verify_rows([(state, proposal)])[0][0]

    def verify_rows(self, rows: list[tuple[DecodeState, Proposal]]) -> list[tuple[VerifyResult, float]]:
        """The scheduler's RowVerifier: every row's verify in one run; each row's share of its time."""
        raise NotImplementedError

    def prefill_chunk(self, state: DecodeState, end: int) -> None:
        self.prefill_chunks([(state, end)])

    def prefill_chunks(self, chunks: list[tuple[DecodeState, int]]) -> None:
        """Each row's prompt tokens from its cached length to `end` into its cache, every row in one run (the
        scheduler's RowPrefill, where a run costs its launch)."""
        tokens = {}
        for state, end in chunks:
            cached = self.lengths[state.slot]
            if not cached < end < state.length:
                raise ValueError(f"a prefill chunk ends at {end}: expected {cached} < end < {state.length}")
            tokens[state.slot] = state.ids[cached:end]
        self.run(tokens)
        for state, end in chunks:
            self.lengths[state.slot] = end

    def close(self) -> None:
        self.caches.close()

    def run(self, tokens: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        """One run over `tokens` (slot -> its new tokens) whose head output is dropped (a prefill chunk): the caches."""
        raise NotImplementedError

    def decode_step(self, seq: int) -> bool:
        """Whether a run of width `seq` is a decode step's (at most k_max + 1 new tokens a row): the runs a device
        captures, one CUDA graph per shape; prefills and catch-ups run uncaptured."""
        return seq <= self.k_max + 1

    def span(self, tokens: dict[int, np.ndarray], seq: int) -> tuple[int, int]:
        """The slots a run covers: [min, max] of its rows; where a run costs its launch (a device, `launch_bound`) a
        decode step covers [0, the next power of two >= max + 1, at most `slots`) instead, so that a few shapes (and
        CUDA graphs) serve every batch: its extra rows are pad rows, if each has room for `seq` more cache rows."""
        lo, hi = min(tokens), max(tokens) + 1
        if not (self.caches.launch_bound and self.decode_step(seq)):
            return lo, hi
        wide = min(self.slots, 1 << (hi - 1).bit_length())
        if all(self.lengths[slot] + seq <= self.width for slot in range(wide) if slot not in tokens):
            return 0, wide
        return lo, hi

    def bind(self, tokens: dict[int, np.ndarray]) -> tuple[int, int, int, dict[str, Bound], dict[str, Bound]]:
        """A run over the slots [lo, hi) of `span` (slot -> its new tokens): (lo, hi, seq, inputs, outputs) of the plain
        graph (ids, positions, mask, caches); the head's are the caller's. Records the run's rows."""
        seq = max(MIN_WIDTH, *(len(t) for t in tokens.values()))
        lo, hi = self.span(tokens, seq)
        batch = hi - lo
        ids = self._ids[: batch * seq].reshape(batch, seq)      # [B, S]
        pos = self._pos[: batch * seq].reshape(batch, seq)      # [B, S]
        for r, slot in enumerate(range(lo, hi)):
            start, new = self.lengths[slot], tokens.get(slot)
            if start + seq > self.width:
                raise SpecpackError("the sequence does not fit the batched KV cache",
                                    expected=f"cached + new <= {self.width} in every row of the run",
                                    found=f"slot {slot}: {start} cached + {seq} new")
            if new is None:                                         # a pad row: a slot not in this run
                ids[r] = 0
            else:
                ids[r, : len(new)] = new
                ids[r, len(new) :] = new[-1]                        # pads: any token
            pos[r] = self._arange[start : start + seq]
            self._mask[slot, : start + seq] = 1
            self._mask[slot, start + seq :] = 0
        past, present = self.caches.rows(lo, hi)                    # [B, H, M, D] each: slots lo .. hi - 1
        inputs: dict[str, Bound] = {names.INPUT_IDS: ids, names.POSITION_IDS: pos, names.ATTENTION_MASK: self._mask[lo:hi],
                                    **past}
        self.runs.append(batch)
        return lo, hi, seq, inputs, present


class BatchedGreedyTarget(BatchedRuns):
    """The batched graph with the greedy head (`best`): the acceptance on the host. The batched greedy draft's engine
    (batched_draft.py); as a target, greedy rows only (BatchedTarget verifies every request). Its head reads each
    row's last k_b + 1 positions (draft_counts, token_counts in: graphs/batched_head.py); a pack exported before
    2026-12-06 has the head that reads every position (`best` [B, S], no such inputs), read the same way here."""

    def __init__(self, graph: Path | OrtGraph | CacheOpener, **kwargs: Any) -> None:
        super().__init__(graph, **kwargs)
        self._best = np.zeros(self.slots * self.rows, np.int64)
        self._selects = names.DRAFT_COUNTS in self.caches.input_names  # the head reads k_b + 1 positions per row
        self._counts = np.zeros(self.slots, np.int64)                  # [slots] views [lo:hi]
        self._tokens = np.zeros(self.slots, np.int64)

    def verify_rows(self, rows: list[tuple[DecodeState, Proposal]]) -> list[tuple[VerifyResult, float]]:
        """Every row's verify in one run; each row's share of its time is the run's over the rows."""
        for state, proposal in rows:
            if not state.params.greedy or proposal.parents is not None:
                raise SpecpackError("the batched greedy target verifies greedy chains only",
                                    expected="temperature 0, no token tree", found=f"{state.params}",
                                    hint="docs/batching.md: the batched sampling head is what remains")
        t = self.clock()
        tokens = {state.slot: state.ids[self.lengths[state.slot] : state.length + proposal.k] for state, proposal in rows}
        best = self.run(tokens, {state.slot: proposal.k for state, proposal in rows})
        out = []
        for state, proposal in rows:
            n, next_token = greedy_verify(best[state.slot], proposal.tokens)
            self.lengths[state.slot] = state.length + n  # the cache keeps the committed tokens and the accepted drafts
            out.append(VerifyResult(n, next_token))
        share = (self.clock() - t) / len(rows)
        return [(result, share) for result in out]

    def run(self, tokens: dict[int, np.ndarray], drafts: dict[int, int] | None = None) -> dict[int, np.ndarray]:
        """One run; slot -> its argmax after its last k_b + 1 new tokens ([k_b + 1], a view): after the last committed
        token and each of its k_b = drafts[slot] drafts (default 0: after its last new token)."""
        drafts = drafts or {}
        lo, hi, seq, inputs, outputs = self.bind(tokens)
        counts, lengths = self._counts[lo:hi], self._tokens[lo:hi]
        for r, slot in enumerate(range(lo, hi)):
            counts[r] = drafts.get(slot, 0)
            lengths[r] = len(tokens[slot]) if slot in tokens else seq  # pad rows: read clamped, never used
        rows = int(counts.max()) + 1 if self._selects else seq
        if self._selects and self.caches.fixed_rows is not None:  # K + 1 from shapes: the head's first k_b + 1 the same
            if rows > self.caches.fixed_rows:
                raise ValueError(f"a row verifies {rows - 1} drafts: the graph's head reads {self.caches.fixed_rows} rows")
            rows = min(seq, self.caches.fixed_rows)
        best = self._best[: (hi - lo) * rows].reshape(-1, rows)  # [B, K+1] ([B, S]: the older head)
        if self._selects:
            inputs = {**inputs, names.DRAFT_COUNTS: counts, names.TOKEN_COUNTS: lengths}
        self.caches.run(inputs, {names.BEST: best, **outputs}, greedy=True, capture=self.decode_step(seq))
        out = {}
        for slot in tokens:
            r = slot - lo
            k, n = int(counts[r]), int(lengths[r])
            out[slot] = best[r, : k + 1] if self._selects else best[r, n - k - 1 : n]
        return out
