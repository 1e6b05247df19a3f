"""How many drafts a row may verify at a batch size: speculation turned down as the batch grows (docs/batching.md).

Each row's own k policy (k_policy.py, adaptive_k.py) picks its k as if it ran alone; the scheduler caps it at
`cap(B)` for a batch of B decoding rows. Two policies:

    NoCap      per-slot verifies (SerialVerifier): a row's step costs what it costs alone, so its own policy is
               already right and nothing is capped
    BatchKCap  one batched verify per step (a batched engine): the cap is the kappa in 0..k_max of the highest expected
               tokens per second over the whole batch,

                   rate(kappa) = B (1 + E[accepted | kappa]) / (kappa d_B + V(B max(2, kappa + 1)))

               E from acceptance pooled over the batch's rows (adaptive_k's AcceptanceModel), d_B the batch's draft
               phase per draft, V(T) the batched verify over T rows in all, as the batched engine runs them: every
               row padded to the widest row's k + 1, and at least 2 (batched_target.py), so a step whose rows verify
               k_b drafts is priced at B max(2, max_b k_b + 1), not at the sum of k_b + 1 (which priced a mixed
               step as if its pads were free, bench/README.md "Load tests"); both running medians of the times the
               scheduler measured, V interpolated between measured T like adaptive_k's V(k) (and at least the prior
               slope outside them). kappa = 0 wins when a batch of single rows already keeps the device busy
               (compute-bound: V grows with T, so verified drafts that are rejected cost as much as emitted tokens).
               Until anything is measured the cap is k_max (each row's own policy). While kappa = 0 wins, every
               `probe_every` steps one step is capped at the best kappa >= 1 instead (the interval doubling while 0
               keeps winning, up to `probe_max`, as adaptive_k's probes), so d_B and the acceptance are measured
               again: a cap of 0 drafts nothing, so nothing else would ever correct an estimate that put it there.
               A probe pays its rows' catch-ups (the draft feeding what the k 0 steps committed, or a row's whole prompt
               at its first drafts; uncaptured runs on a GPU): probes come at least catch-up / (probe_share V(B rows at
               kappa 0)) steps apart (the median catch-up measured so far), as adaptive k's (adaptive_k.py): on an H200
               at 16 clients the probes with their catch-ups cost k auto 23 % of k 0's throughput (bench/README.md).
               A step during which the backend ran a shape's warm-up runs (Backend.warmup_runs grew: a batched CUDA
               graph captured) gives no time sample, as in adaptive k.

Seeded sampling rows are never capped (scheduler.py: their tokens must follow their seed alone).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable
from typing import Protocol

from specpack.runtime.adaptive_k import AcceptanceModel, AdaptiveConfig, _interpolate
from specpack.runtime.batched_target import MIN_WIDTH

UNCAPPED = 1 << 30


def padded_rows(ks: list[int]) -> int:
    """The rows a batched verify of rows verifying ks[b] drafts runs: each padded to the widest, at least MIN_WIDTH."""
    return len(ks) * max(MIN_WIDTH, max(ks) + 1)


class BatchPolicy(Protocol):
    def cap(self, rows: int) -> int:
        """The most drafts a row's step may verify while `rows` rows decode."""
        ...

    def observe(self, ks: list[int], accepted: list[int], draft_s: float | None, verify_s: float,
                catch_up_s: float = 0.0) -> None:
        """A step verified ks[i] drafts of row i, of which accepted[i] passed; its draft phase and verify took these
        (draft_s None: a row's draft caught up in it, its prefill or the tokens of its k 0 steps: not a draft's cost);
        catch_up_s: the part of the draft phase that was catch-ups (what the step paid for drafting after k 0)."""
        ...


class NoCap:
    def cap(self, rows: int) -> int:
        return UNCAPPED

    def observe(self, ks: list[int], accepted: list[int], draft_s: float | None, verify_s: float,
                catch_up_s: float = 0.0) -> None:
        pass


class BatchKCap:
    """The batch's cap from pooled acceptance and the batched step's measured costs (the module docstring)."""

    def __init__(self, k_max: int, max_batch: int, config: AdaptiveConfig | None = None,
                 warmups: Callable[[], int] | None = None) -> None:
        """warmups: the backend's count of warm-up runs so far (Backend.warmup_runs): a step during which it grew ran
        a shape's capture, so its times are not that shape's cost (its acceptance is still counted)."""
        self.k_max, self.config = k_max, config or AdaptiveConfig()
        self.warmups = warmups
        self._warmups_seen = warmups() if warmups is not None else 0
        self.acceptance = AcceptanceModel(k_max, self.config)
        window = self.config.window
        most = padded_rows([k_max] * max_batch)
        self.verify: list[deque[float]] = [deque(maxlen=window) for _ in range(most + 1)]  # [most + 1] V(T) by T
        self.per_draft: deque[float] = deque(maxlen=window)  # d_B samples: the draft phase / the most drafts of a row
        self.catch_ups: deque[float] = deque(maxlen=window)  # the catch-ups' seconds of steps that drafted after k 0
        self._floor = 0                                      # the fewest steps between probes for their catch-ups
        self._tokens = [0.0] * (k_max + 1)                   # [k_max+1] 1 + E[accepted | kappa]
        self._idle = 0                                       # consecutive caps of 0 since the last probe
        self._probe_interval = self.config.probe_every

    def cap(self, rows: int) -> int:
        known = [(t, statistics.median(s)) for t, s in enumerate(self.verify) if s]
        if not known or rows < 1:
            return UNCAPPED
        self.acceptance.expected_accepted(self._tokens)
        d = statistics.median(self.per_draft) if self.per_draft else 0.0
        rates = []
        for kappa in range(self.k_max + 1):
            t = min(padded_rows([kappa] * rows), len(self.verify) - 1)
            time_s = kappa * d + _interpolate(known, t, self.config.verify_slope)
            rates.append(rows * (1.0 + self._tokens[kappa]) / time_s if time_s > 0 else float("inf"))
        best = max(range(len(rates)), key=rates.__getitem__)  # the first of equal rates: the fewest drafts
        if best > 0 or self.k_max == 0:
            self._idle, self._probe_interval = 0, self.config.probe_every
            return best
        self._idle += 1
        if self._idle == 1:  # a run of cap 0 begins: how far apart its probes must be for their catch-ups
            self._floor = self._probe_floor(known, rows)
        if self._idle < max(self._probe_interval, self._floor):
            return 0
        # a probe: the best kappa >= 1, so d_B and the acceptance are measured again (a cap of 0 drafts nothing, so
        # nothing else would ever correct them); the interval doubles while 0 keeps winning, up to probe_max
        self._idle = 0
        self._probe_interval = min(2 * self._probe_interval, self.config.probe_max)
        return max(range(1, len(rates)), key=rates.__getitem__)

    def _probe_floor(self, known: list[tuple[int, float]], rows: int) -> int:
        """catch-up / (probe_share V(rows at kappa 0)), in steps; 0 while no catch-up was timed."""
        if not self.catch_ups:
            return 0
        t = min(padded_rows([0] * rows), len(self.verify) - 1)
        plain = _interpolate(known, t, self.config.verify_slope)
        if plain <= 0:
            return 0
        return min(math.ceil(statistics.median(self.catch_ups) / (self.config.probe_share * plain)),
                   4 * self.config.probe_max)

    def observe(self, ks: list[int], accepted: list[int], draft_s: float | None, verify_s: float,
                catch_up_s: float = 0.0) -> None:
        if not ks:
            return
        for k, n in zip(ks, accepted, strict=True):
            self.acceptance.observe(k, n)
        if self.warmups is not None:
            seen, self._warmups_seen = self._warmups_seen, self.warmups()
            if self._warmups_seen != seen:  # a shape captured during this step (e.g. a batched CUDA graph)
                return
        if catch_up_s > 0:
            self.catch_ups.append(catch_up_s)
        t = min(padded_rows(ks), len(self.verify) - 1)
        self.verify[t].append(verify_s)
        if (most := max(ks)) > 0 and draft_s is not None:
            self.per_draft.append(draft_s / most)  # a batched drafter runs its longest row's steps
