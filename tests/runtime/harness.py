"""Run the decode loop on the reference backend over bigram tables: no graphs, no files.

    bigram_backend(target_table, draft_table, k_max=8)  -> ReferenceBackend
    run(backend, prompt, max_new, policy_or_k, ...)      -> (DecodeState, finish_reason)
    greedy_reference(table, prompt, n, eos)              -> the target's own greedy tokens
    ScriptedK([...])                                     a k policy that asks for the given ks in turn
    LookupDrafter(tokens)                                a deterministic drafter (q None) proposing fixed tokens
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from specpack.runtime.backend import Backend
from specpack.runtime.backends.reference import ReferenceBackend, bigram_logits
from specpack.runtime.drafter import Drafter, ModelDrafter
from specpack.runtime.k_policy import FixedK, KPolicy
from specpack.runtime.loop import decode
from specpack.runtime.state import DecodeState, Proposal
from specpack.runtime.stats import DecodeStats
from specpack.sampling import SamplingParams, Uniforms


def table(vocab: int, seed: int, sharp: float = 3.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, sharp, (vocab, vocab)).astype(np.float32)  # [V, V]


def bigram_backend(target_table: np.ndarray, draft_table: np.ndarray, k_max: int = 8, slots: int = 1) -> ReferenceBackend:
    return ReferenceBackend(bigram_logits(target_table), lambda: bigram_logits(draft_table), len(target_table), k_max,
                            slots)


def greedy_reference(target_table: np.ndarray, prompt: list[int], n: int, eos: frozenset[int]) -> list[int]:
    out, last = [], prompt[-1]
    for _ in range(n):
        last = int(np.argmax(target_table[last]))
        out.append(last)
        if last in eos:
            break
    return out


def run(backend: Backend, prompt: list[int], max_new: int, policy: KPolicy | int, *,
        eos: frozenset[int] = frozenset(), params: SamplingParams | None = None, seed: int | None = None,
        generator: np.random.Generator | None = None, drafter: Drafter | None = None, max_len: int = 256,
        on_tokens: Callable[[list[int]], None] | None = None, cancel: threading.Event | None = None,
        slot: int = 0, k_max: int = 8) -> tuple[DecodeState, str]:
    """One request through the loop, on `backend` (whose k_max is `k_max`), outside any Pack."""
    params = params or SamplingParams()
    policy = FixedK(policy) if isinstance(policy, int) else policy
    uniforms = Uniforms(params, k_max, generator=generator, seed=seed)
    state = DecodeState.start(list(prompt), max_new, params, uniforms, eos_ids=eos, max_len=max_len,
                              k_max=k_max, stats=DecodeStats(k=policy.k_max), slot=slot)
    finish = decode(state, backend.target(), drafter or ModelDrafter(backend.draft), policy, on_tokens, cancel)
    return state, finish


class ScriptedK:
    """Asks for script[i] at step i (the last one after that); records what the loop reported back.

    `check(state)` runs before every step: tests put cache invariants there.
    """

    def __init__(self, script: list[int], check: Callable[[DecodeState], None] | None = None) -> None:
        self.script, self.check = script, check
        self.asked: list[int] = []
        self.observed: list[tuple[int, int]] = []

    @property
    def k_max(self) -> int:
        return max(self.script)

    def next_k(self, state: DecodeState) -> int:
        if self.check is not None:
            self.check(state)
        k = self.script[min(len(self.asked), len(self.script) - 1)]
        self.asked.append(k)
        return k

    def observe(self, k: int, n_accepted: int, elapsed_s: float, draft_s: float, *, tree: object = None) -> None:
        assert elapsed_s >= draft_s >= 0.0
        self.observed.append((k, n_accepted))


class LookupDrafter:
    """A deterministic drafter: proposes `continuation(state)`'s first k tokens, q None (one-hot)."""

    def __init__(self, continuation: Callable[[DecodeState], list[int]]) -> None:
        self.continuation = continuation
        self.begun = 0

    def begin(self, state: DecodeState) -> None:
        self.begun += 1

    def propose(self, state: DecodeState, k: int) -> Proposal:
        tokens = self.continuation(state)[:k]
        state.ids[state.length : state.length + len(tokens)] = tokens
        return Proposal(tokens=state.ids[state.length : state.length + len(tokens)], q=None)

    def commit(self, state: DecodeState) -> None:
        pass
