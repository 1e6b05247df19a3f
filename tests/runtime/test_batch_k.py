"""The batch's cap on k (runtime/batch_k.py) on simulated step costs, and the scheduler applying it (on the reference
backend over bigram tables: the logic beside the real-backend tests of test_scheduler.py)."""

from __future__ import annotations

import itertools

import numpy as np
from harness import bigram_backend, table

from specpack.runtime.adaptive_k import AdaptiveConfig
from specpack.runtime.batch_k import UNCAPPED, BatchKCap, NoCap, padded_rows
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
            cap.observe(ks, [round(acceptance * k)] * rows, 0.1 * k, _gpu_like(padded_rows(ks)))
    return cap


def test_speculation_is_turned_down_as_the_batch_grows() -> None:
    cap = _measured(0.8)
    caps = [cap.cap(b) for b in (1, 4, 8, 16, 32, 64)]
    # at 64 rows only k 1 is left: it fills the second row every batched run has anyway (MIN_WIDTH), so it is free
    assert caps[0] == 4 and caps[-1] == 1, caps
    assert caps == sorted(caps, reverse=True)  # never more drafts at a larger batch
    assert _measured(0.2).cap(1) < caps[0]      # and fewer when little is accepted


def test_a_step_is_priced_at_its_widest_row() -> None:
    """The batched engine pads every row to the widest row's k + 1 (at least 2): one row drafting 4 while three draft
    none costs a 4 x 5-row run (the real pair's int4 batched graph on the CPU: 4 rows x 5 in 154 ms, 4 x 2 in 78 ms).
    Priced at the rows' own sum (5 + 1 + 1 + 1 = 8), that cost landed where a uniform k 1 is looked up, so k 1, which
    costs nothing more than k 0 here (both run 2 rows wide), was never taken (the old pricing's cap: 0)."""
    cpu_like = 20.0  # ms per padded row: compute-bound
    cap = BatchKCap(4, 4, AdaptiveConfig(prior_acceptance=0.5, prior_weight=50.0))
    for _ in range(5):
        for ks in ([0, 0, 0, 0], [4, 0, 0, 0], [2, 1, 0, 0], [4, 4, 4, 4]):
            cap.observe(ks, [k // 2 for k in ks], 0.0, cpu_like * padded_rows(ks))
    assert padded_rows([4, 0, 0, 0]) == 20 and padded_rows([0, 0]) == 4  # at least 2 rows wide: k 1 costs what k 0 does
    assert cap.cap(4) == 1  # drafting pays only where it is free: k 1 fills the second row of every run


def test_a_cap_of_zero_is_probed_again() -> None:
    """Where drafting was measured too dear (a bad d_B sample: the draft's prefill once landed in it), k 0 wins; a cap
    of 0 drafts nothing, so every probe_every steps one step is capped at the best kappa >= 1 instead, the interval
    doubling while 0 keeps winning (up to probe_max), as adaptive k's probes."""
    config = AdaptiveConfig(prior_acceptance=0.8, prior_weight=50.0, probe_every=4, probe_max=8)
    cap = BatchKCap(4, 4, config)
    for ks in ([0, 0, 0, 0], [2, 2, 2, 2]):
        cap.observe(ks, [1 if k else 0 for k in ks], 10.0 * max(ks), 0.1 * padded_rows(ks))  # 5 s a draft
    caps = [cap.cap(4) for _ in range(22)]
    probes = [i for i, c in enumerate(caps) if c > 0]
    assert probes == [3, 11, 19] and {caps[i] for i in probes} == {1}  # after 4, then 8 (probe_max) steps at 0
    cap.observe([1] * 4, [1] * 4, None, 0.1 * padded_rows([1] * 4))  # a probe whose drafts caught up: no d_B sample
    for _ in range(5):
        cap.observe([1] * 4, [1] * 4, 0.001, 0.1 * padded_rows([1] * 4))  # probes that measure drafting cheap
    assert cap.cap(4) >= 1  # drafting wins again


def test_probes_are_spaced_by_their_catch_ups() -> None:
    """Where k 0 wins and a probe's catch-ups cost 5 steps' time (16 rows on an H200: the draft's uncaptured catch-ups
    and first prompts made k auto 0.77x k 0), probes come at least 5 / probe_share = 100 steps apart; without a
    catch-up timed they keep the probe_every schedule (the test above)."""
    config = AdaptiveConfig(prior_acceptance=0.8, prior_weight=50.0, probe_every=4)
    cap = BatchKCap(4, 4, config)
    step = 0.1 * padded_rows([0] * 4)  # V at kappa 0: 0.8 s
    for ks in ([0, 0, 0, 0], [2, 2, 2, 2]):
        cap.observe(ks, [1 if k else 0 for k in ks], 10.0 * max(ks), 0.1 * padded_rows(ks))  # 5 s a draft: k 0 wins
    cap.observe([1] * 4, [0] * 4, None, 0.1 * padded_rows([1] * 4), catch_up_s=5 * step)
    caps = [cap.cap(4) for _ in range(320)]
    probes = [i for i, c in enumerate(caps) if c > 0]
    floor = 5 / config.probe_share  # under 4 probe_max (256), the floor's own cap
    assert len(probes) >= 2 and probes[0] >= floor - 1 and all(b - a >= floor for a, b in itertools.pairwise(probes)), probes


def test_nothing_is_capped_before_anything_is_measured() -> None:
    assert BatchKCap(4, 8).cap(8) == UNCAPPED and NoCap().cap(64) == UNCAPPED


class _Cap:
    def __init__(self, value: int) -> None:
        self.value, self.steps = value, 0
        self.draft_s: list[tuple[list[int], float | None]] = []  # (ks, draft phase) per step

    def cap(self, rows: int) -> int:
        return self.value

    def observe(self, ks: list[int], accepted: list[int], draft_s: float | None, verify_s: float,
                catch_up_s: float = 0.0) -> None:
        self.steps += 1
        self.draft_s.append((list(ks), draft_s))
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


def test_a_step_in_which_a_draft_catches_up_gives_no_draft_cost() -> None:
    """A row's first drafts start with the draft's prefill (its first proposal's catch-up), and drafts after k 0 steps
    with the tokens those steps committed: neither is a draft's cost, so such a step gives BatchKCap no d_B sample (one
    such sample, 170 ms a draft on the int4 pair, kept the cap at 0 for a whole run: bench/README.md). Job 1 joins
    after job 0 has drafted: its first step is one; a k 0 row never makes one."""
    t = table(20, 1)
    backend = bigram_backend(t, t + table(20, 2, 1.0), slots=3)
    ks = {0: 2, 1: 3, 2: 0}

    def open_row(job: int, slot: int) -> Row[int]:
        state = DecodeState.start([1 + job, 2], 10, SamplingParams(), Uniforms(SamplingParams(), 8, seed=job),
                                  eos_ids=frozenset(), max_len=64, k_max=8, stats=DecodeStats(k=ks[job]), slot=slot)
        return Row(job, slot, Decoding(state, backend.target(), ModelDrafter(backend.draft), FixedK(ks[job])), None)

    cap = _Cap(UNCAPPED)
    scheduler: Scheduler[int] = Scheduler(SchedulerConfig(max_batch=3), backend.target(), open_row,  # type: ignore[arg-type]
                                          lambda row, outcome: None, SerialVerifier(backend.target(), lambda: 0.0),
                                          batch_policy=cap)
    scheduler.add(0)
    scheduler.add(2)
    for _ in range(3):
        scheduler.step()
    scheduler.add(1)
    while not scheduler.idle:
        scheduler.step()
    first_of_1 = next(i for i, (step_ks, _) in enumerate(cap.draft_s) if len(step_ks) == 3 and step_ks.count(3) == 1)
    assert cap.draft_s[0][0] == [2, 0] and cap.draft_s[0][1] is None      # job 0's first drafts: its prefill
    assert cap.draft_s[first_of_1][1] is None                               # job 1's first drafts
    timed = [i for i, (_, d) in enumerate(cap.draft_s) if d is not None]
    assert timed and set(range(len(cap.draft_s))) - set(timed) == {0, first_of_1}  # every other step is a sample


def test_random_joins_cancellations_and_chunks_keep_every_request_its_own() -> None:
    """A seeded storm on the reference backend: requests arrive between steps, some are cancelled at random steps,
    long prompts are chunked. Every job finishes exactly once; no two rows ever hold a slot; at most max_batch rows;
    every request that was not cancelled gives its lone tokens (greedy and seeded sampling), a cancelled one a prefix."""
    import threading

    from harness import run as run_alone

    t = table(30, 4)
    draft = t + table(30, 5, 1.0)
    backend = bigram_backend(t, draft, slots=3)
    rng = np.random.default_rng(0)
    jobs = []
    for i in range(14):
        params = SamplingParams() if i % 2 else SamplingParams(1.0, top_k=8)
        prompt = rng.integers(0, 30, int(rng.integers(1, 40))).tolist()
        jobs.append((prompt, params, int(rng.integers(0, 5)), threading.Event()))
    expected = [run_alone(bigram_backend(t, draft), p, 16, k, params=params, seed=7)[0].out for p, params, k, _ in jobs]
    finished: dict[int, tuple[str | BaseException, list[int]]] = {}

    def open_row(job: int, slot: int) -> Row[int]:
        prompt, params, k, cancel = jobs[job]
        state = DecodeState.start(prompt, 16, params, Uniforms(params, 8, seed=7), eos_ids=frozenset(), max_len=64,
                                  k_max=8, stats=DecodeStats(k=k), slot=slot)
        return Row(job, slot, Decoding(state, backend.target(), ModelDrafter(backend.draft), FixedK(k)), cancel,
                   own_k=not params.greedy)

    def finish_row(row: Row[int], outcome: str | BaseException) -> None:
        assert row.job not in finished
        finished[row.job] = (outcome, list(row.state.out) if row.state is not None else [])

    scheduler: Scheduler[int] = Scheduler(SchedulerConfig(max_batch=3, prefill_chunk=8), backend.target(),  # type: ignore[arg-type]
                                          open_row, finish_row, SerialVerifier(backend.target(), lambda: 0.0))
    arrivals = sorted(rng.integers(0, 30, len(jobs)).tolist())
    cancel_at = {int(j): int(rng.integers(1, 20)) for j in rng.choice(len(jobs), 4, replace=False)}
    step, most = 0, 0
    while len(finished) < len(jobs):
        for job, at in enumerate(arrivals):
            if at == step:
                scheduler.add(job)
        for job, at in cancel_at.items():
            if at == step - arrivals[job]:
                jobs[job][3].set()
        scheduler.step()
        slots = [r.slot for r in scheduler.rows]
        assert len(slots) == len(set(slots)) <= 3 and set(slots) | set(scheduler.free) == {0, 1, 2}
        most = max(most, len(slots))
        step += 1
        assert step < 500
    assert most == 3 and any(o == "cancelled" and len(t) < 16 for o, t in finished.values())
    assert any(len(p) > 8 for p, *_ in jobs)  # some prompts were chunked
    for job, (outcome, tokens) in finished.items():
        if jobs[job][3].is_set():
            assert outcome in ("cancelled", "length") and tokens == expected[job][: len(tokens)], job
        else:
            assert (outcome, tokens) == ("length", expected[job]), job


def test_a_step_that_captured_a_shape_gives_no_cost_sample() -> None:
    """A step during which the backend's warm-up runs grew (a batched shape captured: its first runs cost several
    replays) counts its acceptance but not its times; the next steady step's times are kept."""
    warmups = [0]
    cap = BatchKCap(4, 4, warmups=lambda: warmups[0])
    warmups[0] += 2                              # the step's verify ran a new shape's first runs
    cap.observe([2, 2], [2, 1], 0.5, 9.0)
    assert cap.cap(2) == UNCAPPED and not cap.per_draft  # nothing timed yet: each row's own k
    cap.observe([2, 2], [2, 2], 0.1, 1.0)        # steady
    assert [list(d) for d in cap.verify if d] == [[1.0]] and list(cap.per_draft) == [0.05]
    assert cap.acceptance.reached[0] > 3  # both steps' rows counted (decayed counts of 4 rows)
