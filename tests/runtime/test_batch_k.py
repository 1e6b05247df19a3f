"""The batch's cap on k (runtime/batch_k.py) on simulated step costs, and the scheduler applying it (on the reference
backend over bigram tables: the logic beside the real-backend tests of test_scheduler.py)."""

from __future__ import annotations

from harness import bigram_backend, table

from specpack.runtime.adaptive_k import AdaptiveConfig
from specpack.runtime.batch_k import UNCAPPED, BatchKCap, NoCap
from specpack.runtime.drafter import ModelDrafter
from specpack.runtime.k_policy import FixedK
from specpack.runtime.loop import Decoding
from specpack.runtime.scheduler import Row, Scheduler, SchedulerConfig, SerialVerifier
from specpack.runtime.state import DecodeState
from specpack.runtime.stats import DecodeStats
from specpack.sampling import SamplingParams, Uniforms


def _gpu_like(tokens: int) -> float:
    """A batched verify that is memory-bound up to 32 rows (one weight read), then grows with the rows."""
    return 1.0 + max(0, tokens - 32) / 32


def _measured(acceptance: float, max_batch: int = 64, k_max: int = 4) -> BatchKCap:
    cap = BatchKCap(k_max, max_batch, AdaptiveConfig(prior_acceptance=acceptance, prior_weight=50.0))
    for rows in (1, 4, 16, 64):
        for k in range(k_max + 1):
            ks = [k] * rows
            cap.observe(ks, [round(acceptance * k)] * rows, 0.1 * k, _gpu_like(rows * (k + 1)))
    return cap


def test_speculation_is_turned_down_as_the_batch_grows() -> None:
    cap = _measured(0.8)
    caps = [cap.cap(b) for b in (1, 4, 8, 16, 32, 64)]
    assert caps[0] == 4 and caps[-1] == 0, caps
    assert caps == sorted(caps, reverse=True)  # never more drafts at a larger batch
    assert _measured(0.2).cap(1) < caps[0]      # and fewer when little is accepted


def test_nothing_is_capped_before_anything_is_measured() -> None:
    assert BatchKCap(4, 8).cap(8) == UNCAPPED and NoCap().cap(64) == UNCAPPED


class _Cap:
    def __init__(self, value: int) -> None:
        self.value, self.steps = value, 0

    def cap(self, rows: int) -> int:
        return self.value

    def observe(self, ks: list[int], accepted: list[int], draft_s: float, verify_s: float) -> None:
        self.steps += 1
        assert all(k <= self.value for k in ks[:1])  # row 0 is capped; row 1 (seeded sampling) is not


def test_the_scheduler_caps_every_row_but_seeded_sampling() -> None:
    t = table(20, 1)
    backend = bigram_backend(t, t + table(20, 2, 1.0), slots=2)
    finished: dict[int, str | BaseException] = {}
    params = [SamplingParams(), SamplingParams(1.0)]

    def open_row(job: int, slot: int) -> Row[int]:
        state = DecodeState.start([1 + job, 2], 12, params[job], Uniforms(params[job], 8, seed=job), eos_ids=frozenset(),
                                  max_len=64, k_max=8, stats=DecodeStats(k=4), slot=slot)
        decoding = Decoding(state, backend.target(), ModelDrafter(backend.draft), FixedK(4))
        return Row(job, slot, decoding, None, own_k=job == 1)

    cap = _Cap(1)
    scheduler: Scheduler[int] = Scheduler(SchedulerConfig(max_batch=2), backend.target(), open_row,  # type: ignore[arg-type]
                                          lambda row, outcome: finished.__setitem__(row.job, outcome),
                                          SerialVerifier(backend.target(), lambda: 0.0), batch_policy=cap)
    rows: dict[int, DecodeState] = {}
    scheduler.add(0)
    scheduler.add(1)
    while not scheduler.idle:
        scheduler.step()
        rows.update({r.job: r.state for r in scheduler.rows})
    assert finished == {0: "length", 1: "length"} and cap.steps > 0
    assert rows[0].stats.k_histogram[2:] == [0, 0, 0] and rows[0].stats.k_histogram[1] > 0  # capped at 1
    assert rows[1].stats.k_histogram[4] > 0                                                 # its own k = 4
