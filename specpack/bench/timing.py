"""c and v(k) (docs/vocabulary.md), timed on the pack's own backend, through the calls the loop makes.

    c    = draft step on 1 token / target step on 1 token
    v(k) = verify over k+1 tokens / target step on 1 token

Both models first prefill `context` tokens (timed once, for the record); each timed call then runs on
top of that cache and is rolled back, so every repetition sees the same context. Repetitions interleave
the calls (a slow moment of a shared machine hits all of them alike) and the medians are kept. Both
caches are emptied at the end.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from specpack.runtime.state import NO_DRAFTS, DecodeState, Proposal
from specpack.runtime.stats import DecodeStats
from specpack.sampling import SamplingParams, Uniforms

if TYPE_CHECKING:
    from specpack.runtime.pack import Pack


@dataclass(frozen=True)
class StepCosts:
    context_tokens: int
    reps: int
    target_step_s: float          # median time of a target step on 1 token (a k = 0 verify)
    draft_step_s: float           # median time of a draft step on 1 token
    verify_s: dict[int, float]    # k -> median time of a verify over k+1 tokens
    target_prefill_s: float = 0.0  # one prefill of `context_tokens` (timed once, after the warm-up)
    draft_prefill_s: float = 0.0

    @property
    def c(self) -> float:
        return self.draft_step_s / self.target_step_s

    def v(self, k: int) -> float:
        return self.verify_s[k] / self.target_step_s

    def predicted_speedup(self, tau: float, k: int) -> float:
        """tau / (k*c + v(k)): the speedup of a runtime with no overhead of its own, at this acceptance."""
        return tau / (k * self.c + self.v(k))

    def to_dict(self) -> dict[str, Any]:
        return {"context_tokens": self.context_tokens, "reps": self.reps, "c": self.c,
                "v": {str(k): self.v(k) for k in sorted(self.verify_s)},
                "target_step_ms": 1e3 * self.target_step_s, "draft_step_ms": 1e3 * self.draft_step_s,
                "verify_ms": {str(k): 1e3 * s for k, s in sorted(self.verify_s.items())},
                "target_prefill_ms": 1e3 * self.target_prefill_s, "draft_prefill_ms": 1e3 * self.draft_prefill_s}


def measure_step_costs(pack: Pack, ks: Sequence[int], context: int, filler: Sequence[int],
                       reps: int = 15, warmup: int = 3, with_draft: bool = True) -> StepCosts:
    """Time one draft step, one target step and one verify per k after `context` tokens of `filler`.
    `with_draft` False (the n-gram drafter, or a pack without a draft model): no draft step is timed (c = 0),
    and the verifies take the filler's tokens as drafts, with no q.

    Runs on the pack's own backend (holding the pack's lock), greedy, through the same calls the loop makes. A draft
    head's timed step is a drafted row (W = 1: what each draft after the first costs; runtime/engine.py head_rows).
    """
    m = pack.manifest
    params = SamplingParams()  # greedy: the uniforms are not read
    tokens = np.resize(np.asarray(filler, np.int64), context + max(ks) + 1)  # [context + k_max_swept + 1]
    state = DecodeState.start(tokens.tolist(), 1, params, Uniforms(params, m.k_max), eos_ids=frozenset(),
                              max_len=m.max_len, k_max=m.k_max, stats=DecodeStats(k=0))
    times: dict[str, list[float]] = {"target": [], "draft": [], **{f"v{k}": [] for k in ks}}
    prefill: dict[str, list[float]] = {"target": [], "draft": []}
    head = m.head is not None
    draft_end = context + 2 if head else context + 1  # the draft step timed: its cache ends at `context` before it
    with pack.exclusive() as backend:
        target, draft = backend.target(), backend.draft() if with_draft else None
        try:
            target.reset(state)
            state.length = context
            _timed(prefill["target"], True, partial(target.verify, state, NO_DRAFTS))
            if draft is not None:
                draft.reset(state)
                _timed(prefill["draft"], True, partial(draft.step, state, context, 0))
            state.length = context + 1  # one committed token past the cached context
            if draft is not None and head:  # the head catches up on the prefill's last feature row (cache: context)
                draft.step(state, context + 1, 0)
            for rep in range(warmup + reps):
                keep = rep >= warmup
                target.rollback(state, context)
                _timed(times["target"], keep, partial(target.verify, state, NO_DRAFTS))
                if draft is not None:
                    _timed(times["draft"], keep, partial(draft.step, state, draft_end, 0))
                    draft.rollback(state, context)
                for k in ks:  # q: row 0 as the draft step wrote it, the other rows as they are (greedy ignores q)
                    q = draft.q(state, k) if draft is not None else None
                    proposal = Proposal(tokens=state.ids[context + 1 : context + 1 + k], q=q)
                    target.rollback(state, context)
                    _timed(times[f"v{k}"], keep, partial(target.verify, state, proposal))
        finally:
            target.reset(state)
            if draft is not None:
                draft.reset(state)
    med = {name: statistics.median(ts) if ts else 0.0 for name, ts in times.items()}
    return StepCosts(context_tokens=context, reps=reps, target_step_s=med["target"], draft_step_s=med["draft"],
                     verify_s={k: med[f"v{k}"] for k in ks}, target_prefill_s=prefill["target"][0],
                     draft_prefill_s=prefill["draft"][0] if prefill["draft"] else 0.0)


def _timed(into: list[float], keep: bool, fn: Callable[[], object]) -> None:
    t0 = time.perf_counter()
    fn()
    if keep:
        into.append(time.perf_counter() - t0)


def quantile(values: list[float], q: float) -> float | None:
    """The q-quantile, linear between order statistics (None for no values)."""
    if not values:
        return None
    xs = sorted(values)
    at = q * (len(xs) - 1)
    lo = int(at)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (at - lo)
