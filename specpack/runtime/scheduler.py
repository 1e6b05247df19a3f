"""Continuous batching: many requests decoded together, joining and leaving at step boundaries (docs/batching.md).

One `Scheduler.step()` is one iteration over every admitted request (a row), in four numbered phases:

    1. leave    rows whose caller cancelled (or whose stop string was hit) finish "cancelled"; their slots free up
    2. join     waiting jobs take free cache slots, first come first served (at most max_batch rows); a job that
                finds nothing else there (no row, no other job waiting) runs solo where the scheduler has `open_solo`
                (below)
    3. prefill  rows still prefilling run whole chunks of `prefill_chunk` prompt tokens, in arrival order, within a
                budget of prompt tokens per iteration (at least one chunk; `prefill_budget`); a row whose rest of the
                prompt fits runs the prefill proper (its first token). Each in a run of its own within `prefill_chunk`
                tokens, or, with a `row_prefill` (a batched engine where a run costs its launch: a GPU), the
                iteration's chunks in one run and its prefills proper in another, within PREFILL_TOGETHER tokens
    4. decode   every decoding row: k (its own policy, under the batch's cap: batch_k.py) and its drafts; one verify
                call over all rows (RowVerifier: in turn on the per-slot engines today, one batched run later); commit

Solo rows (`open_solo`: a batched engine's scheduler, docs/batching.md "A lone request"): a request admitted alone
decodes as Pack.run decodes it, on the per-slot engines of slot `solo_slot` (the batch-1 graphs and their captured
shapes): its whole prompt in its prefill, then its own steps (plan, draft, verify, commit), never capped by the batch
and never observed by its policy; its slot's rows in the batched target are emptied when it is admitted. Requests that
arrive meanwhile batch as usual on the other slots; with `solo_joins` (where a batched run costs its launch: a solo
step beside the batch's run would lengthen every iteration) the solo row joins the batch as the first of them is
admitted (its decoding's target becomes the batched one, its cache rows there from one prefill run over its
committed tokens but the last; `on_join`: the caller's part, e.g. its drafter), else it steps beside the batch's run
to its end (where a run costs its rows: the CPU).

A row's chunk boundaries depend on its own prompt only (multiples of prefill_chunk), never on the other rows, so a
request decodes the same tokens whatever it is batched with. Nothing here is thread-safe: one thread (the Batcher,
batcher.py) owns the scheduler and the backend while it steps.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from specpack.errors import SpecpackError
from specpack.runtime.backend import TargetModel
from specpack.runtime.batch_k import BatchPolicy, NoCap
from specpack.runtime.loop import Decoding
from specpack.runtime.state import NO_DRAFTS, DecodeState, Proposal, VerifyResult

PREFILL_CHUNK = 256   # prompt tokens per prefill run of a joining request (and per iteration, over all of them)
PREFILL_TOGETHER = 8192  # prompt tokens per iteration where its prefills run together (row_prefill): a run costs its
                         # launch there; as the draft's catch-up runs (batched_draft.CATCH_UP_RUN_TOKENS)

J = TypeVar("J")      # the caller's job (what it submitted and wants back)


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch: int                       # rows decoding at once: at most the backend's cache slots
    prefill_chunk: int = PREFILL_CHUNK   # prompt tokens per prefill run of a row
    prefill_budget: int | None = None    # prompt tokens prefilled per iteration, over all rows (at least one chunk);
                                         # None: prefill_chunk, or PREFILL_TOGETHER where they run together

    def __post_init__(self) -> None:
        for name, low in (("max_batch", 1), ("prefill_chunk", 2), ("prefill_budget", 1)):
            value = getattr(self, name)
            if name == "prefill_budget" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise SpecpackError(f"invalid {name}", expected=f"an integer >= {low}", found=repr(value))


class ChunkedTarget(TargetModel, Protocol):
    def prefill_chunk(self, state: DecodeState, end: int) -> None:
        """The target over state.ids[cached:end] (end < state.length) into the cache, nothing emitted."""
        ...


@dataclass(eq=False)  # a row is itself: `row in rows` by identity (a field-by-field compare cost O(B^2) deep ones a step)
class Row(Generic[J]):
    """One admitted request: its job, cache slot and decode; `finish(reason)` ends it (the caller's result)."""

    job: J
    slot: int
    decoding: Decoding
    halt: threading.Event | None         # set: no further step (the caller's cancel, a stop string hit)
    own_k: bool = False                  # its k schedule is its own, never capped by the batch (seeded sampling:
                                         # its tokens must follow its seed alone, and they follow its k schedule)
    cached: int = 0                      # prompt tokens in the target's cache (chunked prefill)
    prefilled: bool = False              # the prefill proper ran: the row decodes
    solo: bool = False                   # it decodes alone on the per-slot engines (open_solo), not in the batch
    last_k: int = 0                      # the drafts its last step verified (0: none yet, so its next drafts start
                                         # with the draft's catch-up: its prefill, or the tokens of k 0 steps)

    @property
    def state(self) -> DecodeState:
        return self.decoding.state

    @property
    def halted(self) -> bool:
        return self.halt is not None and self.halt.is_set()


class RowVerifier(Protocol):
    def verify_rows(self, rows: list[tuple[DecodeState, Proposal]]) -> list[tuple[VerifyResult, float]]:
        """Each row's verify, in order: its VerifyResult and the seconds its step pays for the verify."""
        ...


class RowDrafter(Protocol):
    def catch_up(self, states: list[DecodeState]) -> None:
        """Before the timed draft phase: feed what a row's draft has not seen beyond a steady step's catch-up (its
        prefill, the tokens of its k 0 steps), so the phase times drafts only."""
        ...

    def propose_rows(self, rows: list[tuple[DecodeState, int]]) -> list[Proposal]:
        """Each row's proposal of up to k_b drafts, in order (all rows' j-th drafts in one run)."""
        ...


class SerialVerifier:
    """Every row's verify on its own slot, one after the other (the per-slot engines of every backend). A batched
    engine (docs/batching.md) takes the same rows in one run and shares its time among them."""

    def __init__(self, target: TargetModel, clock: Callable[[], float]) -> None:
        self.target, self.clock = target, clock

    def verify_rows(self, rows: list[tuple[DecodeState, Proposal]]) -> list[tuple[VerifyResult, float]]:
        out = []
        for state, proposal in rows:
            t = self.clock()
            result = self.target.verify(state, proposal)
            out.append((result, self.clock() - t))
        return out


class RowPrefill(RowVerifier, Protocol):
    def prefill_chunks(self, chunks: list[tuple[DecodeState, int]]) -> None:
        """Each (state, end): the row's prompt tokens from its cached length to `end` cached, all in one run."""
        ...


Opener = Callable[[J, int], Row[J]]          # (job, slot) -> its row: state, policy, drafter, text out
Finisher = Callable[[Row[J], str | BaseException], None]  # a row ended: its finish reason, or what it raised


@dataclass
class Scheduler(Generic[J]):
    """Admission by cache slots, chunked prefill, one step over every row per iteration (the module docstring)."""

    config: SchedulerConfig
    target: ChunkedTarget
    open_row: Opener[J]
    finish_row: Finisher[J]
    verifier: RowVerifier
    batch_policy: BatchPolicy = field(default_factory=NoCap)  # the cap on each row's k at a batch size (batch_k.py)
    row_drafter: RowDrafter | None = None  # drafts together for the rows whose drafter it is (batched_draft.py)
    row_prefill: RowPrefill | None = None  # an iteration's prefill chunks, and its prefills proper, each in one run
    open_solo: Opener[J] | None = None     # a lone job's row on the per-slot engines (module docstring); None: never solo
    solo_slot: int = 0                     # the slot a solo row takes (the per-slot engines' captured one)
    solo_joins: bool = False               # a solo row joins the batch when another row is admitted (else solo to its end)
    on_join: Callable[[Row[J]], None] | None = None  # the caller's part of a solo row's join (its drafter)
    clock: Callable[[], float] = time.perf_counter
    waiting: deque[J] = field(default_factory=deque)
    rows: list[Row[J]] = field(default_factory=list)    # admitted, in arrival order
    free: list[int] = field(default_factory=list)       # cache slots no row holds

    def __post_init__(self) -> None:
        self.free = list(range(self.config.max_batch - 1, -1, -1))  # pop() gives slot 0 first

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.rows

    def add(self, job: J) -> None:
        """A job waits for a row (the Batcher bounds how many wait)."""
        self.waiting.append(job)

    def step(self) -> None:
        """One iteration: leave, join, prefill, decode (the module docstring). A row whose step raises finishes
        with that exception; the others go on."""
        self._leave()
        self._join()
        self._prefill()
        self._decode()

    def cancel_all(self, reason: BaseException) -> None:
        """Every job, waiting or admitted, finishes with `reason` (closing)."""
        for row in list(self.rows):  # _end removes each from self.rows
            self._end(row, reason)
        while self.waiting:
            job = self.waiting.popleft()
            self.finish_row(Row(job, -1, _NO_DECODING, None), reason)

    # 1. leave
    def _leave(self) -> None:
        for row in [r for r in self.rows if r.halted]:
            self._end(row, row.decoding.finish(cancelled=True))

    # 2. join
    def _join(self) -> None:
        while self.waiting and self.free:
            solo = self.open_solo is not None and not self.rows and len(self.waiting) == 1 \
                and self.solo_slot in self.free
            job = self.waiting.popleft()
            if solo:
                self.free.remove(self.solo_slot)
            slot = self.solo_slot if solo else self.free.pop()
            try:
                row = (self.open_solo if solo and self.open_solo is not None else self.open_row)(job, slot)
                row.solo = solo
                if solo:
                    self.target.reset(row.state)  # the batched rows of its slot: a join fills them from 0
                if row.halted:  # cancelled while it waited
                    self.free.append(slot)
                    self.finish_row(row, row.decoding.finish(cancelled=True))
                    continue
                row.decoding.begin()
            except Exception as err:
                self.free.append(slot)
                self.finish_row(Row(job, slot, _NO_DECODING, None), err)
                continue
            self.rows.append(row)
            if not solo and self.solo_joins:
                for alone in [r for r in self.rows if r.solo]:
                    self._join_batch(alone)

    def _join_batch(self, row: Row[J]) -> None:
        """A solo row into the batch (the module docstring): from now on it steps with the others (its drafts to catch
        up first)."""
        state = row.state
        try:
            row.decoding.target = self.target
            if row.prefilled and state.length > 1:
                self.target.prefill_chunk(state, state.length - 1)
            if self.on_join is not None:
                self.on_join(row)
        except Exception as err:
            self._end(row, err)
            return
        row.solo, row.last_k = False, 0

    # 3. prefill
    def _prefill(self) -> None:
        chunk, budget = self.config.prefill_chunk, self.config.prefill_budget
        if budget is None:
            budget = chunk if self.row_prefill is None else PREFILL_TOGETHER
        picked: list[tuple[Row[J], bool]] = []  # in arrival order: (row, whether the rest of its prompt fits: the
        for row in [r for r in self.rows if not r.prefilled]:  # prefill proper, its first token; else a chunk)
            if budget <= 0:
                break
            rest = row.state.length - row.cached
            picked.append((row, row.solo or rest <= chunk))  # a solo row: its whole prompt, as alone
            budget -= rest if row.solo else min(rest, chunk)
        if self.row_prefill is not None:
            for row in [r for r, _ in picked if r.solo]:
                self._prefill_solo(row)
            picked = [(r, final) for r, final in picked if not r.solo]
            self._prefill_together([r for r, final in picked if not final], [r for r, final in picked if final])
            return
        for row, final in picked:
            try:
                if row.solo:
                    self._prefill_solo(row)
                elif final:
                    row.decoding.prefill()
                    self._prefilled(row)
                else:
                    self.target.prefill_chunk(row.state, row.cached + chunk)
                    row.cached += chunk
            except Exception as err:
                self._end(row, err)

    def _prefill_solo(self, row: Row[J]) -> None:
        try:
            row.decoding.prefill()
            self._prefilled(row)
        except Exception as err:
            self._end(row, err)

    def _prefill_together(self, chunks: list[Row[J]], finals: list[Row[J]]) -> None:
        """The chunks in one run, then the prefills proper in one verify run (row_prefill); a run that fails ends its
        rows."""
        assert self.row_prefill is not None
        chunk = self.config.prefill_chunk
        if chunks:
            try:
                self.row_prefill.prefill_chunks([(row.state, row.cached + chunk) for row in chunks])
            except Exception as err:
                for row in chunks:
                    self._end(row, err)
            else:
                for row in chunks:
                    row.cached += chunk
        started = []
        for row in finals:
            try:
                row.decoding.prefill_start()
                started.append(row)
            except Exception as err:
                self._end(row, err)
        if not started:
            return
        try:
            results = self.row_prefill.verify_rows([(row.state, NO_DRAFTS) for row in started])
        except Exception as err:
            for row in started:
                self._end(row, err)
            return
        for row, (result, _) in zip(started, results, strict=True):
            try:
                row.decoding.prefill_end(result)
                self._prefilled(row)
            except Exception as err:
                self._end(row, err)

    def _prefilled(self, row: Row[J]) -> None:
        row.prefilled, row.cached = True, row.state.length
        self._end_if_finished(row)

    # 4. decode
    def _decode(self) -> None:
        decoding = [r for r in self.rows if r.prefilled and not r.halted]
        for row in [r for r in decoding if r.solo]:
            self._step_solo(row)
        rows = [r for r in decoding if not r.solo]
        if not rows:
            return
        cap = self.batch_policy.cap(len(rows))
        t_draft = self.clock()
        ks: list[tuple[Row[J], int]] = []
        for row in rows:
            try:
                ks.append((row, row.decoding.plan(None if row.own_k else cap)))
            except Exception as err:
                self._end(row, err)
        proposals, catch_up_s = self._draft_together([(row, k) for row, k in ks
                                                      if k > 0 and row.decoding.drafter is self.row_drafter])
        planned: list[tuple[Row[J], Proposal]] = []
        for row, k in ks:
            if row not in self.rows:  # ended while drafting
                continue
            try:
                planned.append((row, proposals[id(row)] if id(row) in proposals else row.decoding.draft(k)))
            except Exception as err:
                self._end(row, err)
        t_verify = self.clock()
        try:
            results = self.verifier.verify_rows([(row.state, proposal) for row, proposal in planned])
        except Exception as err:  # a batched run failed: every row in it
            for row, _ in planned:
                self._end(row, err)
            return
        # a row drafted on its own slot whose draft caught up in the phase (its prefill, or after k 0 steps): the
        # phase is not the drafts' cost (the row drafter's catch-ups ran apart: catch_up_s)
        caught_up = any(p.k > 0 and row.last_k == 0 and row.decoding.drafter is not self.row_drafter
                        for row, p in planned)
        # what the step paid for drafting after k 0: the row drafter's catch-ups, or (a row that caught up on its own
        # slot, inside its draft phase) the whole phase, an upper bound
        phase = t_verify - t_draft
        self.batch_policy.observe([p.k for _, p in planned], [r.n_accepted for r, _ in results],
                                  None if caught_up else phase - catch_up_s, self.clock() - t_verify,
                                  catch_up_s=phase if caught_up else catch_up_s)
        for (row, proposal), (result, verify_s) in zip(planned, results, strict=True):
            row.last_k = proposal.k
            try:
                row.decoding.commit(proposal, result, verify_s)
                self._end_if_finished(row)
            except Exception as err:
                self._end(row, err)

    def _step_solo(self, row: Row[J]) -> None:
        """A solo row's step, as runtime/loop.py's decode runs it alone: on its own target, its k its policy's."""
        try:
            row.last_k = row.decoding.step().k
            self._end_if_finished(row)
        except Exception as err:
            self._end(row, err)

    def _draft_together(self, rows: list[tuple[Row[J], int]]) -> tuple[dict[int, Proposal], float]:
        """(id(row) -> its proposal, the seconds of the rows' catch-up), for the rows the row drafter drafts (one run
        per draft position, after the catch-up of rows whose draft trails: RowDrafter.catch_up); each row's draft
        phase is its share of the drafts' time. A failure ends those rows."""
        if not rows or self.row_drafter is None:
            return {}, 0.0
        t0 = self.clock()
        try:
            self.row_drafter.catch_up([row.state for row, _ in rows])
            t = self.clock()
            proposals = self.row_drafter.propose_rows([(row.state, k) for row, k in rows])
        except Exception as err:
            for row, _ in rows:
                self._end(row, err)
            return {}, 0.0
        share = (self.clock() - t) / len(rows)
        for row, _ in rows:
            row.decoding.drafted(share)
        return {id(row): proposal for (row, _), proposal in zip(rows, proposals, strict=True)}, t - t0

    def _end_if_finished(self, row: Row[J]) -> None:
        if row.state.finished:
            self._end(row, row.decoding.finish(cancelled=False))

    def _end(self, row: Row[J], outcome: str | BaseException) -> None:
        if row in self.rows:
            self.rows.remove(row)
            self.free.append(row.slot)
        self.finish_row(row, outcome)


class _NoDecoding:
    """The decoding of a job that never got one (refused at admission, or cancelled while closing)."""

    state: Any = None

    def finish(self, *, cancelled: bool) -> str:
        return "cancelled"


_NO_DECODING: Any = _NoDecoding()
