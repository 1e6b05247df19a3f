"""k policies: how many drafts each step asks for (docs/architecture.md, "k policy").

The loop asks `next_k(state)` before every step, caps the answer at the tokens still allowed, and reports
what happened with `observe(k, n_accepted, elapsed_s, draft_s)`. k = 0 is a plain autoregressive step
through the verify graph. A policy lives for one request.

    FixedK      the same k every step (`generate(k=N)`)
    AdaptiveK   the k of the highest expected tokens per second (`generate(k=None)`, "auto"; adaptive_k.py)
"""

from __future__ import annotations

from typing import Protocol

from specpack.runtime.state import DecodeState


class KPolicy(Protocol):
    @property
    def k_max(self) -> int:
        """The most drafts it will ever ask for (0: never draft, so the draft model is never opened)."""
        ...

    def next_k(self, state: DecodeState) -> int:
        """Drafts for the next step, in 0..k_max."""
        ...

    def observe(self, k: int, n_accepted: int, elapsed_s: float, draft_s: float) -> None:
        """The step verified k drafts (after the loop's cap and the drafter's own limits; 0 when it proposed
        nothing), n_accepted passed; it took elapsed_s, of which draft_s drafting (the rest: verify and commit)."""
        ...


class FixedK:
    def __init__(self, k: int) -> None:
        self.k = k

    @property
    def k_max(self) -> int:
        return self.k

    def next_k(self, state: DecodeState) -> int:
        return self.k

    def observe(self, k: int, n_accepted: int, elapsed_s: float, draft_s: float) -> None:
        pass
