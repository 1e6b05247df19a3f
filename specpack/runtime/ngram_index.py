"""Where each n-gram of a growing token sequence last occurred: the lookup behind prompt-lookup drafting.

    index = NgramIndex(n_min=1, n_max=4)
    index.push(token)            # O(n_max) per token: as tokens are committed, never a rescan
    end, n = index.match()       # the latest earlier occurrence of the longest suffix n-gram that has one
    ends = index.matches(4)      # up to 4 earlier occurrences: the longest n first, each n's latest first

The sequence is tokens[0:length]. For each n in n_min..n_max, a dict maps an n-gram to the end e of its
latest occurrence (the n-gram is tokens[e-n:e], its continuation starts at tokens[e]), over every end
e < length: the n-grams ending at `length` itself (the current suffix) enter the dicts when the next token
arrives, so a lookup of the suffix finds an earlier occurrence, never itself.

An n-gram's key is a Python int packing its tokens exactly, TOKEN_BITS bits each, the newest lowest:
    key_n(e) = tokens[e-1] | tokens[e-2] << B | ... | tokens[e-n] << (n-1)B,  key_n(e+1) = key_{n-1}(e) << B | tokens[e]
so keys are exact (no hash collisions to check) and each push updates n_max keys from the previous ones.
Nothing but Python ints is allocated per token (and the dicts grow by one entry per n).
"""

from __future__ import annotations

import numpy as np

TOKEN_BITS = 32  # bits per token in a key: exact for any id below 2**32 (vocabularies stop at 2**22)


class NgramIndex:
    def __init__(self, n_min: int, n_max: int) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}..{n_max}")
        self.n_min, self.n_max = n_min, n_max
        self.tables: list[dict[int, int]] = [{} for _ in range(n_min, n_max + 1)]  # [n - n_min]: key -> latest end
        self.earlier: list[dict[int, int]] = [{} for _ in range(n_min, n_max + 1)]  # [n - n_min]: end -> the end of
                                                                                   # the same n-gram's occurrence before
        self.suffix = [0] * n_max   # [n - 1]: key of tokens[length-n:length] (valid for n <= length)
        self.length = 0

    def reset(self) -> None:
        for table in (*self.tables, *self.earlier):
            table.clear()
        self.length = 0

    def push(self, token: int) -> None:
        """Append one token: the current suffix n-grams become earlier occurrences, then the suffix moves on."""
        end, suffix = self.length, self.suffix
        for n in range(self.n_min, min(self.n_max, end) + 1):
            table, key = self.tables[n - self.n_min], suffix[n - 1]
            before = table.get(key)
            if before is not None:
                self.earlier[n - self.n_min][end] = before
            table[key] = end
        for n in range(min(self.n_max, end + 1), 1, -1):  # longest first: suffix[n - 2] is still the old one
            suffix[n - 1] = suffix[n - 2] << TOKEN_BITS | token
        suffix[0] = token
        self.length = end + 1

    def extend(self, ids: np.ndarray, end: int) -> None:
        """Push ids[length:end] (the tokens committed since the last call)."""
        for i in range(self.length, end):
            self.push(ids.item(i))

    def match(self) -> tuple[int, int]:
        """(end, n) of the latest earlier occurrence of the suffix n-gram, n tried from n_max down to n_min;
        (-1, 0) when none of them occurred before. The continuation to propose starts at tokens[end]."""
        for n in range(min(self.n_max, self.length), self.n_min - 1, -1):
            end = self.tables[n - self.n_min].get(self.suffix[n - 1])
            if end is not None:
                return end, n
        return -1, 0

    def matches(self, limit: int) -> list[int]:
        """Up to `limit` distinct ends of earlier occurrences of the suffix n-grams: n from n_max down to n_min, each
        n's occurrences from the latest back (a longer match is the better evidence; the later, the likelier)."""
        ends: list[int] = []
        for n in range(min(self.n_max, self.length), self.n_min - 1, -1):
            end = self.tables[n - self.n_min].get(self.suffix[n - 1])
            while end is not None and len(ends) < limit:
                if end not in ends:
                    ends.append(end)
                end = self.earlier[n - self.n_min].get(end)
            if len(ends) >= limit:
                break
        return ends
