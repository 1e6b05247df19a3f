"""A fake CUDA and a fake TensorRT for testing the tensorrt backend's bookkeeping on any machine (tinygrad's null
device): the backend's own code runs unchanged, its "engines" are the pack's ONNX graphs run by ONNX Runtime.

    FakeCuda          device memory = host numpy allocations at fake addresses; async copies happen at once;
                      stream capture records each execute as a replayable closure (a CUDA graph)
    fake_tensorrt(pack, max_len)  a module-like object: Logger, Runtime -> FakeEngine -> FakeContext
    fake_plan(role)   the bytes a fake builder writes as an engine (the graph it stands for)

What it checks: names bound, shapes set, addresses (ping-pong KV sets, q rows), what is copied in and out,
and that a replayed capture reads the buffers' contents at replay time, like a CUDA graph. What it cannot:
anything about TensorRT itself (parsing, tactics, precision) or real CUDA.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnxruntime as ort

from specpack.contract.engines import Platform

USER_MANAGED = "USER_MANAGED"  # tensorrt.ExecutionContextAllocationStrategy.USER_MANAGED
PLATFORM = Platform("NVIDIA Fake GPU", "9.0", "10.13.0.35")
ORT_DTYPES = {"tensor(int64)": np.int64, "tensor(float)": np.float32, "tensor(float16)": np.float16}


def fake_plan(graph: str) -> bytes:
    return json.dumps({"fake_engine_for": graph}).encode()


class FakeCuda:
    def __init__(self) -> None:
        self.allocs: dict[int, np.ndarray] = {}  # base address -> uint8 bytes
        self.bases: list[int] = []
        self.next = 1 << 20
        self.capturing: list[Callable[[], None]] | None = None
        self.graphs: dict[int, list[Callable[[], None]]] = {}
        self.launches = 0
        self.copies_in = 0

    def malloc(self, nbytes: int) -> int:
        base = self.next
        self.next += (nbytes + 511) // 256 * 256  # a gap after each allocation: overruns land in no buffer
        self.allocs[base] = np.full(max(nbytes, 1), 0xAB, np.uint8)  # garbage, like cudaMalloc'd memory
        bisect.insort(self.bases, base)
        return base

    def free(self, ptr: int) -> None:
        del self.allocs[ptr]
        self.bases.remove(ptr)

    def view(self, ptr: int, nbytes: int) -> np.ndarray:
        """The bytes [ptr, ptr + nbytes) of one allocation (an error if they leave it)."""
        base = self.bases[bisect.bisect_right(self.bases, ptr) - 1]
        buf = self.allocs[base]
        offset = ptr - base
        if offset < 0 or offset + nbytes > buf.size:
            raise RuntimeError(f"access [{ptr}, {ptr + nbytes}) outside the allocation at {base} ({buf.size} bytes)")
        return buf[offset : offset + nbytes]

    def memset(self, ptr: int, nbytes: int, stream: int) -> None:
        self.view(ptr, nbytes)[:] = 0

    def copy_htod(self, dst: int, src: np.ndarray, stream: int) -> None:
        assert self.capturing is None, "copies stay outside the captured graphs"
        self.copies_in += 1
        self.view(dst, src.nbytes)[:] = np.ascontiguousarray(src).view(np.uint8).reshape(-1)

    def copy_dtoh(self, dst: np.ndarray, src: int, stream: int) -> None:
        dst.view(np.uint8).reshape(-1)[:] = self.view(src, dst.nbytes)

    def stream(self) -> int:
        return 7

    def synchronize(self, stream: int) -> None:
        pass

    def begin_capture(self, stream: int) -> None:
        self.capturing = []

    def end_capture(self, stream: int) -> int:
        handle = len(self.graphs) + 1
        self.graphs[handle], self.capturing = self.capturing or [], None
        return handle

    def launch(self, graph: int, stream: int) -> None:
        self.launches += 1
        for work in self.graphs[graph]:
            work()

    def destroy_graph(self, graph: int) -> None:
        del self.graphs[graph]


class FakeContext:
    """Checks what real CUDA graphs need: once a context is captured its shapes and addresses never change,
    and every context was given the engine's activation memory (USER_MANAGED)."""

    def __init__(self, engine: FakeEngine, strategy: object) -> None:
        assert strategy == USER_MANAGED
        self.engine, self.shapes, self.addresses = engine, dict[str, tuple[int, ...]](), dict[str, int]()
        self.captured, self.memory = False, 0

    def set_device_memory(self, ptr: int, size: int) -> None:
        assert size == self.engine.device_memory_size_v2
        self.engine.cuda.view(ptr, size)  # inside one allocation
        self.memory = ptr

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        assert not self.captured, "a captured context's shapes changed"
        self.shapes[name] = tuple(shape)
        return True

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        assert not self.captured, "a captured context's addresses changed"
        self.addresses[name] = ptr
        return True

    def execute_async_v3(self, stream: int) -> bool:
        assert self.memory, "no device memory given to a USER_MANAGED context"
        work = self._work(dict(self.shapes), dict(self.addresses))  # what is bound now, read when it runs
        if self.engine.cuda.capturing is not None:
            self.captured = True
            self.engine.cuda.capturing.append(work)
        else:
            work()
        return True

    def _work(self, shapes: dict[str, tuple[int, ...]], addresses: dict[str, int]) -> Callable[[], None]:
        e = self.engine

        def run() -> None:
            feeds = {}
            for spec in e.session.get_inputs():
                shape = shapes.get(spec.name) or tuple(d if isinstance(d, int) else e.max_len for d in spec.shape)
                dtype = np.dtype(ORT_DTYPES[spec.type])
                nbytes = int(np.prod(shape)) * dtype.itemsize
                feeds[spec.name] = e.cuda.view(addresses[spec.name], nbytes).view(dtype).reshape(shape).copy()
            for spec, value in zip(e.session.get_outputs(), e.session.run(None, feeds), strict=True):
                data = np.ascontiguousarray(value)
                e.cuda.view(addresses[spec.name], data.nbytes)[:] = data.view(np.uint8).reshape(-1)

        return run


class FakeEngine:
    def __init__(self, cuda: FakeCuda, graph: Path, max_len: int) -> None:
        self.cuda, self.max_len = cuda, max_len
        self.session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        self._names = [v.name for v in (*self.session.get_inputs(), *self.session.get_outputs())]

    @property
    def num_io_tensors(self) -> int:
        return len(self._names)

    def get_tensor_name(self, index: int) -> str:
        return self._names[index]

    device_memory_size_v2 = 4096

    def create_execution_context(self, strategy: object = None) -> FakeContext:
        return FakeContext(self, strategy)


def fake_tensorrt(cuda: FakeCuda, pack: Path, max_len: int) -> Any:
    """What the backend uses of the tensorrt module: Logger(Logger.WARNING), Runtime(logger).deserialize_cuda_engine."""

    class Runtime:
        def __init__(self, logger: object) -> None:
            pass

        def deserialize_cuda_engine(self, plan: bytes) -> FakeEngine | None:
            try:
                graph = json.loads(plan)["fake_engine_for"]
            except (ValueError, KeyError):
                return None
            return FakeEngine(cuda, pack / graph, max_len)

    return SimpleNamespace(Logger=_Logger, Runtime=Runtime,
                           ExecutionContextAllocationStrategy=SimpleNamespace(USER_MANAGED=USER_MANAGED))


class _Logger:
    WARNING = 2

    def __init__(self, severity: int) -> None:
        self.severity = severity
