"""Child process of test_kv_compact.test_kv_compact_writes_only_the_tree_rows: does kv_compact.onnx, bound in place,
write only the rows R .. R + T of each cache buffer?

    python kv_compact_probe.py

Each cache tensor lives in its own page-aligned anonymous mapping; every page that holds none of the rows [R, R + T]
(the T + 1 destinations: the accepted path's, and the padding written onto itself) is write-protected (mprotect
PROT_READ) before the run. A write anywhere else (a copy of the buffer, an output written elsewhere and copied back)
is a SIGSEGV: the parent sees a negative exit status. Prints a JSON report: pages protected, and whether the buffers
hold the compacted cache.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: specpack

from specpack import names
from specpack.graphs.kv_compact import kv_compact_model

LAYERS, HEADS, HEAD_DIM, CACHE = 2, 2, 16, 1024  # a row is 64 bytes: 64 rows per page
ROOT, PATH = 300, [0, 2, 5, 9, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1]  # T = 20
PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)


def _protect(start: int, end: int, writable: bool) -> None:
    if end > start:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        if _libc.mprotect(ctypes.c_void_p(start), ctypes.c_size_t(end - start), prot) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")


def main() -> None:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(kv_compact_model(LAYERS, HEADS, HEAD_DIM).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    shape = (1, HEADS, CACHE, HEAD_DIM)
    nbytes = int(np.prod(shape)) * 4
    maps = [mmap.mmap(-1, nbytes) for _ in range(2 * LAYERS)]  # page-aligned, one per cache tensor
    buffers = [np.frombuffer(m, dtype=np.float32).reshape(shape) for m in maps]
    for b in buffers:
        b[...] = rng.standard_normal(shape, dtype=np.float32)
    before = [b.copy() for b in buffers]
    path = np.array([PATH], np.int64)  # [1, T+1]
    mask = np.zeros((1, CACHE), np.int64)
    mask[0, : ROOT + path.shape[1]] = 1
    row = HEAD_DIM * 4
    protected = 0
    for b in buffers:
        base = b.ctypes.data
        _protect(base, base + nbytes, writable=False)
        protected += nbytes // PAGE
        for h in range(HEADS):  # rows [R, R + T] of each head stay writable
            lo, hi = base + (h * CACHE + ROOT) * row, base + (h * CACHE + ROOT + path.shape[1]) * row
            first, last = lo // PAGE * PAGE, -(-hi // PAGE) * PAGE
            _protect(first, last, writable=True)
            protected -= (last - first) // PAGE
    binding = session.io_binding()
    binding.bind_cpu_input(names.ATTENTION_MASK, mask)
    binding.bind_cpu_input(names.PATH, path)
    for b, past, present in zip(buffers, names.kv_names(LAYERS, "past"), names.kv_names(LAYERS, "present"),
                                strict=True):
        value = ort.OrtValue.ortvalue_from_numpy(b)
        binding.bind_ortvalue_input(past, value)
        binding.bind_ortvalue_output(present, value)
    session.run_with_iobinding(binding)
    n = sum(p >= 0 for p in PATH) - 1
    ok = True
    for b, old in zip(buffers, before, strict=True):
        want = old.copy()
        want[:, :, ROOT: ROOT + n + 1] = old[:, :, ROOT + np.array(PATH[: n + 1])]
        ok &= bool(np.array_equal(b, want))  # the rows past R + n are the padding's: each onto itself
    print(json.dumps({"protected_pages": protected, "pages": len(maps) * nbytes // PAGE, "compacted": ok}))


if __name__ == "__main__":
    main()
