"""The `tensorrt` backend: the pack's TensorRT engines, device buffers bound once, CUDA graphs per step shape.

Never run on this project's machines (no TensorRT here: docs/tensorrt.md). Its bookkeeping runs in CI over
a fake TensorRT and a fake CUDA that execute the pack's ONNX graphs with ONNX Runtime on host memory
(tests/runtime/fake_trt.py): greedy output equals the target alone through this very code.

    load(path, manifest, options)
      1. TensorRT and libcudart present; this machine's Platform (GPU, compute capability, TensorRT version)
      2. the engine the manifest lists for each model and this platform, or a refusal (contract/engines.py);
         the pack's files, engines included, were hashed before this (runtime/pack.py)
      3. per model: deserialize, one execution context, device buffers allocated once:

    TrtModel (one engine)
      input_ids, position_ids   int64 [1, max_len]       the first S entries hold this run's tokens
      TrtKVCache                                         the KVCache every backend's engines use:
        attention_mask          int64 [1, M]             the static mask: ones at [0, L + S) (changed entries copied)
        kv[2]                   dtype [1, H, M, D] each  ping-pong sets: a run reads set p and writes set 1 - p
                                                         (TensorRT writes an output into its own buffer: no in-place)
      sampling inputs           [1] each                 copied once per request (reset)
      draft:  uniform [1]; probs -> row `row` of q       q [1, k_max, V] fp32: the verify reads it in place
      target: uniforms [1, k_max + 1]; draft_probs -> q (the draft's, or one uploaded from the host: a
              deterministic proposal's one-hot rows; bound unread by a greedy verify)
      outputs                   int64 [1] each           read back after the run: a few integers per step

    A run over S tokens: copy ids, positions, mask changes and uniforms in; replay the CUDA graph captured for
    (S, k, parity, q address), or set shapes and addresses and execute_async_v3; copy the integers out;
    synchronize. Each step with S <= k_max + 1 is captured at its first run, in an execution context of its
    own (a graph fixes its context's shapes and addresses; every context shares one activation buffer, as
    runs are serialized on one stream), after one plain run in that context; prefills run uncaptured in the
    base context. Rollback is a length update (the static form never reads past the mask).

    TrtTarget and TrtDraft are the backend's engines (runtime/engine.py); the verify and draft policy above them
    (the pad row of a greedy single step, one-hot q, rollback, the draft opened once) is runtime/target.py's,
    the same for every backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from specpack import names
from specpack.contract.engines import check_buildable, select_engine
from specpack.contract.manifest import EngineEntry, Manifest, ModelEntry
from specpack.dtypes import GRAPH_DTYPES
from specpack.errors import SpecpackError
from specpack.runtime.backend import BackendOptions
from specpack.runtime.engine import TreeResult, VerifyRun, tree_refusal
from specpack.runtime.state import DecodeState, VerifyResult
from specpack.runtime.static_kv_cache import StaticLengthCache
from specpack.runtime.target import EngineBackend, refuse_cpu_only

if TYPE_CHECKING:
    import tensorrt as trt

    from specpack.contract.engines import Platform
    from specpack.runtime.cuda_rt import Cuda

GraphKey = tuple[int, int, int, int]  # (S, k, parity, q address): what a captured CUDA graph is valid for


def load(path: Path, manifest: Manifest, options: BackendOptions) -> TrtBackend:
    from specpack.runtime.cuda_rt import Cuda
    from specpack.runtime.trt_env import current_platform, require_tensorrt

    require_tensorrt()
    import tensorrt as trt

    cuda = Cuda.load()
    return TrtBackend(path, manifest, options, cuda, current_platform(cuda), trt_module=trt)


class TrtKVCache(StaticLengthCache):
    """The KVCache (runtime/kv_cache.py) of one engine: ping-pong device sets [1, H, M, D] and the static mask.

    A run reads set `parity` and writes set 1 - parity (TensorRT writes an output into its own buffer, never onto
    an input); `advance` makes the written set the past. The mask [M] int64 lives on the device with a host mirror;
    only the entries between the old and the new end are copied. Addresses are device pointers (ints)."""

    def __init__(self, cuda: Cuda, stream: int, num_layers: int, kv_bytes: int, max_len: int) -> None:
        self.cuda, self.stream = cuda, stream
        self.kv = [[cuda.malloc(kv_bytes) for _ in range(2 * num_layers)] for _ in range(2)]  # [parity][tensor]
        for ptr in (*self.kv[0], *self.kv[1]):  # cudaMalloc'd memory is garbage: rows never written stay finite
            cuda.memset(ptr, kv_bytes, stream)
        self.mask_ptr = cuda.malloc(max_len * 8)  # int64 [1, M]
        cuda.memset(self.mask_ptr, max_len * 8, stream)  # the mirror's zeros; ones are copied in
        past, present = names.kv_names(num_layers, "past"), names.kv_names(num_layers, "present")
        # per parity: what a run reads and what it writes
        self._reads = [{names.ATTENTION_MASK: self.mask_ptr, **dict(zip(past, self.kv[p], strict=True))} for p in (0, 1)]
        self._writes = [dict(zip(present, self.kv[1 - p], strict=True)) for p in (0, 1)]
        self.parity = 0
        super().__init__(max_len, self._reads[0], self._writes[0], np.zeros((1, max_len), np.int64))

    def bind_inputs(self, n_new: int) -> dict[str, Any]:
        super().bind_inputs(n_new)  # the mask's ones at [0, length + n_new), the fit checked
        return self._reads[self.parity]

    def bind_outputs(self, n_new: int) -> dict[str, Any]:
        return self._writes[self.parity]

    def advance(self, n_new: int) -> None:
        super().advance(n_new)
        self.parity = 1 - self.parity  # the present set holds the cache now

    def _mask_changed(self, low: int, high: int) -> None:
        self.cuda.copy_htod(self.mask_ptr + low * 8, self._mask_host[0, low:high], self.stream)

    def close(self) -> None:
        for ptr in (*self.kv[0], *self.kv[1], self.mask_ptr):
            self.cuda.free(ptr)


class TrtModel:
    """One engine and its buffers; `run` executes it over the next S tokens of a request."""

    def __init__(self, backend: TrtBackend, entry: ModelEntry, engine: EngineEntry, extra_inputs: dict[str, tuple[int, ...]],
                 outputs: list[str]) -> None:
        m, cuda, self.cuda, self.stream = backend.manifest, backend.cuda, backend.cuda, backend.stream
        self.backend, self.k_max, self.vocab = backend, m.k_max, m.vocab_size
        if backend.options.verified_reads:  # a pinned load: the bytes deserialized are the bytes hashed
            from specpack.contract.verified_read import read_verified

            plan = read_verified(backend.path, m.file_entry(engine.path))
        else:
            plan = (backend.path / engine.path).read_bytes()  # hashed with the pack's files before the backend opened
        loaded: trt.ICudaEngine | None = backend.runtime.deserialize_cuda_engine(plan)
        if loaded is None:
            raise SpecpackError(f"TensorRT could not load {engine.path}", expected=f"an engine for {backend.platform}",
                                found="deserialize_cuda_engine returned None",
                                hint="rebuild: specpack build PACK --backend tensorrt")
        self.engine: trt.ICudaEngine = loaded
        self.trt = backend.trt
        self.scratch_bytes = self.engine.device_memory_size_v2  # activations: one buffer every context shares
        self.scratch = cuda.malloc(self.scratch_bytes)         # (runs are serialized on one stream)
        self.context = self._new_context()                     # uncaptured runs (prefills)
        self._check_io(entry, engine)
        kv_bytes = entry.kv_heads * m.max_len * entry.head_dim * np.dtype(GRAPH_DTYPES[entry.dtype].storage).itemsize
        self.kv_cache = TrtKVCache(cuda, self.stream, entry.num_layers, kv_bytes, m.max_len)
        self.buf = {name: cuda.malloc(int(np.prod(shape)) * 8) for name, shape in {  # 8 bytes: int64 / up to fp64
            names.INPUT_IDS: (m.max_len,), names.POSITION_IDS: (m.max_len,),
            names.TEMPERATURE: (1,), names.TOP_K: (1,), names.TOP_P: (1,), **extra_inputs,
            **{out: (1,) for out in outputs}}.items()}
        self.host_out = {out: np.zeros(1, np.int64) for out in outputs}  # [1] each
        self.positions = np.arange(m.max_len, dtype=np.int64)  # [M] positions [L, L + S) are a view
        self.graphs: dict[GraphKey, int] = {}  # captured step -> its executable CUDA graph
        self.contexts: dict[GraphKey, trt.IExecutionContext] = {}  # captured step -> its own context, bound once
        self.use_graphs = backend.cuda_graphs

    def _check_io(self, entry: ModelEntry, engine: EngineEntry) -> None:
        """The engine's tensors are the graph's (the manifest's I/O): bound by name, never by position."""
        have = {self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)}
        want = {s.name for s in (*entry.graph.inputs, *entry.graph.outputs)}
        if have != want:
            raise SpecpackError(f"{engine.path} does not have its graph's inputs and outputs",
                                expected=f"{len(want)} tensors named as in the manifest",
                                found=f"missing {sorted(want - have)[:5]}, unexpected {sorted(have - want)[:5]}",
                                hint="rebuild the engines from this pack: specpack build PACK --backend tensorrt")

    def cache(self, slot: int) -> TrtKVCache:
        return self.kv_cache

    def reset(self, state: DecodeState) -> None:
        self.kv_cache.reset()
        for name, value in state.sampling_inputs.items():  # [1] each: constant for the request
            self.cuda.copy_htod(self.buf[name], value, self.stream)

    def run(self, state: DecodeState, end: int, inputs: dict[str, np.ndarray], addresses: dict[str, int],
            shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
        """Run over state.ids[length:end]; `inputs` host arrays copied into this model's buffers of those names,
        `addresses` extra tensor addresses (q), `shapes` extra dynamic shapes. The outputs' integers come back."""
        cuda, stream, cache = self.cuda, self.stream, self.kv_cache
        start = cache.length
        s = end - start
        kv = {**cache.bind_inputs(s), **cache.bind_outputs(s)}  # checks the fit; copies the mask's changes
        cuda.copy_htod(self.buf[names.INPUT_IDS], state.ids[start:end], stream)          # [S]
        cuda.copy_htod(self.buf[names.POSITION_IDS], self.positions[start:end], stream)  # [S]
        for name, value in inputs.items():
            cuda.copy_htod(self.buf[name], value, stream)
        q_address = next(iter(addresses.values()), 0)
        key = (s, shapes.get(names.DRAFT_PROBS, (0, 0))[1], cache.parity, q_address)
        graph = self.graphs.get(key)
        if graph is not None:
            cuda.launch(graph, stream)  # the step's context: its shapes and addresses were set when it was captured
        elif self.use_graphs and s <= self.k_max + 1:
            self._capture(key, s, {**addresses, **kv}, shapes)
        else:
            self._bind(self.context, s, {**addresses, **kv}, shapes)
            self._execute(self.context)
        for name, host in self.host_out.items():
            cuda.copy_dtoh(host, self.buf[name], stream)
        cuda.synchronize(stream)
        cache.advance(s)
        return self.host_out

    def _new_context(self) -> trt.IExecutionContext:
        ctx = self.engine.create_execution_context(self.trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        ctx.set_device_memory(self.scratch, self.scratch_bytes)
        return ctx

    def _bind(self, ctx: trt.IExecutionContext, s: int, addresses: dict[str, int],
              shapes: dict[str, tuple[int, ...]]) -> None:
        """`addresses`: q's and the cache's (past, present, mask); this model's own buffers are added here."""
        for name in (names.INPUT_IDS, names.POSITION_IDS):
            ctx.set_input_shape(name, (1, s))
        for name, shape in shapes.items():
            ctx.set_input_shape(name, shape)
        for name, ptr in {**self.buf, **addresses}.items():
            ctx.set_tensor_address(name, ptr)

    def _execute(self, ctx: trt.IExecutionContext) -> None:
        if not ctx.execute_async_v3(self.stream):
            raise RuntimeError("TensorRT execute_async_v3 failed (see TensorRT's log)")

    def _capture(self, key: GraphKey, s: int, addresses: dict[str, int], shapes: dict[str, tuple[int, ...]]) -> None:
        """A step's first run: a context of its own (shapes and addresses set once, as a CUDA graph fixes them),
        one plain run (this step's results; it also flushes TensorRT's deferred shape work), then the capture."""
        ctx = self.contexts[key] = self._new_context()
        self._bind(ctx, s, addresses, shapes)
        self._execute(ctx)
        try:
            self.cuda.begin_capture(self.stream)
            try:
                self._execute(ctx)
            finally:
                self.graphs[key] = self.cuda.end_capture(self.stream)
        except RuntimeError:  # e.g. a layer that synchronizes with the host: this engine runs without graphs
            self.use_graphs = False
            self.graphs.pop(key, None)

    def close(self) -> None:
        for graph in self.graphs.values():
            self.cuda.destroy_graph(graph)
        self.kv_cache.close()
        for ptr in (*self.buf.values(), self.scratch):
            self.cuda.free(ptr)
        self.graphs.clear()
        self.contexts.clear()


class TrtDraft(TrtModel):
    """The DraftEngine of the draft_step engine: S tokens in, one drawn token out; its q row written straight into
    the q buffer."""

    def __init__(self, backend: TrtBackend, engine: EngineEntry) -> None:
        m = backend.manifest
        super().__init__(backend, m.draft, engine, {names.UNIFORM: (1,)}, [names.TOKEN])
        self.q_ptr = backend.cuda.malloc(m.k_max * m.vocab_size * 4)  # fp32 [1, k_max, V]
        self.row_bytes = m.vocab_size * 4

    def step(self, state: DecodeState, end: int, row: int) -> int:
        out = self.run(state, end, {names.UNIFORM: state.uniforms.draft[row : row + 1]},  # [1]
                       {names.PROBS: self.q_ptr + row * self.row_bytes}, {})                   # q[:, row]: [1, V]
        return int(out[names.TOKEN][0])

    def q(self, state: DecodeState, k: int) -> int:
        """The device address of q [1, k, V] (rows [0, k) of the buffer): only this backend's target reads it."""
        return self.q_ptr

    def close(self) -> None:
        super().close()
        self.cuda.free(self.q_ptr)


class TrtTarget(TrtModel):
    """The VerifyEngine of the verify engine: the drafts and their q (the draft's device buffer, or an uploaded one)
    in, n accepted and the next token out."""

    def __init__(self, backend: TrtBackend, engine: EngineEntry) -> None:
        m = backend.manifest
        super().__init__(backend, m.target, engine, {names.UNIFORMS: (m.k_max + 1,)},
                         [names.N_ACCEPTED, names.NEXT_TOKEN])
        self.host_q = backend.cuda.malloc(m.k_max * m.vocab_size * 4)  # fp32 [1, k_max, V]: q uploaded from the host
        backend.cuda.memset(self.host_q, m.k_max * m.vocab_size * 4, backend.stream)  # (and bound where q is unread)

    def verify(self, run: VerifyRun) -> VerifyResult:
        state, k = run.state, run.k
        q = self.host_q if run.q is None else int(run.q)
        out = self.run(state, state.length + k, {names.UNIFORMS: state.uniforms.verify[0, : k + 1]},  # [k+1]
                       {names.DRAFT_PROBS: q}, {names.DRAFT_PROBS: (1, k, self.vocab), names.UNIFORMS: (1, k + 1)})
        return VerifyResult(int(out[names.N_ACCEPTED][0]), int(out[names.NEXT_TOKEN][0]))

    def verify_tree(self, run: VerifyRun) -> TreeResult:
        raise tree_refusal(self.__class__.__name__)

    def upload_q(self, slot: int, host_q: np.ndarray, k: int) -> int:
        self.cuda.copy_htod(self.host_q, host_q[0, :k], self.stream)  # rows [0, k): [k, V]
        return self.host_q

    def close(self) -> None:
        super().close()
        self.cuda.free(self.host_q)


class TrtBackend(EngineBackend[TrtTarget, TrtDraft]):
    """Both engines on TensorRT; the draft's engine opens on first use."""

    name = "tensorrt"

    def __init__(self, path: Path, manifest: Manifest, options: BackendOptions, cuda: Cuda, platform: Platform,
                 trt_module: Any, *, cuda_graphs: bool = True) -> None:
        if options.slots != 1:
            raise SpecpackError("the tensorrt backend serves one request at a time", expected="slots 1",
                                found=f"slots {options.slots}")
        refuse_cpu_only(manifest, "tensorrt")
        check_buildable(manifest)
        self.engines = {role: select_engine(manifest, role, platform) for role, _ in manifest.models()}  # refuse early
        self.path, self.manifest, self.cuda, self.platform, self.cuda_graphs = path, manifest, cuda, platform, cuda_graphs
        self.options = options
        self.trt = trt_module
        self.logger: trt.ILogger = trt_module.Logger(trt_module.Logger.WARNING)
        self.runtime: trt.Runtime = trt_module.Runtime(self.logger)
        self.stream = cuda.stream()
        super().__init__(TrtTarget(self, self.engines["target"]),
                         self._open_draft if manifest.draft_model is not None else None, k_max=manifest.k_max,
                         vocab_size=manifest.vocab_size, pad_single_steps=options.pad_single_steps)

    def _open_draft(self) -> TrtDraft:
        return TrtDraft(self, self.engines["draft"])
