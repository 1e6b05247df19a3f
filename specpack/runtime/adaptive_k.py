"""Adaptive k (`k="auto"`): each step's draft count chosen from the acceptance seen so far and the step costs
measured on the machine it runs on (docs/architecture.md, "k policy").

For every k in 0..k_max the policy estimates the tokens a step emits and the time it takes, and takes the k
of the highest rate (the smaller k on a tie):

    rate(k) = (1 + E[accepted | k]) / (k d + V(k))
    E[accepted | k] = sum_{j=1..k} prod_{i<j} h_i     h_i = P(draft i+1 accepted | drafts 1..i accepted)
    d     the draft phase per draft (the model drafter: c target steps; the n-gram drafter: microseconds)
    V(k)  the rest of a step that verified k drafts (the verify over k+1 tokens and the commit); V(0) is a
          plain target step, so k = 0 wins exactly when speculation would be slower than decoding alone

Acceptance (AcceptanceModel): decayed counts per draft position, `reached` and `passed` (a step that verified
k drafts and accepted n reached positions 0..min(n, k-1) and passed 0..n-1), shrunk toward the pooled rate of
all positions, itself shrunk toward a prior:
    h_pool = (sum passed + w p0) / (sum reached + w),    h_i = (passed_i + w h_{i-1}) / (reached_i + w),  h_{-1} = h_pool
or, once the pack's requests have verified enough drafts (PackAcceptance, kept by Pack.policy per drafter, not for
seeded sampling), toward the pack's pooled rate at the same position, worth `pack_weight` steps:
    h_i = (passed_i + W H_i) / (reached_i + W)
Every count decays by `decay` per step: old text weighs less, and positions no longer reached drift back to
the pooled rate (which is how longer drafts get tried when acceptance is high). A run of k = 0 steps ages
the counts by at most `idle_memory` steps, so a policy that stopped drafting does not forget why and drift
back to the prior to pay for it again; the probes below re-measure instead. Conditional rates rather than
DecodeStats.per_position's survival: a step stopped at its first rejection says nothing of the positions
after it.

Costs (MeasuredCosts): the median of the last `window` times per k, and per draft. A k never measured is
interpolated linearly between measured ks and extrapolated with the nearest segment's slope, but never a
flatter one than the prior relative slope (`verify_slope`: timings flat within noise must not make an unmeasured
k look free), nor, above the measured ks, than the slope over the whole measured range (with int4 weights on a
2-core CPU each row costs more than the last, v(4) = 1.9; one noisy flat segment made k 7-8 look cheap to prompt
lookup there); while a single k is measured, with the prior relative slope. Where the backend pads a greedy single
step to two rows (`padded_k0`, runtime/target.py: the rows a k = 1 verify runs), an unmeasured V(0) is V(1): the slope
of k 1..4 below them made k = 0 look about 40 % cheaper on a 2-core CPU, where 3 rows cost 1.4x two, and a fresh
pack's first request stopped drafting for 7 steps (bench/README.md, "A fresh pack's first request"). A request starts
at `first_k`; k = 0 is measured as soon as it looks best, or as a neighbour of k = 1.
PriorCosts replaces the measurements by fixed relative costs where the k schedule must not depend on the
clock (seeded sampling: the same seed gives the same tokens). Given the timings, everything is
deterministic: tests feed a fake clock.

A step during which the backend ran a captured shape for one of its first runs (Backend.warmup_runs: ONNX Runtime
runs a new CUDA graph shape plainly, then captures it) gives no sample at all: those runs cost several steps once,
and a k whose only samples hold one looks slow until it is tried again, which it then never is (Run F on an H100:
adaptive k locked at k = 0 on 15 of 26 Spec-Bench requests of a freshly loaded pack; bench/README.md, "Run F").
A step right after a k = 0 step, and a request's first step, give no per-draft sample (their V(k) samples are
kept), and ks are compared only once a draft was timed: the model drafter first catches up on the tokens committed
without it, a head drafter's first proposal reads the whole prompt's features, and neither is a draft's cost. On a
GPU such a catch-up runs outside the captured graphs, several target steps: counted as d, it kept k at 0
(bench/README.md, "Drafters on the GPU"; for the head's first catch-up, "Run E", where the probes, all after k = 0
steps, never corrected d).

Exploration: while k = 0 wins, every `probe_every` steps one step runs at the best k >= 1 (the interval
doubles each time k = 0 wins again, up to `probe_max`, and resets once a k >= 1 wins); while drafting, every
`neighbor_every`-th step runs at a neighbour of the best k, alternately above and below, so the costs and the
acceptance around it stay measured. A probe pays its drafter's catch-up (the model drafter feeding the tokens its k = 0
steps committed), measured as the probe's draft phase less its drafts, with the tokens it caught up on (kept across
requests). Its fixed part F (MeasuredCosts.probe_cost: a least-squares line over (tokens, seconds), F its intercept;
the median catch-up while one length was seen) is what spacing the probes saves: they come at least F / (`probe_share`
V(0)) steps apart, so F takes at most that share of the decode time. On an H200 an uncaptured catch-up cost about 3.5
target steps whatever its length, and the probes at 8, 16, 32, 64 steps of every 128-token request took 12 % of the
time where k = 0 won (one client through the scheduler ran at 0.84x its k 0; bench/README.md, "Again, 2026-12-07"); a
catch-up that grows with the tokens (the CPU's, captured chunks) has F near 0 and keeps the schedule above, since its
share does not fall with the spacing. The floor is at most 4 `probe_max`. A probe is two drafting steps: the
first pays the catch-up (no d sample), the second times a draft, so the probes can correct a d measured too high; with
one step they never did (one client through the scheduler on an H100 kept d at 12.3 ms, the draft's 2.2 ms alone, from
its warm-up, and k at 0 for good; bench/README.md, "An H100, 2026-12-07").
"""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from specpack.runtime.state import DecodeState, TreeStep


@dataclass(frozen=True)
class AdaptiveConfig:
    prior_acceptance: float = 0.7   # p0: acceptance per draft before any was verified
    prior_weight: float = 1.0       # w: pseudo-steps of the prior (in the pooled rate) and of the pooled rate (per position)
    decay: float = 0.95             # per step, on every acceptance count (~20 steps of memory)
    idle_memory: int = 16           # a run of k = 0 steps ages the counts by at most this many steps
    window: int = 5                 # times per k kept for the running median
    verify_slope: float = 0.04      # V(k) / V(0) = 1 + slope k, while a single k is measured (v(8) = 1.35 on the CPU)
    first_k: int = 4                # a request's first step (capped at k_max), before anything is measured
    min_drafting: int = 1           # steps that verified drafts before k = 0 may win (the probes revisit it: 4 lost
                                    # 5-10 % on short answers; bench/README.md, "Adaptive k replayed")
    probe_every: int = 8            # k = 0 steps before a probe at the best k >= 1
    probe_max: int = 64             # the longest interval between probes (unless a probe's catch-up makes it longer)
    probe_share: float = 0.05       # probes' catch-ups take at most this share of the steps' time while k = 0 wins
    neighbor_every: int = 16        # every this many drafting steps, one at a neighbour of the best k
    pack_weight: float = 4.0        # pseudo-steps of the pack's pooled rates in a request's (PackAcceptance)
    pack_decay: float = 0.995       # per step, on the pack's pooled counts (~200 steps of memory, over requests)
    padded_k0: bool = False         # a k = 0 step verifies k = 1's rows (the backend pads a greedy single step: until
                                    # V(0) is measured it is V(1); MeasuredCosts; a sampled k = 0 step, one row, is
                                    # then priced a little high until measured)


class AcceptanceModel:
    """Decayed per-position counts -> E[accepted | k] for every k (see the module docstring); with `pack`, a request's
    rates are shrunk toward the pack's pooled ones instead (PackAcceptance), and its observations go there too."""

    def __init__(self, k_max: int, config: AdaptiveConfig, pack: PackAcceptance | None = None,
                 decay: float | None = None) -> None:
        self.config = config
        self.pack = pack
        self.decay = config.decay if decay is None else decay
        self.reached = [0.0] * k_max  # [k_max] decayed steps that verified draft i with drafts 0..i-1 accepted
        self.passed = [0.0] * k_max   # [k_max] ... of which draft i was accepted too
        self._age = 0                 # steps since the counts last decayed
        self._pack_rates = [0.0] * k_max  # [k_max] the pack's h_i, read per estimate
        self._rates = [0.0] * k_max       # [k_max] this request's h_i, per estimate

    def observe(self, k: int, n_accepted: int) -> None:
        if self.pack is not None:
            self.pack.observe(k, n_accepted)
        self._age += 1
        if k == 0:  # nothing verified: the counts age once the next drafts are verified, and by idle_memory at most
            return
        decay, self._age = self.decay ** min(self._age, self.config.idle_memory), 0
        for i in range(len(self.reached)):
            self.reached[i] *= decay
            self.passed[i] *= decay
        for i in range(min(n_accepted + 1, k)):
            self.reached[i] += 1.0
            self.passed[i] += i < n_accepted

    def rates(self, out: list[float]) -> None:
        """out[i] = h_i, the estimated P(draft i + 1 accepted | drafts 1..i accepted), for i in 0..k_max - 1."""
        if self.pack is not None and self.pack.informed():
            self.pack.rates(self._pack_rates)
            w = self.config.pack_weight
            for i in range(len(self.reached)):  # shrunk toward the pack's rate at the same position
                out[i] = (self.passed[i] + w * self._pack_rates[i]) / (self.reached[i] + w)
            return
        w = self.config.prior_weight
        h = (sum(self.passed) + w * self.config.prior_acceptance) / (sum(self.reached) + w)  # pooled
        for i in range(len(self.reached)):
            h = out[i] = (self.passed[i] + w * h) / (self.reached[i] + w)  # h_i, shrunk toward h_{i-1}

    def expected_accepted(self, out: list[float]) -> None:
        """out[k] = E[accepted | k] for k in 0..k_max (out has k_max + 1 entries)."""
        self.rates(self._rates)
        survive, total = 1.0, 0.0
        out[0] = 0.0
        for i, rate in enumerate(self._rates):
            survive *= rate
            total += survive
            out[i + 1] = total


class PackAcceptance:
    """A pack's acceptance for one drafter, pooled over its requests with a long memory (`pack_decay` per step): the
    prior each new request's AcceptanceModel is shrunk toward (`pack_weight` pseudo-steps per position), in place of
    the flat `prior_acceptance` worth `prior_weight` steps. A request then starts from what this drafter has shown
    on this pack, and a few rejected first drafts no longer put its estimate under the break-even of k = 1 (Run G on an
    H100: adaptive k at k 0 or 1 on 58 % of Spec-Bench steps where k 2 paid; bench/README.md, "Run G"). Until the
    pack has verified `pack_weight` drafts, requests use the flat prior. Not used for sampling with a seed (the tokens
    would then depend on earlier requests: Pack.policy)."""

    def __init__(self, k_max: int, config: AdaptiveConfig) -> None:
        self.model = AcceptanceModel(k_max, config, decay=config.pack_decay)
        self.weight = config.pack_weight

    def observe(self, k: int, n_accepted: int) -> None:
        self.model.observe(k, n_accepted)

    def informed(self) -> bool:
        return self.model.reached[0] >= self.weight if self.model.reached else False

    def rates(self, out: list[float]) -> None:
        self.model.rates(out)


class Acceptance(Protocol):
    def observe(self, k: int, n_accepted: int) -> None: ...

    def expected_accepted(self, out: list[float]) -> None:
        """out[k] = E[accepted | k] for k in 0..k_max."""
        ...


class Costs(Protocol):
    def start(self) -> None:
        """A new request begins."""
        ...

    def measured(self, k: int) -> bool: ...

    def any_measured(self) -> bool: ...

    def observe(self, k: int, elapsed_s: float, draft_s: float, per_draft: bool = True, skipped: int = 0) -> None:
        """A step of k drafts took elapsed_s, draft_s of it drafting; per_draft False: draft_s is not k drafts'
        cost (a catch-up was in it), keep only the rest; skipped > 0: the step drafted right after that many k = 0
        steps (what its draft phase holds beyond k drafts is a probe's catch-up over their tokens)."""
        ...

    def probe_cost(self) -> float:
        """The fixed part of a probe's catch-up (what does not grow with the tokens skipped), in step_times' unit (0
        while unknown)."""
        ...

    def step_times(self, out: list[float]) -> None:
        """out[k] = k d + V(k) for k in 0..k_max, in any one unit (only ratios matter)."""
        ...


LENGTHS = 8  # the catch-up lengths MeasuredCosts keeps (the fit of a probe's fixed cost)


class MeasuredCosts:
    """Running medians of this machine's step times (seconds), kept across the requests of one pack and drafter.

    A request's own samples are kept apart from the earlier requests' medians (`start`): the earlier costs give
    the shape (V(k) for every k tried so far, d), scaled to this request by its own measurements (a longer
    context makes every step slower alike), so a new request starts informed and never mixes two context
    lengths in one comparison.
    """

    def __init__(self, k_max: int, window: int, verify_slope: float, warmups: Callable[[], int] | None = None,
                 padded_k0: bool = False) -> None:
        """warmups: the backend's count of warm-up runs so far (Backend.warmup_runs); a step during which it grew
        gives no sample. padded_k0: a k = 0 step runs as two rows, k = 1's (runtime/target.py pads a greedy single
        step), so while V(0) is not measured it is V(1), not an extrapolation below the measured ks (module
        docstring)."""
        self.window, self.verify_slope = window, verify_slope  # the slope is used while a single k is known
        self.padded_k0 = padded_k0
        self.warmups = warmups
        self._warmups_seen = warmups() if warmups is not None else 0
        self.rest: list[deque[float]] = [deque(maxlen=window) for _ in range(k_max + 1)]  # [k_max+1] V(k) samples
        self.per_draft: deque[float] = deque(maxlen=window)                               # d samples
        self.earlier: list[float | None] = [None] * (k_max + 1)  # [k_max+1] V(k) medians of earlier requests
        self.earlier_draft: float | None = None
        # probes' catch-ups (s) by the tokens they fed, the LENGTHS most recent lengths, kept across requests: probes at
        # probe_max apart all feed one length, which alone could not tell a fixed cost from one per token
        self.catch_ups: OrderedDict[int, deque[float]] = OrderedDict()

    def start(self) -> None:
        """A new request: the costs known so far (this request's, and the earlier ones scaled to its level)
        become the earlier costs."""
        points, d = self._known()
        for k, v in points:
            self.earlier[k] = v
        self.earlier_draft = d if self.per_draft or self.earlier_draft is not None else None
        for samples in self.rest:
            samples.clear()
        self.per_draft.clear()

    def measured(self, k: int) -> bool:
        return bool(self.rest[k]) or self.earlier[k] is not None

    def any_measured(self) -> bool:
        """Whether ks can be compared: some V(k) and the per-draft cost d measured (now or in earlier requests)."""
        drafts_timed = bool(self.per_draft) or self.earlier_draft is not None
        return drafts_timed and any(self.measured(k) for k in range(len(self.rest)))

    def observe(self, k: int, elapsed_s: float, draft_s: float, per_draft: bool = True, skipped: int = 0) -> None:
        if self.warmups is not None:  # a shape captured during this step: its time is not the shape's cost
            seen, self._warmups_seen = self._warmups_seen, self.warmups()
            if self._warmups_seen != seen:
                return
        self.rest[k].append(max(elapsed_s - draft_s, 0.0))
        if k > 0 and per_draft:
            self.per_draft.append(draft_s / k)
        if k > 0 and skipped > 0 and self.any_measured():
            samples = self.catch_ups.pop(skipped, None) or deque(maxlen=self.window)
            samples.append(max(draft_s - k * self._known()[1], 0.0))
            self.catch_ups[skipped] = samples  # the most recent length last
            while len(self.catch_ups) > LENGTHS:
                self.catch_ups.popitem(last=False)

    def probe_cost(self) -> float:
        if not self.catch_ups:
            return 0.0
        tokens = [float(m) for m in self.catch_ups]
        seconds = [statistics.median(samples) for samples in self.catch_ups.values()]
        if len(tokens) < 2:  # one length seen: all of it may be fixed
            return seconds[0]
        mean_m, mean_c = statistics.fmean(tokens), statistics.fmean(seconds)
        slope = sum((m - mean_m) * (c - mean_c) for m, c in zip(tokens, seconds, strict=True)) / sum(
            (m - mean_m) ** 2 for m in tokens)
        return max(mean_c - max(slope, 0.0) * mean_m, 0.0)  # the line's intercept: F

    def step_times(self, out: list[float]) -> None:
        known, d = self._known()
        for k in range(len(out)):
            out[k] = k * d + _interpolate(known, k, self.verify_slope)
        if self.padded_k0 and len(out) > 1 and known and known[0][0] > 0:  # V(0) unmeasured: the rows of V(1)
            out[0] = out[1] - d

    def _known(self) -> tuple[list[tuple[int, float]], float]:
        """(k, V(k)) for every k measured, sorted, and d: this request's medians, and where it has none, the
        earlier costs scaled by this request's level over theirs (the median ratio at the ks measured now)."""
        now = [(k, statistics.median(samples)) for k, samples in enumerate(self.rest) if samples]
        before = [(k, v) for k, v in enumerate(self.earlier) if v is not None]
        scale = 1.0
        if now and before:
            scale = statistics.median(v / _interpolate(before, k, self.verify_slope) for k, v in now)
        points = dict(now)
        for k, v in before:
            points.setdefault(k, v * scale)
        d = statistics.median(self.per_draft) if self.per_draft else (self.earlier_draft or 0.0) * scale
        return sorted(points.items()), d


class PriorCosts:
    """Fixed costs in target steps: d = c, V(k) = 1 + slope k. No clock: the k schedule follows acceptance alone."""

    def __init__(self, c: float, verify_slope: float = 0.04) -> None:
        self.c, self.verify_slope = c, verify_slope

    def start(self) -> None:
        pass

    def measured(self, k: int) -> bool:
        return True

    def any_measured(self) -> bool:
        return True

    def observe(self, k: int, elapsed_s: float, draft_s: float, per_draft: bool = True, skipped: int = 0) -> None:
        pass

    def probe_cost(self) -> float:
        return 0.0

    def step_times(self, out: list[float]) -> None:
        for k in range(len(out)):
            out[k] = k * self.c + 1.0 + self.verify_slope * k


def _interpolate(known: list[tuple[int, float]], k: int, slope: float) -> float:
    """V(k) from the measured (k, V) pairs, sorted by k: linear between them, and beyond them with the slope of
    the nearest segment, at least `slope` relative to the edge's V and, above them, at least the slope over the whole
    measured range (below the smallest measured k no lower than a quarter of its V). With a single measured k,
    `slope` (relative: V(k) / V(0) = 1 + slope k) scales it."""
    if len(known) == 1:
        (k0, v0), = known
        return v0 * (1.0 + slope * k) / (1.0 + slope * k0)
    lo = max((p for p in known if p[0] <= k), default=None)
    hi = min((p for p in known if p[0] >= k), default=None)
    if lo is not None and hi is not None:
        return lo[1] if hi[0] == lo[0] else lo[1] + (hi[1] - lo[1]) * (k - lo[0]) / (hi[0] - lo[0])
    (ka, va), (kb, vb) = known[:2] if lo is None else known[-2:]
    edge_k, edge_v = (ka, va) if lo is None else (kb, vb)
    # at least the prior relative slope: timings flat within noise must not make a k outside the measured range
    # look free (drafts that are all rejected would then never let k = 0 be tried)
    rise = max(max(vb - va, 0.0) / (kb - ka), edge_v * slope / (1.0 + slope * edge_k))
    if lo is None:
        return max(va - rise * (ka - k), 0.25 * va)
    # above: at least the slope over the whole measured range, so that one segment flat within noise does not make
    # longer drafts look cheap where each row costs more than the last (int4 on a 2-core CPU: v(4) = 1.9)
    (k_first, v_first) = known[0]
    rise = max(rise, max(vb - v_first, 0.0) / (kb - k_first))
    return vb + rise * (k - kb)


def highest_rate(accepted: list[float], times: list[float], low: int, high: int) -> tuple[int, float]:
    """(k, rate) of the highest rate (1 + accepted[k]) / times[k] over k in low..high, the smaller k on a tie."""
    best, best_rate = low, -1.0
    for k in range(low, high + 1):
        rate = (1.0 + accepted[k]) / times[k] if times[k] > 0 else float("inf")
        if rate > best_rate:
            best, best_rate = k, rate
    return best, best_rate


class AdaptiveK:
    """The KPolicy of `k="auto"`: the k of the highest expected tokens per unit time, within 0..k_max."""

    def __init__(self, k_max: int, config: AdaptiveConfig | None = None, costs: Costs | None = None,
                 acceptance: Acceptance | None = None, warmups: Callable[[], int] | None = None) -> None:
        """`costs`: the pack's cost model for this drafter (kept across requests), or None: a fresh one (`warmups`: the
        backend's warm-up run count, MeasuredCosts). `acceptance`: E[accepted | k] from what was verified (None:
        AcceptanceModel, a chain's; tree_policy.py: a tree's)."""
        self.config = config or AdaptiveConfig()
        self._k_max = k_max
        self.acceptance: Acceptance = acceptance or AcceptanceModel(k_max, self.config)
        self.costs: Costs = costs if costs is not None else MeasuredCosts(
            k_max, self.config.window, self.config.verify_slope, warmups, self.config.padded_k0)
        self.costs.start()
        self._tokens = [0.0] * (k_max + 1)  # [k_max+1] 1 + E[accepted | k]
        self._times = [0.0] * (k_max + 1)   # [k_max+1] k d + V(k)
        self._idle = 0                      # consecutive steps at k = 0 by choice
        self._probe_interval = self.config.probe_every  # k = 0 steps before the next probe (at least _probe_floor)
        self._probe_floor = 0               # the steps whose time a probe's catch-up may take a probe_share of
        self._started = False               # a step was observed (the first one's catch-up is the prompt's)
        self._plain = 0                     # k = 0 steps since the last drafting step (the tokens a catch-up feeds)
        self._drafting = 0                  # steps at a k >= 1 by choice
        self._verified = 0                  # steps that verified drafts
        self._above = True                  # the next neighbour explored is best + 1
        # the next drafts start with a catch-up: after a k = 0 step, and at a request's first step (a head drafter
        # reads the whole prompt's features then: one uncaptured run, several target steps on a GPU)
        self._after_idle = True
        self._probing = False               # the last step was a probe's first (its catch-up): the next one times a draft

    @property
    def k_max(self) -> int:
        return self._k_max

    def next_k(self, state: DecodeState) -> int:
        if self._k_max == 0:
            return 0
        if not self.costs.any_measured():
            return min(self.config.first_k, self._k_max)
        if self._probing:
            self._probing = False
            if not self._after_idle:  # the probe drafted: one more step at k >= 1, whose draft phase is drafts alone
                return self.best(1)
        interval = max(self._probe_interval, self._probe_floor)
        if 0 < self._idle < interval - 1:
            # a run of k = 0 until the next probe: a plain step changes no acceptance count and only re-times
            # V(0), so the choice is not re-evaluated (about 65 us of Python per step, 3 % of a GPU step)
            self._idle += 1
            return 0
        # k = 0 may win once min_drafting steps verified drafts
        best = self.best(0 if self._verified >= self.config.min_drafting else 1)
        if best == 0:
            self._idle += 1
            if self._idle == 1:  # a run of k = 0 begins: how far apart its probes must be for their catch-ups
                self._probe_floor = self._floor()
            if self._idle < max(self._probe_interval, self._probe_floor):
                return 0
            self._idle, self._probing = 0, True
            self._probe_interval = min(2 * self._probe_interval, self.config.probe_max)
            return self.best(1)
        self._idle, self._probe_interval = 0, self.config.probe_every
        self._drafting += 1
        if self._drafting % self.config.neighbor_every == 0:
            return self._neighbor(best)
        return best

    def observe(self, k: int, n_accepted: int, elapsed_s: float, draft_s: float, *,
                tree: TreeStep | None = None) -> None:
        """A chain's k and n (a tree, `tree`, counts as the chain it accepted: TreePolicy reads the tree)."""
        self.acceptance.observe(k, n_accepted)
        self._observe_costs(k, elapsed_s, draft_s)

    def _observe_costs(self, k: int, elapsed_s: float, draft_s: float) -> None:
        self._verified += k > 0
        self.costs.observe(k, elapsed_s, draft_s, per_draft=not self._after_idle,
                           skipped=self._plain if self._after_idle and self._started and k > 0 else 0)
        self._plain = self._plain + 1 if k == 0 else 0
        self._after_idle, self._started = k == 0, True

    def _floor(self) -> int:
        """The fewest k = 0 steps between probes for their catch-ups' fixed part to take at most probe_share of the
        time."""
        self.costs.step_times(self._times)
        catch_up, plain = self.costs.probe_cost(), self._times[0]
        if catch_up <= 0 or plain <= 0:
            return 0
        return min(math.ceil(catch_up / (self.config.probe_share * plain)), 4 * self.config.probe_max)

    def best(self, low: int = 0) -> int:
        """The k in low..k_max of the highest estimated rate (the smaller on a tie)."""
        self.acceptance.expected_accepted(self._tokens)
        self.costs.step_times(self._times)
        return highest_rate(self._tokens, self._times, low, self._k_max)[0]

    def _neighbor(self, best: int) -> int:
        up, down = best < self._k_max, best > 0
        go_up = up and (self._above or not down)
        self._above = not self._above
        return best + 1 if go_up else best - 1 if down else best
