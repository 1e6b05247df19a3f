"""Write a graph whose initializers go, one after another, into one external-data file next to it.

Used by the quantize stage: the new graph's tensors (quantized weights, and every kept tensor copied from
the old data file) are appended to `<out.name>.data` as they are made, so only one weight is in memory at
a time. Offsets are aligned to 4 KiB, so ONNX Runtime can memory-map each tensor instead of reading it.
Tensors under 1 KiB stay inline (ONNX Runtime's shape inference reads small constants).

Two graphs of one model (verify.onnx and verify_batched.onnx: docs/batching.md) can share one data file: the first
graph's writer records each tensor it writes by the sha256 of its bytes (a `SharedData`), and the second graph's
writer, given the same record, points an equal tensor at the first file's bytes (same location, offset and length)
instead of writing it again; what the first file lacks goes into the second graph's own file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

ALIGN = 4096
INLINE_BYTES = 1024


@dataclass
class SharedData:
    """The data file one graph wrote, indexed by content, for another graph of the same model written beside it."""

    location: str | None = None                    # the first writer's file (relative to both graphs' folder)
    offsets: dict[str, tuple[int, int]] = field(default_factory=dict)  # sha256 of a tensor's bytes -> offset, length
    reused: int = 0                                # tensors a later writer pointed at `location`
    reused_bytes: int = 0


class DataFileWriter:
    """Appends tensor bytes to `<onnx_path.name>.data`; `tensor()` returns the TensorProto that points there.
    `shared`: the first writer given it records what it writes; a later one points an equal tensor there."""

    def __init__(self, onnx_path: Path, shared: SharedData | None = None) -> None:
        self.location = f"{Path(onnx_path).name}.data"
        self.path = Path(onnx_path).with_name(self.location)
        self.path.unlink(missing_ok=True)
        self._file: BinaryIO = open(self.path, "wb")  # noqa: SIM115 (closed in close())
        self.shared = shared
        if shared is not None and shared.location is None:
            shared.location = self.location

    def tensor(self, name: str, array: np.ndarray) -> TensorProto:
        """A TensorProto named `name` with `array`'s values: inline when small, else appended to the file."""
        array = np.ascontiguousarray(array)
        if array.nbytes < INLINE_BYTES:
            return numpy_helper.from_array(array, name)
        proto = TensorProto(name=name, data_type=onnx.helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape)
        self._append(proto, array.data.cast("B"))
        return proto

    def copy(self, proto: TensorProto, data: bytes | memoryview) -> TensorProto:
        """An external tensor `proto` (its name, type and dims) with its stored bytes `data` copied into this file."""
        out = TensorProto()
        out.CopyFrom(proto)
        del out.external_data[:]
        self._append(out, data)
        return out

    def _append(self, proto: TensorProto, data: bytes | memoryview) -> None:
        shared, location = self.shared, self.location
        digest = None if shared is None else hashlib.sha256(data).hexdigest()
        if shared is not None and digest is not None and shared.location != location and digest in shared.offsets:
            location = shared.location or location  # the first graph's bytes, equal to these: nothing written
            offset, _ = shared.offsets[digest]
            shared.reused, shared.reused_bytes = shared.reused + 1, shared.reused_bytes + len(data)
        else:
            offset = -(-self._file.tell() // ALIGN) * ALIGN
            self._file.seek(offset)
            self._file.write(data)
            if shared is not None and digest is not None and shared.location == location:
                shared.offsets.setdefault(digest, (offset, len(data)))
        proto.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(len(data)))):
            proto.external_data.add(key=key, value=value)

    def close(self) -> None:
        self._file.close()


def stored_bytes(t: TensorProto) -> int:
    """An initializer's stored bytes, external (its `length`) or inline (raw_data), without reading external data."""
    for entry in t.external_data:
        if entry.key == "length":
            return int(entry.value)
    return len(t.raw_data)
