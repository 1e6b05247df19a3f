"""The speculative decoding loop (docs/architecture.md, "The loop"): its numbered steps, nothing else.

Everything a request has is in its DecodeState; the target, the drafter and the k policy are reached
through their interfaces (backend.py, drafter.py, k_policy.py). The loop allocates no array per step:
drafts are written into state.ids in place, the backends bind views of buffers allocated once.

Between steps: state.ids[:length] are committed; the target caches the first length - 1 of them (the last
committed token is fed again with the drafts); the draft model caches some prefix and catches up.

    decode(state, target, drafter, policy)   one request, alone, to its end
    Decoding                                 the same steps one at a time: the scheduler (scheduler.py) steps
                                             several requests in turn, and verifies their drafts together
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from specpack.errors import SpecpackError
from specpack.runtime.backend import TargetModel
from specpack.runtime.drafter import Drafter
from specpack.runtime.k_policy import KPolicy
from specpack.runtime.state import NO_DRAFTS, DecodeState, Proposal, TreeStep, VerifyResult

OnTokens = Callable[[list[int]], None]
Clock = Callable[[], float]  # seconds
FINISH_REASONS = ("eos", "length", "cancelled")


def decode(state: DecodeState, target: TargetModel, drafter: Drafter, policy: KPolicy,
           on_tokens: OnTokens | None = None, cancel: threading.Event | None = None,
           clock: Clock = time.perf_counter) -> str:
    """Generate into state.out (up to state.max_new_tokens, ending at an eos); returns the finish reason.

    `cancel` is checked before each step: once it is set, no further step starts ("cancelled"). An
    exception from on_tokens propagates; the next request resets every cache it uses, so nothing is left
    half done. `clock` times the steps and their draft phase (tests pass a fake one).
    """
    run = Decoding(state, target, drafter, policy, on_tokens, clock)
    if cancel is not None and cancel.is_set():
        return run.finish(cancelled=True)
    run.prefill()
    while not state.finished:
        if cancel is not None and cancel.is_set():
            return run.finish(cancelled=True)
        run.step()
    return run.finish(cancelled=False)


class Decoding:
    """One request's decode as separate steps: prefill, then plan -> draft -> (verify, by the caller) -> commit until
    state.finished, then finish. decode() calls them in that order for one request; the scheduler calls them for
    several requests, verifying their drafts in one call (a batched engine) or in turn.

    Each phase times itself with `clock`, so a request's step costs (what its k policy observes) are its own even
    when other requests' phases run between them."""

    def __init__(self, state: DecodeState, target: TargetModel, drafter: Drafter, policy: KPolicy,
                 on_tokens: OnTokens | None = None, clock: Clock = time.perf_counter) -> None:
        if policy.k_max > state.k_max:
            raise SpecpackError("k policy out of range", expected=f"k_max <= {state.k_max} (the pack's)",
                                found=f"k_max {policy.k_max}")
        self.state, self.target, self.drafter, self.policy = state, target, drafter, policy
        self.on_tokens, self.clock = on_tokens, clock
        self.t0 = self.t_first = clock()
        self.started = False   # the target's cache was reset for this request
        self._k = 0            # the step's k as asked (after the cap)
        self._draft_s = 0.0    # the step's draft phase

    def begin(self) -> None:
        """The request's target cache emptied (once; a chunked prefill fills part of it before `prefill`)."""
        if not self.started:
            self.target.reset(self.state)
            self.started = True

    def prefill(self) -> None:
        """1. Prefill: the target over the prompt (the part not cached yet: a chunked prefill may have run the rest),
        with no drafts, gives the first token; the drafter starts. In two halves for a scheduler that verifies several
        rows' prefills in one run: `prefill_start`, the verify of NO_DRAFTS, `prefill_end`."""
        self.prefill_start()
        self.prefill_end(self.target.verify(self.state, NO_DRAFTS))

    def prefill_start(self) -> None:
        """The prefill's uniforms (its verify of no drafts follows)."""
        self.begin()
        self.state.uniforms.draw(0)

    def prefill_end(self, result: VerifyResult) -> None:
        """The prefill's verify gave the first token: it is emitted, the drafter starts."""
        state = self.state
        self._emit(state.commit(result.n_accepted, result.next_token))
        if self.policy.k_max > 0 and not state.finished:
            self.drafter.begin(state)  # cheap: a draft model's prefill is its first proposal's catch-up
        self.t_first = self.clock()
        state.stats.ttft_s = self.t_first - self.t0

    def plan(self, cap: int | None = None) -> int:
        """2. k from the policy, capped so that the verify never emits past max_new_tokens (and at `cap`: a batch's
        limit, scheduler.py); the step's uniforms."""
        state, policy = self.state, self.policy
        k = policy.next_k(state)
        if not 0 <= k <= policy.k_max:
            raise SpecpackError("k policy out of range", expected=f"0 <= k <= {policy.k_max}", found=f"k {k}")
        self._k = k = min(k, state.remaining - 1, k if cap is None else cap)
        state.uniforms.draw(k)
        return k

    def draft(self, k: int) -> Proposal:
        """3. Draft: up to k tokens written after the committed ones, with their q (None: one-hot)."""
        t = self.clock()
        proposal = self.drafter.propose(self.state, k) if k > 0 else NO_DRAFTS
        self._draft_s = self.clock() - t
        return proposal

    def drafted(self, draft_s: float) -> None:
        """3. Draft, done by the caller for several requests at once (a batched drafter): this request's share of it."""
        self._draft_s = draft_s

    # 4. Verify (the caller, or `step`): the last committed token and the drafts in one target pass; its cache keeps
    #    the accepted part. verify_s: the verify's time as this request's step pays it.

    def step(self) -> Proposal:
        """2-5 alone: plan, draft, this request's own verify, commit (decode's step, and a scheduler's solo row's)."""
        proposal = self.draft(self.plan())
        t = self.clock()
        result = self.target.verify(self.state, proposal)
        self.commit(proposal, result, self.clock() - t)
        return proposal

    def commit(self, proposal: Proposal, result: VerifyResult, verify_s: float) -> None:
        """5. Commit the accepted drafts (already in place) and the next token; the drafter drops the rest."""
        state, t = self.state, self.clock()
        new = state.commit(result.n_accepted, result.next_token)
        if self._k > 0:
            self.drafter.commit(state)
        rest_s = verify_s + self.clock() - t  # the verify and the commit
        state.stats.record_step(proposal.k, result.n_accepted, asked=self._k, draft_s=self._draft_s, verify_s=rest_s)
        tree = None if proposal.parents is None or result.path is None else TreeStep(proposal.parents, result.path)
        self.policy.observe(proposal.k, result.n_accepted, self._draft_s + rest_s, self._draft_s, tree=tree)
        self._emit(new)

    def finish(self, *, cancelled: bool) -> str:
        """The finish reason ("eos" | "length" | "cancelled"), with the decode's time and token count recorded."""
        state = self.state
        state.stats.decode_s = self.clock() - self.t_first
        state.stats.new_tokens = len(state.out)
        if cancelled:
            return "cancelled"
        return "eos" if state.out and state.out[-1] in state.eos_ids else "length"

    def _emit(self, new: list[int]) -> None:
        if self.on_tokens is not None and new:
            self.on_tokens(new)
