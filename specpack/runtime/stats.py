"""Speculative decoding statistics, with docs/vocabulary.md's definitions (as vLLM reports them).

alpha: accepted / proposed draft tokens, where proposed counts only drafts that were verified (k is
capped at the tokens still allowed). tau: tokens emitted per verify step (accepted + 1).
tokens_per_s: decoding after the first token; time to first token is reported apart.
k_histogram[k]: steps that verified k drafts; k_asked_histogram[k]: steps the k policy asked k for (after the
loop's cap), which differ where a drafter proposed fewer (the n-gram drafter without a match, a drafted eos).
draft_s / verify_s: time in the draft phase / in the verify and commit phase of the steps, summed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class Stats(dict[str, Any]):
    """A generation's statistics: a plain dict (JSON-serializable as is) whose keys also read as attributes,
    `out.stats.alpha` as `out.stats["alpha"]`."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no statistic {name!r}; there are: {', '.join(sorted(self))}") from None


@dataclass
class DecodeStats:
    k: int                         # the most drafts a step may ask for (the k policy's k_max)
    drafter: str = "model"         # who proposed the drafts: "model" | "ngram"
    k_policy: str = "fixed"        # "fixed" (the same k every step) | "auto" (adaptive_k.py, tree_policy.py)
    tree: bool = False             # the drafts were token trees: k counts nodes, and position i of the per-position
                                   # counts is depth i + 1 (the accepted path is a chain)
    steps: int = 0                 # verify steps after the prefill
    proposed: int = 0
    accepted: int = 0
    proposed_at: list[int] = field(default_factory=list)  # per draft position 1..k
    accepted_at: list[int] = field(default_factory=list)
    k_histogram: list[int] = field(default_factory=list)        # [k + 1] steps per verified k
    k_asked_histogram: list[int] = field(default_factory=list)  # [k + 1] steps per k asked
    draft_s: float = 0.0
    verify_s: float = 0.0
    new_tokens: int = 0
    ttft_s: float = 0.0            # prompt in -> first token out (both prefills are part of it)
    decode_s: float = 0.0          # first token out -> last token out

    def __post_init__(self) -> None:
        self.proposed_at = [0] * self.k
        self.accepted_at = [0] * self.k
        self.k_histogram = [0] * (self.k + 1)
        self.k_asked_histogram = [0] * (self.k + 1)

    def record_step(self, k: int, n_accepted: int, *, asked: int | None = None, draft_s: float = 0.0,
                    verify_s: float = 0.0) -> None:
        """One verify of k drafts, of which the first n_accepted passed; `asked`: the k asked for (default k)."""
        self.steps += 1
        self.k_histogram[k] += 1
        self.k_asked_histogram[k if asked is None else asked] += 1
        self.draft_s += draft_s
        self.verify_s += verify_s
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

    def to_dict(self) -> Stats:
        per_position = [a / p if p else None for a, p in zip(self.accepted_at, self.proposed_at, strict=True)]
        return Stats({
            "alpha": self.alpha, "tau": self.tau, "steps": self.steps, "proposed": self.proposed,
            "accepted": self.accepted, "per_position": per_position,
            "proposed_at": list(self.proposed_at), "accepted_at": list(self.accepted_at), "tokens_per_s": self.tokens_per_s,
            "k": self.k, "new_tokens": self.new_tokens, "ttft_s": self.ttft_s, "decode_s": self.decode_s,
            "drafter": self.drafter, "k_policy": self.k_policy, "tree": self.tree, "k_histogram": list(self.k_histogram),
            "k_asked_histogram": list(self.k_asked_histogram), "draft_s": self.draft_s, "verify_s": self.verify_s,
        })
