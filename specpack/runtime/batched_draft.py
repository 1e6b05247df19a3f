"""The draft model over a batched static-form graph with a greedy head (docs/batching.md): every row's j-th draft in
one ONNX Runtime run, j = 0 .. max k_b - 1 (runtime/batched_target.py's engine, over the draft's graph).

    catch_up rows whose cache trails by more than 2 tokens (a new request, or after k 0 steps) first feed
             ids[cached_b : start_b - 1], outside the timed draft phase (`catch_up`): each in a run of its own where a
             run costs its rows (the CPU: one run would pad every row to the longest), together in runs of at most
             CATCH_UP_RUN_TOKENS padded tokens where a run costs its launch (`together`: a GPU, where 64 rows caught
             up one at a time cost 64 uncaptured runs)
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
CATCH_UP_RUN_TOKENS = 8192  # the most padded tokens, (hi - lo) * S, of a catch-up run over several rows (`together`)


class BatchedGreedyDrafter:
    """A Drafter (one row: the loop) and the scheduler's RowDrafter (a step's rows together)."""

    def __init__(self, engine: BatchedGreedyTarget, together: bool | None = None) -> None:
        """together: rows catch up in shared runs (default: where the engine's caches say a run costs its launch)."""
        self.engine = engine
        self.together = engine.caches.launch_bound if together is None else together
        self._fresh: set[int] = set()  # slots whose request has not drafted yet (its prefill waits for that)

    def begin(self, state: DecodeState) -> None:
        """A new request: its draft prefill waits for its first drafts (`catch_up`; as ModelDrafter's: a row that never
        drafts, e.g. capped to k 0 by the batch, never pays for it)."""
        self._check(state)
        self._fresh.add(state.slot)

    def catch_up(self, states: list[DecodeState]) -> None:
        """Before a step's drafts (the scheduler calls it outside the draft phase it times): each row whose draft cache
        trails by more than a steady row's catch-up (the last draft and the bonus token) feeds every committed token
        but the last (a new request's prefill, or the tokens its k 0 steps committed): at batch 1 in a run of its own,
        or, `together`, in shared runs (`_groups`). Its j = 0 run then feeds one token, as a steady row's does, so a
        draft phase's time is the drafts' (runtime/batch_k.py's d_B, each row's adaptive k)."""
        engine = self.engine
        trailing = []
        for state in states:
            self._check(state)
            slot = state.slot
            if slot in self._fresh:
                self._fresh.discard(slot)
                engine.lengths[slot] = 0
            if engine.lengths[slot] < state.length - STEADY_CATCH_UP:
                trailing.append(state)
        for group in self._groups(trailing):
            engine.run({state.slot: state.ids[engine.lengths[state.slot] : state.length - 1] for state in group})
            for state in group:
                engine.lengths[state.slot] = state.length - 1

    def _groups(self, trailing: list[DecodeState]) -> list[list[DecodeState]]:
        """The catch-up runs: one row each, or (`together`) rows in slot order while the run over their slot range,
        every row padded to the longest catch-up S, stays within CATCH_UP_RUN_TOKENS padded tokens and every slot of
        the range (pad rows included: they write past their own lengths) has room for S more rows of cache."""
        if not self.together:
            return [[state] for state in trailing]
        engine = self.engine
        groups: list[list[DecodeState]] = []
        for state in sorted(trailing, key=lambda st: st.slot):
            if groups:
                group = [*groups[-1], state]
                lo, hi = group[0].slot, state.slot + 1
                seq = max(st.length - 1 - engine.lengths[st.slot] for st in group)
                if (hi - lo) * seq <= CATCH_UP_RUN_TOKENS and all(engine.lengths[s] + seq <= engine.width
                                                                   for s in range(lo, hi)):
                    groups[-1] = group
                    continue
            groups.append([state])
        return groups

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
