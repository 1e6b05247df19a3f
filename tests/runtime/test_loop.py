"""The decode loop on the reference backend (bigram tables, no graphs): greedy equality, caps, eos, stats,
rollback and catch-up, k per step from a policy, deterministic proposals, cancel and exceptions."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
from harness import LookupDrafter, ScriptedK, bigram_backend, greedy_reference, run, table

from specpack.errors import SpecpackError
from specpack.runtime.backends.reference import ReferenceBackend, bigram_logits
from specpack.runtime.state import DecodeState
from specpack.sampling import SamplingParams

V = 24


def _table(seed: int, sharp: float = 3.0) -> np.ndarray:
    return table(V, seed, sharp)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("draft_seed", [0, 1, 2])  # 0: the draft is the target
def test_greedy_equals_target_alone(k: int, draft_seed: int) -> None:
    target_table = _table(0)
    draft_table = target_table if draft_seed == 0 else target_table + _table(draft_seed, 2.0)
    backend = bigram_backend(target_table, draft_table)
    for prompt_len in (1, 5, 37):
        prompt = np.random.default_rng(prompt_len).integers(0, V, prompt_len).tolist()
        for max_new in (1, 2, 17, 60):
            state, finish = run(backend, prompt, max_new, k)
            stats = state.stats
            assert state.out == greedy_reference(target_table, prompt, max_new, frozenset())
            assert finish == "length" and stats.new_tokens == len(state.out) == max_new
            assert stats.proposed == sum(stats.proposed_at) and stats.accepted == sum(stats.accepted_at)
            assert stats.accepted <= stats.proposed <= k * stats.steps
            # k is capped at the tokens still allowed, so nothing proposed is thrown away unverified
            assert 1 + stats.steps + stats.accepted == max_new
            if draft_seed == 0:
                assert stats.alpha == (1.0 if stats.proposed else 0.0)


def test_stops_at_eos_and_includes_it() -> None:
    t = _table(3)
    free = greedy_reference(t, [5], 40, frozenset())
    eos = frozenset({free[10]})
    state, finish = run(bigram_backend(t, t + _table(9, 1.0)), [5], 40, 4, eos=eos)
    assert state.out == greedy_reference(t, [5], 40, eos)
    assert state.out[-1] in eos and all(token not in eos for token in state.out[:-1])
    assert finish == "eos"


def test_draft_catches_up_after_full_acceptance() -> None:
    """All k accepted: the draft has not seen the last draft token and the bonus; it feeds both (S = 2)."""
    t = _table(4)
    backend = bigram_backend(t, t)
    run(backend, [1, 2, 3], 30, 3)
    # 1 target prefill + one verify per 4 tokens; the draft runs k times per step
    assert backend.target().engine.calls == 1 + 29 // 4 + (29 % 4 > 0)
    draft = backend.draft().engine
    assert draft.new_tokens[0] == 4  # its prefill: the first proposal's catch-up, the prompt and the first token
    assert draft.new_tokens[1:3] == [1, 1] and draft.new_tokens[3] == 2  # all 3 accepted: catch-up


def test_autoregressive_never_opens_the_draft() -> None:
    t = _table(5)
    backend = bigram_backend(t, t)
    state, _ = run(backend, [7], 20, 0)
    assert state.out == greedy_reference(t, [7], 20, frozenset())
    assert state.stats.proposed == 0 and state.stats.steps == 19
    assert not backend.draft_loaded


def test_the_drafts_prefill_waits_for_its_first_proposal() -> None:
    """The draft runs nothing before the first token: a request whose policy may draft but never does never opens it;
    one that drafts from its third step catches up on every committed token in its first run (its prefill)."""
    t = _table(5)
    backend = bigram_backend(t, t)
    state, _ = run(backend, [7, 8], 12, ScriptedK([0] * 20 + [3]))
    assert state.out == greedy_reference(t, [7, 8], 12, frozenset())
    assert not backend.draft_loaded
    state, _ = run(backend, [7, 8], 12, ScriptedK([0, 0, 2]))
    assert state.out == greedy_reference(t, [7, 8], 12, frozenset())
    assert backend.draft().engine.new_tokens[0] == 2 + 3  # the prompt, the first token and two plain steps' tokens


def test_seeded_sampling_is_reproducible() -> None:
    t = _table(6, 1.0)
    backend = bigram_backend(t, t + _table(7, 1.0))
    params = SamplingParams(temperature=0.8, top_p=0.9)
    runs = [run(backend, [1], 30, 3, params=params, seed=seed)[0].out for seed in (11, 11, 12)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_drafting_stops_at_a_drafted_eos() -> None:
    """Drafts after an eos would never be emitted: the step verifies up to the eos and no further."""
    t = _table(8)
    free = greedy_reference(t, [2], 40, frozenset())
    eos = frozenset({free[6]})
    state, _ = run(bigram_backend(t, t), [2], 40, 8, eos=eos)
    assert state.out == greedy_reference(t, [2], 40, eos)
    # one step: the drafts up to and including the eos, all accepted; none proposed past it (k = 8)
    assert state.stats.steps == 1 and state.stats.proposed == state.stats.accepted == len(state.out) - 1 < 8


def _cache_invariants(backend: ReferenceBackend) -> Callable[[DecodeState], None]:
    """Before every step: the target caches all committed tokens but the last; the draft no more than that."""

    def check(state: DecodeState) -> None:
        assert backend.target().engine.cache(state.slot).length == state.length - 1
        if backend.draft_loaded:
            assert backend.draft().engine.cache(state.slot).length <= state.length - 1

    return check


@pytest.mark.parametrize("sampled", [False, True])
def test_k_from_a_policy_changes_every_step(sampled: bool) -> None:
    """k per step from the policy (0 included: a plain step, the drafter untouched), capped at the budget."""
    t = _table(10, 1.5)
    backend = bigram_backend(t, t + _table(11, 1.0))
    params = SamplingParams(1.0) if sampled else SamplingParams()
    policy = ScriptedK([3, 0, 8, 1, 0, 0, 5, 2, 8], check=_cache_invariants(backend))
    state, _ = run(backend, [4, 5], 45, policy, params=params, seed=1)
    if not sampled:
        assert state.out == greedy_reference(t, [4, 5], 45, frozenset())
    assert len(state.out) == 45
    emitted, verified = 1, []
    for asked, (k, n) in zip(policy.asked, policy.observed, strict=True):
        assert k == min(asked, 45 - emitted - 1) and 0 <= n <= k  # the cap: never past max_new_tokens
        emitted += n + 1
        verified.append(k)
    assert emitted == 45
    assert state.stats.proposed == sum(verified) and state.stats.proposed_at[7] == verified.count(8)
    # the draft ran only for the k > 0 steps: k steps each (catch-ups included; its prefill is the first one's)
    assert backend.draft().engine.calls == sum(verified)


def test_a_policy_out_of_range_is_refused() -> None:
    t = _table(12)
    with pytest.raises(SpecpackError, match="k policy out of range"):
        run(bigram_backend(t, t, k_max=4), [1], 10, ScriptedK([2, 9]), k_max=4)
    with pytest.raises(SpecpackError, match="k policy out of range"):
        run(bigram_backend(t, t, k_max=4), [1], 10, ScriptedK([2, -1, 3]), k_max=4)


@pytest.mark.parametrize("good", [True, False])
def test_deterministic_proposals_are_lossless(good: bool) -> None:
    """q None (one-hot): a drafter that proposes the target's own continuation is always accepted; a wrong
    one never is; the output is the target's either way."""
    t = _table(13)

    def continuation(state: DecodeState) -> list[int]:
        right = greedy_reference(t, state.ids[: state.length].tolist(), 8, frozenset())
        return right if good else [(token + 1) % V for token in right]

    drafter = LookupDrafter(continuation)
    backend = bigram_backend(t, t)
    state, _ = run(backend, [3], 40, 4, drafter=drafter)
    assert state.out == greedy_reference(t, [3], 40, frozenset())
    assert drafter.begun == 1 and not backend.draft_loaded
    assert state.stats.alpha == (1.0 if good else 0.0)


def test_cancel_stops_within_one_step() -> None:
    t = _table(14)
    backend = bigram_backend(t, t + _table(15, 1.0))
    cancel = threading.Event()
    seen: list[list[int]] = []

    def on_tokens(new: list[int]) -> None:
        seen.append(new)
        if len(seen) == 2:
            cancel.set()

    state, finish = run(backend, [1], 60, 4, on_tokens=on_tokens, cancel=cancel)
    assert finish == "cancelled" and len(seen) == 2 and state.stats.steps == 1  # the first token, one step
    assert state.out == [token for new in seen for token in new]
    assert state.out == greedy_reference(t, [1], 60, frozenset())[: len(state.out)]
    state, finish = run(backend, [1], 60, 4, cancel=cancel)  # already set: nothing runs
    assert finish == "cancelled" and state.out == [] and backend.target().engine.calls == 2


def test_an_exception_from_on_tokens_propagates_and_the_next_run_is_clean() -> None:
    t = _table(16, 1.0)
    backend = bigram_backend(t, t + _table(17, 1.0))
    params = SamplingParams(0.9)
    expected = run(bigram_backend(t, t + _table(17, 1.0)), [2, 3], 30, 4, params=params, seed=5)[0].out

    def boom(new: list[int]) -> None:
        raise ConnectionResetError("client went away")

    with pytest.raises(ConnectionResetError):
        run(backend, [9, 9, 9, 9], 30, 4, params=params, seed=8, on_tokens=boom)
    assert run(backend, [2, 3], 30, 4, params=params, seed=5)[0].out == expected


def test_slots_keep_requests_apart() -> None:
    """Two requests interleaved step by step on two cache slots of one backend: each as if alone."""
    t = _table(18, 1.0)
    backend = bigram_backend(t, t + _table(19, 1.0), slots=2)
    params = SamplingParams(1.0)
    alone = [run(bigram_backend(t, t + _table(19, 1.0)), p, 25, 3, params=params, seed=s)[0].out
             for p, s in (([1, 2], 1), ([5], 2))]
    results: dict[int, list[int]] = {}
    cond, turn, done = threading.Condition(), [0], [False, False]

    def request(slot: int, prompt: list[int], seed: int) -> None:
        def my_turn() -> bool:
            return turn[0] == slot or done[1 - slot]

        def on_tokens(new: list[int]) -> None:  # strict alternation: hand over to the other after every step
            with cond:
                turn[0] = 1 - slot
                cond.notify_all()
                assert cond.wait_for(my_turn, timeout=10)

        with cond:
            assert cond.wait_for(my_turn, timeout=10)
        try:
            results[slot] = run(backend, prompt, 25, 3, params=params, seed=seed, on_tokens=on_tokens, slot=slot)[0].out
        finally:
            with cond:
                done[slot], turn[0] = True, 1 - slot
                cond.notify_all()

    threads = [threading.Thread(target=request, args=args) for args in ((0, [1, 2], 1), (1, [5], 2))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert [results[0], results[1]] == alone


@pytest.mark.parametrize("pad", [True, False])
def test_greedy_single_steps_pad_on_the_reference_backend(pad: bool) -> None:
    """The pad rule of runtime/target.py, in numpy: a greedy k = 0 step runs two rows (the token and a pad draft)
    and emits the target's argmax whether the pad passed or not; the pad never stays in the cache. Sampled steps
    and steps with drafts are not padded."""
    t = _table(6)
    want = greedy_reference(t, [1, 2, 3], 24, frozenset())
    backend = ReferenceBackend(bigram_logits(t), lambda: bigram_logits(t), len(t), 8, pad_single_steps=pad)
    state, _ = run(backend, [1, 2, 3], 24, 0)
    assert state.out == want
    target = backend.target().engine
    assert target.new_tokens[0] == 3  # the prefill
    assert set(target.new_tokens[1:]) == ({2} if pad else {1})
    assert target.cache(0).length == state.length - 1
    sampled = ReferenceBackend(bigram_logits(t), lambda: bigram_logits(t), len(t), 8)
    run(sampled, [1, 2, 3], 24, 0, params=SamplingParams(0.8), seed=1)
    assert set(sampled.target().engine.new_tokens[1:]) == {1}
