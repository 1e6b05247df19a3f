"""Speculative decoding statistics, with docs/vocabulary.md's definitions (as vLLM reports them).

alpha: accepted / proposed draft tokens, where proposed counts only drafts that were verified (k is
capped at the tokens still allowed). tau: tokens emitted per verify step (accepted + 1).
tokens_per_s: decoding after the first token; time to first token is reported apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DecodeStats:
    k: int
    steps: int = 0                 # verify steps after the prefill
    proposed: int = 0
    accepted: int = 0
    proposed_at: list[int] = field(default_factory=list)  # per draft position 1..k
    accepted_at: list[int] = field(default_factory=list)
    new_tokens: int = 0
    ttft_s: float = 0.0            # prompt in -> first token out (both prefills are part of it)
    decode_s: float = 0.0          # first token out -> last token out

    def __post_init__(self) -> None:
        self.proposed_at = [0] * self.k
        self.accepted_at = [0] * self.k

    def record_step(self, k: int, n_accepted: int) -> None:
        """One verify of k drafts, of which the first n_accepted passed."""
        self.steps += 1
        self.proposed += k
        self.accepted += n_accepted
        for i in range(k):
            self.proposed_at[i] += 1
            self.accepted_at[i] += i < n_accepted

    @property
    def alpha(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tau(self) -> float:
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        decoded = self.new_tokens - 1
        return decoded / self.decode_s if decoded > 0 and self.decode_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        per_position = [a / p if p else None for a, p in zip(self.accepted_at, self.proposed_at, strict=True)]
        return {
            "alpha": self.alpha, "tau": self.tau, "steps": self.steps, "proposed": self.proposed,
            "accepted": self.accepted, "per_position": per_position,
            "proposed_at": list(self.proposed_at), "accepted_at": list(self.accepted_at), "tokens_per_s": self.tokens_per_s,
            "k": self.k, "new_tokens": self.new_tokens, "ttft_s": self.ttft_s, "decode_s": self.decode_s,
        }
