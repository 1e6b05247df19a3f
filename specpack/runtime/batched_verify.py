"""BatchedTarget: the batched static-form graph with the batched verify head (graphs/batched_head.py), so every
request, greedy or sampling, verifies in the step's one run (docs/batching.md).

    per run of rows [lo, hi)   draft_counts k_b, token_counts S_b (pad rows: 0, S), temperature / top_k / top_p (the
                               request's; pad rows and prefill chunks: greedy), uniforms [B, K+1] (row b's
                               state.uniforms.verify[0, :k_b + 1]), draft_probs [B, K, V] (row b's q, one-hot on its
                               drafts for a deterministic proposal; a greedy row's is never read, and a run
                               without sampling rows binds the caches' `ignored` zeros instead), K = max k_b; where a
                               run costs its launch (a GPU) a run with a sampling row has K = k_max (one shape for
                               its captured graphs), and when every sampling row's q is on the device (its draft
                               model's rows: `q_rows`), draft_probs is those rows in place: no q crosses the host
    out                        n_accepted [B], next_token [B]: what the row's verify alone gives (the same chain rule,
                               the same uniforms)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from specpack import names
from specpack.errors import SpecpackError
from specpack.runtime.batched_caches import Bound, CacheOpener
from specpack.runtime.batched_target import BatchedRuns
from specpack.runtime.ort_session import OrtGraph
from specpack.runtime.state import DecodeState, Proposal, VerifyResult

QReader = Callable[[DecodeState, Proposal], np.ndarray]  # a proposal's q as host rows [k, V]
# slots [lo, hi)'s q rows in place, [hi - lo, k_max, V], once each sampling row's proposal is checked to be its slot's
QRows = Callable[[int, int, list[tuple[DecodeState, Proposal]]], Bound]


class BatchedTarget(BatchedRuns):
    def __init__(self, graph: Path | OrtGraph | CacheOpener, *, vocab_size: int, read_q: QReader | None = None,
                 q_rows: QRows | None = None, **kwargs: Any) -> None:
        """read_q: a proposal's q (its drafter's handle) as host rows [k, V]; None: q is a host array already (the
        cpu backend's drafts; a device backend reads its draft's buffer back: backends/cuda_batched.py); q_rows: the
        draft model's q rows in place on the device (module docstring)."""
        super().__init__(graph, **kwargs)
        slots, k_max = self.slots, self.k_max
        self.vocab_size = vocab_size
        self.read_q, self.q_rows = read_q, q_rows
        self._counts = np.zeros(slots, np.int64)                     # [slots] views [lo:hi]
        self._tokens = np.zeros(slots, np.int64)
        self._temperature = np.zeros(slots, np.float32)
        self._top_k = np.zeros(slots, np.int64)
        self._top_p = np.ones(slots, np.float32)
        self._q = np.zeros(slots * k_max * vocab_size, np.float32)   # flat: [B, K, V] views
        self._u = np.zeros(slots * (k_max + 1), np.float32)          # flat: [B, K+1] views
        self._n = np.zeros(slots, np.int64)
        self._next = np.zeros(slots, np.int64)

    def verify_rows(self, rows: list[tuple[DecodeState, Proposal]]) -> list[tuple[VerifyResult, float]]:
        for _, proposal in rows:
            if proposal.parents is not None:
                raise SpecpackError("the batched target verifies chains only", expected="no token tree",
                                    found="a tree proposal", hint="docs/batching.md")
        t = self.clock()
        tokens = {state.slot: state.ids[self.lengths[state.slot] : state.length + proposal.k] for state, proposal in rows}
        n, next_token = self._run(tokens, {state.slot: (state, proposal) for state, proposal in rows})
        out = []
        for state, _ in rows:
            accepted = int(n[state.slot])
            self.lengths[state.slot] = state.length + accepted  # the committed tokens and the accepted drafts
            out.append(VerifyResult(accepted, int(next_token[state.slot])))
        share = (self.clock() - t) / len(rows)
        return [(result, share) for result in out]

    def run(self, tokens: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        """A run whose verdict is dropped (a prefill chunk): every row greedy, no drafts."""
        n, _ = self._run(tokens, {})
        return {slot: n[slot : slot + 1] for slot in tokens}

    def _run(self, tokens: dict[int, np.ndarray], verifies: dict[int, tuple[DecodeState, Proposal]]
             ) -> tuple[np.ndarray, np.ndarray]:
        """One run; n_accepted and next_token indexed by slot (rows outside the run: stale)."""
        lo, hi, seq, inputs, outputs = self.bind(tokens)
        sampling = [(state, proposal) for state, proposal in verifies.values() if not state.params.greedy]
        wide = bool(sampling) and self.caches.launch_bound  # K = k_max: one shape per S for the captured graphs
        in_place = wide and self.q_rows is not None and all(proposal.q is not None for _, proposal in sampling)
        k = self.k_max if wide else max((proposal.k for _, proposal in verifies.values()), default=0)
        batch, vocab = hi - lo, self.vocab_size
        q = self._q[: batch * k * vocab].reshape(batch, k, vocab)    # [B, K, V]
        u = self._u[: batch * (k + 1)].reshape(batch, k + 1)         # [B, K+1]
        for r, slot in enumerate(range(lo, hi)):
            self._tokens[slot] = len(tokens[slot]) if slot in tokens else seq
            self._counts[slot], self._temperature[slot], self._top_k[slot], self._top_p[slot] = 0, 0.0, 0, 1.0
            if slot not in verifies:
                continue
            state, proposal = verifies[slot]
            k_b, given = proposal.k, state.sampling_inputs
            self._counts[slot] = k_b
            self._temperature[slot] = given[names.TEMPERATURE][0]
            self._top_k[slot], self._top_p[slot] = given[names.TOP_K][0], given[names.TOP_P][0]
            if state.params.greedy:
                continue
            u[r] = 0.0
            u[r, : k_b + 1] = state.uniforms.verify[0, : k_b + 1]
            if in_place:
                continue
            if proposal.q is not None:
                given_q = np.asarray(proposal.q) if self.read_q is None else self.read_q(state, proposal)
                q[r, :k_b] = given_q.reshape(-1, vocab)[:k_b]         # [k_b, V]
            else:                                                    # a deterministic proposal: q one-hot
                q[r, :k_b] = 0.0
                q[r, np.arange(k_b), proposal.tokens] = 1.0
        probs: Bound = q
        greedy = all(state.params.greedy for state, _ in verifies.values())
        if greedy:  # q read by no row: nothing written or copied
            probs = self.caches.ignored(q.shape, np.float32)
        elif in_place:
            assert self.q_rows is not None
            probs = self.q_rows(lo, hi, sampling)
        # every row greedy or sampling without filters: a device may run the plain form (graphs/batched_plain_form.py)
        plain = all(state.params.greedy or not state.params.filters(vocab) for state, _ in verifies.values())
        head: dict[str, Bound] = {
                names.DRAFT_COUNTS: self._counts[lo:hi], names.TOKEN_COUNTS: self._tokens[lo:hi], names.DRAFT_PROBS: probs,
                names.UNIFORMS: u, names.TEMPERATURE: self._temperature[lo:hi], names.TOP_K: self._top_k[lo:hi],
                names.TOP_P: self._top_p[lo:hi]}
        self.caches.run({**inputs, **head},
                        {names.N_ACCEPTED: self._n[lo:hi], names.NEXT_TOKEN: self._next[lo:hi], **outputs},
                        greedy=greedy, plain=plain, capture=self.decode_step(seq))
        return self._n, self._next
