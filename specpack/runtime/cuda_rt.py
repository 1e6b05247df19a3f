"""The few CUDA runtime calls the TensorRT backend needs, through ctypes on libcudart (no extra package).

Polygraphy does the same (polygraphy/cuda/cuda.py): TensorRT's Python API takes device pointers and stream
handles as plain ints, so memory, copies, streams and CUDA graphs are a dozen C functions:

    Cuda.load()                       libcudart, or a SpecpackError saying it is missing
    malloc / free                     device buffers (ints)
    copy_htod / copy_dtoh / memset    async on a stream, from / to numpy arrays (pinned by the caller or not)
    stream / synchronize
    begin_capture / end_capture / launch   CUDA graphs of a stream's work (cudaStreamCaptureModeThreadLocal)
    device_name / compute_capability

Never run here (no GPU on the development machine); written to the CUDA runtime API (cuda_runtime_api.h).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
from typing import Any

import numpy as np

from specpack.errors import SpecpackError

H2D, D2H = 1, 2                    # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost
CAPTURE_THREAD_LOCAL = 1           # cudaStreamCaptureModeThreadLocal
ATTR_CC_MAJOR, ATTR_CC_MINOR = 75, 76  # cudaDevAttrComputeCapabilityMajor / Minor
PROP_BYTES = 4096                  # cudaDeviceProp is ~1 KB in CUDA 12; `name` (char[256]) is its first field
_SEARCH = ("/usr/local/cuda/lib64/libcudart.so*", "/usr/local/cuda/targets/*/lib/libcudart.so*",
           "/usr/lib/*/libcudart.so*")


class Cuda:
    """libcudart's functions; every call checks its cudaError_t."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib

    @classmethod
    def load(cls) -> Cuda:
        candidates = [ctypes.util.find_library("cudart"), *sorted(p for pat in _SEARCH for p in glob.glob(pat))]
        for name in filter(None, candidates):
            try:
                return cls(ctypes.CDLL(name))
            except OSError:
                continue
        raise SpecpackError("the CUDA runtime library (libcudart) was not found", expected="libcudart.so from a CUDA "
                            "toolkit or JetPack", found="none on the library path or under /usr/local/cuda",
                            hint="install the CUDA runtime (JetPack on a Jetson), or add its folder to LD_LIBRARY_PATH")

    def _check(self, status: int, call: str) -> None:
        if status != 0:
            self.lib.cudaGetErrorString.restype = ctypes.c_char_p
            text = self.lib.cudaGetErrorString(status).decode(errors="replace")
            raise RuntimeError(f"{call} failed: cudaError {status} ({text})")

    def malloc(self, nbytes: int) -> int:
        ptr = ctypes.c_void_p()
        self._check(self.lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(max(nbytes, 1))), "cudaMalloc")
        return int(ptr.value or 0)

    def free(self, ptr: int) -> None:
        self._check(self.lib.cudaFree(ctypes.c_void_p(ptr)), "cudaFree")

    def memset(self, ptr: int, nbytes: int, stream: int) -> None:
        self._check(self.lib.cudaMemsetAsync(ctypes.c_void_p(ptr), 0, ctypes.c_size_t(nbytes), ctypes.c_void_p(stream)),
                    "cudaMemsetAsync")

    def copy_htod(self, dst: int, src: np.ndarray, stream: int) -> None:
        """src must stay alive (and unchanged) until the stream reaches the copy: callers sync before reuse."""
        self._copy(dst, src.ctypes.data, src.nbytes, H2D, stream)

    def copy_dtoh(self, dst: np.ndarray, src: int, stream: int) -> None:
        self._copy(dst.ctypes.data, src, dst.nbytes, D2H, stream)

    def _copy(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        self._check(self.lib.cudaMemcpyAsync(ctypes.c_void_p(dst), ctypes.c_void_p(src), ctypes.c_size_t(nbytes),
                                             kind, ctypes.c_void_p(stream)), "cudaMemcpyAsync")

    def stream(self) -> int:
        handle = ctypes.c_void_p()
        self._check(self.lib.cudaStreamCreate(ctypes.byref(handle)), "cudaStreamCreate")
        return int(handle.value or 0)

    def synchronize(self, stream: int) -> None:
        self._check(self.lib.cudaStreamSynchronize(ctypes.c_void_p(stream)), "cudaStreamSynchronize")

    def begin_capture(self, stream: int) -> None:
        self._check(self.lib.cudaStreamBeginCapture(ctypes.c_void_p(stream), CAPTURE_THREAD_LOCAL),
                    "cudaStreamBeginCapture")

    def end_capture(self, stream: int) -> int:
        """End the capture and instantiate it: the executable graph's handle."""
        graph, exe = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(self.lib.cudaStreamEndCapture(ctypes.c_void_p(stream), ctypes.byref(graph)), "cudaStreamEndCapture")
        self._check(self.lib.cudaGraphInstantiate(ctypes.byref(exe), graph, ctypes.c_ulonglong(0)), "cudaGraphInstantiate")
        self._check(self.lib.cudaGraphDestroy(graph), "cudaGraphDestroy")
        return int(exe.value or 0)

    def launch(self, graph_exec: int, stream: int) -> None:
        self._check(self.lib.cudaGraphLaunch(ctypes.c_void_p(graph_exec), ctypes.c_void_p(stream)), "cudaGraphLaunch")

    def destroy_graph(self, graph_exec: int) -> None:
        self._check(self.lib.cudaGraphExecDestroy(ctypes.c_void_p(graph_exec)), "cudaGraphExecDestroy")

    def device(self) -> int:
        device = ctypes.c_int()
        self._check(self.lib.cudaGetDevice(ctypes.byref(device)), "cudaGetDevice")
        return device.value

    def device_name(self) -> str:
        props = ctypes.create_string_buffer(PROP_BYTES)
        fn = getattr(self.lib, "cudaGetDeviceProperties_v2", None) or self.lib.cudaGetDeviceProperties
        self._check(fn(props, self.device()), "cudaGetDeviceProperties")
        return props.raw[:256].split(b"\0", 1)[0].decode(errors="replace")

    def compute_capability(self) -> str:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.cudaDeviceGetAttribute(ctypes.byref(major), ATTR_CC_MAJOR, self.device()), "cudaDeviceGetAttribute")
        self._check(self.lib.cudaDeviceGetAttribute(ctypes.byref(minor), ATTR_CC_MINOR, self.device()), "cudaDeviceGetAttribute")
        return f"{major.value}.{minor.value}"
