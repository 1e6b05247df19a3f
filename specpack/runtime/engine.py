"""The interface the decode loop talks to: a draft engine and a target engine over shared DecodeBuffers.

Both read their new tokens from `buffers.ids[:, kv_length:end]`; every backend (ONNX Runtime, the numpy
reference) implements these few methods and nothing else.
"""

from __future__ import annotations

from typing import Protocol


class DraftEngine(Protocol):
    @property
    def kv_length(self) -> int:
        """Positions of ids already in this model's cache."""
        ...

    def propose(self, end: int, slot: int) -> int:
        """Run the draft over ids[kv_length:end] (S >= 1), draw from the last position with
        draft_uniforms[slot], write q into draft_probs[0, slot]; return the token. kv_length becomes end."""
        ...

    def rollback(self, length: int) -> None:
        """Keep the first `length` cached positions."""
        ...

    def close(self) -> None: ...


class TargetEngine(Protocol):
    @property
    def kv_length(self) -> int: ...

    def verify(self, end: int, k: int) -> tuple[int, int]:
        """Run the target over ids[kv_length:end], whose last k tokens are drafts with q in
        draft_probs[0, :k]; return (n_accepted, next_token). kv_length becomes end."""
        ...

    def rollback(self, length: int) -> None: ...

    def close(self) -> None: ...
