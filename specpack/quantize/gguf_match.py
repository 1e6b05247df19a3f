"""A GGUF file's 2-D tensors, found for a graph's weight by their values (the graph's names are not GGUF's).

    tensors = GgufTensors(path)
    tensors.match(site, W [K, N])  -> the GGUF tensor whose first and last rows are W's first and last columns, or None
    tensors.raw(tensor)            -> its stored bytes, uint8 [N, row bytes], read into memory (a copy)

GGUF dims are (K, N), the row length first; a tensor's data is its N rows of blocks, W transposed. `raw` reads
a copy rather than the reader's memory map: the pages of a mapped file that a process has read stay in its
resident memory while the map lives, so reading every tensor through it would add the file's size to the
quantize stage's peak.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from specpack.quantize.sites import Site


class GgufTensors:
    """The file's 2-D tensors by shape, and the dequantized first and last rows of those looked at."""

    def __init__(self, path: Path) -> None:
        import gguf

        self.path = Path(path)
        self.reader = gguf.GGUFReader(self.path)
        self.by_shape: dict[tuple[int, int], list[Any]] = {}
        for t in self.reader.tensors:
            if len(t.shape) == 2:
                self.by_shape.setdefault((int(t.shape[1]), int(t.shape[0])), []).append(t)
        self._rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def match(self, site: Site, weight: np.ndarray) -> Any | None:
        """The GGUF tensor whose first and last rows equal W's first and last columns."""
        import gguf

        first, last = np.asarray(weight[:, 0], np.float32), np.asarray(weight[:, -1], np.float32)
        for t in self.by_shape.get((site.n, site.k), []):
            if t.name not in self._rows:
                rows = np.asarray(t.data).reshape(site.n, -1)
                qtype = gguf.GGMLQuantizationType(t.tensor_type)
                self._rows[t.name] = (gguf.quants.dequantize(rows[:1], qtype).reshape(-1),
                                      gguf.quants.dequantize(rows[-1:], qtype).reshape(-1))
            row0, row_last = self._rows[t.name]
            if np.array_equal(row0, first) and np.array_equal(row_last, last):
                return t
        return None

    def raw(self, tensor: Any) -> np.ndarray:
        """The tensor's stored bytes as uint8 [N, row bytes], read from the file (memory freed with the array)."""
        data = np.fromfile(self.path, np.uint8, count=int(tensor.n_bytes), offset=int(tensor.data_offset))
        return data.reshape(int(tensor.shape[1]) if len(tensor.shape) == 2 else 1, -1)
