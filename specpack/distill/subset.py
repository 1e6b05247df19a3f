"""The vocabulary subset a head drafts over: the most frequent tokens of its training data (FR-Spec, EAGLE-3).

Ties are broken by the smaller id; the subset is returned sorted by id. Its size is min(subset_size, vocabulary):
a small vocabulary is drafted over whole. Exactness does not depend on it: the head's q is zero outside the subset
and the verify's residual max(0, p - q) keeps those tokens' full mass (docs/design/heads_and_trees.md §2.5).
"""

from __future__ import annotations

import numpy as np


def frequency_subset(ids: np.ndarray, vocab_rows: int, size: int) -> np.ndarray:
    """int64 [min(size, vocab_rows)]: the most frequent token ids of `ids`, then the smallest unseen ids, sorted."""
    counts = np.bincount(np.asarray(ids, dtype=np.int64), minlength=vocab_rows)[:vocab_rows]
    order = np.lexsort((np.arange(vocab_rows), -counts))  # by count descending, then id ascending
    return np.sort(order[: min(size, vocab_rows)]).astype(np.int64)


def coverage(ids: np.ndarray, subset: np.ndarray) -> float:
    """Share of the tokens of `ids` inside the subset."""
    return float(np.isin(ids, subset).mean()) if ids.size else 0.0
