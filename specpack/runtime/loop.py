"""The speculative decoding loop (docs/architecture.md, "The loop"): its numbered steps, nothing else.

Everything a request has is in its DecodeState; the target, the drafter and the k policy are reached
through their interfaces (backend.py, drafter.py, k_policy.py). The loop allocates no array per step:
drafts are written into state.ids in place, the backends bind views of buffers allocated once.

Between steps: state.ids[:length] are committed; the target caches the first length - 1 of them (the last
committed token is fed again with the drafts); the draft model caches some prefix and catches up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from specpack.errors import SpecpackError
from specpack.runtime.backend import TargetModel
from specpack.runtime.drafter import Drafter
from specpack.runtime.k_policy import KPolicy
from specpack.runtime.state import NO_DRAFTS, DecodeState, TreeStep

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
    stats = state.stats
    if policy.k_max > state.k_max:
        raise SpecpackError("k policy out of range", expected=f"k_max <= {state.k_max} (the pack's)",
                            found=f"k_max {policy.k_max}")
    t0 = clock()
    if cancel is not None and cancel.is_set():
        return _finish(state, t0, t0, cancelled=True)

    # 1. Prefill: the target over the prompt, with no drafts, gives the first token; the drafter starts.
    target.reset(state)
    state.uniforms.draw(0)
    result = target.verify(state, NO_DRAFTS)
    _emit(state.commit(result.n_accepted, result.next_token), on_tokens)
    if policy.k_max > 0 and not state.finished:
        drafter.begin(state)  # the draft's prefill belongs to the first token's time too
    t_first = clock()
    stats.ttft_s = t_first - t0

    while not state.finished:
        if cancel is not None and cancel.is_set():
            return _finish(state, t_first, clock(), cancelled=True)
        t_step = clock()
        # 2. k from the policy, capped so that the verify never emits past max_new_tokens; the step's uniforms.
        k = policy.next_k(state)
        if not 0 <= k <= policy.k_max:
            raise SpecpackError("k policy out of range", expected=f"0 <= k <= {policy.k_max}", found=f"k {k}")
        k = min(k, state.remaining - 1)
        state.uniforms.draw(k)
        # 3. Draft: up to k tokens written after the committed ones, with their q (None: one-hot).
        proposal = drafter.propose(state, k) if k > 0 else NO_DRAFTS
        t_drafted = clock()
        # 4. Verify the last committed token and the drafts in one target pass; its cache keeps the accepted part.
        result = target.verify(state, proposal)
        # 5. Commit the accepted drafts (already in place) and the next token; the drafter drops the rest.
        new = state.commit(result.n_accepted, result.next_token)
        if k > 0:
            drafter.commit(state)
        t_done = clock()
        stats.record_step(proposal.k, result.n_accepted, asked=k, draft_s=t_drafted - t_step,
                          verify_s=t_done - t_drafted)
        tree = None if proposal.parents is None or result.path is None else TreeStep(proposal.parents, result.path)
        policy.observe(proposal.k, result.n_accepted, t_done - t_step, t_drafted - t_step, tree=tree)
        _emit(new, on_tokens)
    return _finish(state, t_first, clock(), cancelled=False)


def _emit(new: list[int], on_tokens: OnTokens | None) -> None:
    if on_tokens is not None and new:
        on_tokens(new)


def _finish(state: DecodeState, t_first: float, t_end: float, *, cancelled: bool) -> str:
    state.stats.decode_s = t_end - t_first
    state.stats.new_tokens = len(state.out)
    if cancelled:
        return "cancelled"
    return "eos" if state.out and state.out[-1] in state.eos_ids else "length"
