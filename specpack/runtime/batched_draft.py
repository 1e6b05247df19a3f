"""The draft model over a batched static-form graph with a greedy head (docs/batching.md): every row's j-th draft in
one ONNX Runtime run, j = 0 .. max k_b - 1 (runtime/batched_target.py's engine, over the draft's graph).

    catch_up rows whose cache trails by more than 2 tokens (a new request, or after k 0 steps) first feed
             ids[cached_b : start_b - 1] in a run of their own, outside the timed draft phase (`catch_up`)
    step j   rows with k_b > j that drafted no eos yet: row b feeds ids[cached_b : start_b] at j = 0 (its catch-up: the
             last committed token, or the last draft and the bonus token), then its draft j - 1; its draft j is the
             argmax after its last fed token, written into state.ids[start_b + j]

Greedy rows only (the head is argmax; q is None, which a greedy verify never reads). Its cache trails the committed
tokens like ModelDrafter's: after a proposal it holds the fed tokens, and commit keeps at most length - 1.
"""

from __future__ import annotations

from specpack.errors import SpecpackError
from specpack.runtime.batched_target import BatchedGreedyTarget
from specpack.runtime.state import DecodeState, Proposal

STEADY_CATCH_UP = 2  # a drafting row's cache trails its committed tokens by at most this many (the last draft, the bonus)


class BatchedGreedyDrafter:
    """A Drafter (one row: the loop) and the scheduler's RowDrafter (a step's rows together)."""

    def __init__(self, engine: BatchedGreedyTarget) -> None:
        self.engine = engine
        self._fresh: set[int] = set()  # slots whose request has not drafted yet (its prefill waits for that)

    def begin(self, state: DecodeState) -> None:
        """A new request: its draft prefill waits for its first drafts (`catch_up`; as ModelDrafter's: a row that never
        drafts, e.g. capped to k 0 by the batch, never pays for it)."""
        self._check(state)
        self._fresh.add(state.slot)

    def catch_up(self, states: list[DecodeState]) -> None:
        """Before a step's drafts (the scheduler calls it outside the draft phase it times): each row whose draft cache
        trails by more than a steady row's catch-up (the last draft and the bonus token) feeds every committed token
        but the last, at batch 1 in a run of its own (in the batch's run it would pad every row to its length): a new
        request's prefill, or the tokens its k 0 steps committed. Its j = 0 run then feeds one token, as a steady
        row's does, so a draft phase's time is the drafts' (runtime/batch_k.py's d_B, each row's adaptive k)."""
        engine = self.engine
        for state in states:
            self._check(state)
            slot = state.slot
            if slot in self._fresh:
                self._fresh.discard(slot)
                engine.lengths[slot] = 0
            if engine.lengths[slot] < state.length - STEADY_CATCH_UP:
                engine.run({slot: state.ids[engine.lengths[slot] : state.length - 1]})
                engine.lengths[slot] = state.length - 1

    def propose(self, state: DecodeState, k: int) -> Proposal:
        return self.propose_rows([(state, k)])[0]

    def commit(self, state: DecodeState) -> None:
        slot = state.slot
        self.engine.lengths[slot] = min(self.engine.lengths[slot], state.length - 1)  # the next token is not cached

    def propose_rows(self, rows: list[tuple[DecodeState, int]]) -> list[Proposal]:
        """Up to k_b drafts for each row (fewer after a drafted eos), all rows' j-th drafts in one run."""
        engine = self.engine
        drafted = {state.slot: 0 for state, _ in rows}
        self.catch_up([state for state, _ in rows])  # a no-op where the scheduler caught them up
        for j in range(max((k for _, k in rows), default=0)):
            feeds = {}
            for state, k in rows:
                slot, start = state.slot, state.length
                if drafted[slot] == j < k and (j == 0 or state.ids[start + j - 1] not in state.eos_ids):
                    feeds[slot] = state.ids[engine.lengths[slot] : start + j]  # [S_b]: the catch-up, or draft j - 1
            if not feeds:
                break
            best = engine.run(feeds)
            for state, _ in rows:
                slot = state.slot
                if slot in feeds:
                    state.ids[state.length + j] = best[slot][0]  # the argmax after its last fed token
                    engine.lengths[slot] = state.length + j
                    drafted[slot] = j + 1
        return [Proposal(tokens=state.ids[state.length : state.length + drafted[state.slot]], q=None)
                for state, _ in rows]

    @staticmethod
    def _check(state: DecodeState) -> None:
        if not state.params.greedy:
            raise SpecpackError("the batched greedy drafter drafts for greedy requests only", expected="temperature 0",
                                found=f"{state.params}", hint="docs/batching.md: the batched sampling heads remain")
