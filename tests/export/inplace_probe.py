"""Child process of test_static_export.test_writes_only_new_rows: does a static graph write only rows [L, L + S)
of the cache buffers bound to it?

    python inplace_probe.py '{"graph": ..., "layers": ..., "kv_heads": ..., "head_dim": ..., "vocab": ...}'

Prefill L tokens, then write-protect (mprotect PROT_READ) every page of the cache that holds no row of
[L, L + S), run S tokens, and compare the logits with a run on an unprotected copy of the cache. A write
anywhere else (a full copy of the buffer, an output written elsewhere and copied back) is a SIGSEGV: the
parent sees a negative exit status. Then a rollback with the whole cache protected. Prints a JSON report.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: static_harness

from static_harness import StaticRunner

MAX_LEN, PREFILL, NEW = 1024, 70, 5  # 64 rows of head_dim 16 fp32 per page: rows 70..74 sit in one page per head
PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)


def _protect(start: int, end: int, writable: bool) -> None:
    """mprotect the whole pages in [start, end)."""
    first, last = -(-start // PAGE) * PAGE, end // PAGE * PAGE
    if last > first:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        if _libc.mprotect(ctypes.c_void_p(first), ctypes.c_size_t(last - first), prot) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")


def _run(spec: dict, protect: bool) -> tuple[np.ndarray, dict[str, int]]:
    runner = StaticRunner(Path(spec["graph"]), _Info(spec), MAX_LEN)
    ids = np.random.default_rng(0).integers(0, spec["vocab"], PREFILL + NEW)
    runner.run(ids[:PREFILL])
    buffers = runner.cache._buffers  # [2 * layers, 1, H, M, D]
    addresses = [b.ctypes.data for b in runner.cache.bind_outputs(NEW).values()]
    row = spec["head_dim"] * buffers.itemsize
    keep = [(base + h * MAX_LEN * row + PREFILL * row, base + h * MAX_LEN * row + (PREFILL + NEW) * row)
            for base in addresses for h in range(spec["kv_heads"])]  # byte ranges of rows [L, L + S)
    stats = {"protected_pages": 0, "writable_pages": 0}
    begin, end = buffers.ctypes.data, buffers.ctypes.data + buffers.nbytes
    if protect:
        _protect(begin, end, writable=False)
        for lo, hi in keep:  # the pages holding the new rows stay writable
            _protect(lo // PAGE * PAGE, -(-hi // PAGE) * PAGE, writable=True)
        writable = {p for lo, hi in keep for p in range(lo // PAGE, (hi - 1) // PAGE + 1)}
        whole = range(-(-begin // PAGE), end // PAGE)
        stats = {"protected_pages": len([p for p in whole if p not in writable]), "writable_pages": len(writable),
                 "cache_pages": len(whole), "new_row_ranges": len(keep)}
    logits = runner.run(ids[PREFILL:])["logits"]
    stats["addresses_unchanged"] = addresses == [b.ctypes.data for b in runner.cache.bind_outputs(1).values()]
    if protect:
        _protect(begin, end, writable=False)
        runner.rollback(PREFILL)  # a length update: writes nothing
        _protect(begin, end, writable=True)
    return logits, stats


class _Info:
    def __init__(self, spec: dict) -> None:
        self.num_layers, self.kv_heads, self.head_dim = spec["layers"], spec["kv_heads"], spec["head_dim"]


def main() -> None:
    spec = json.loads(sys.argv[1])
    want, _ = _run(spec, protect=False)
    got, stats = _run(spec, protect=True)
    print(json.dumps({**stats, "max_abs_diff": float(np.abs(got - want).max())}))


if __name__ == "__main__":
    main()
