"""The `cuda` backend: ONNX Runtime's CUDA EP with every buffer on the device (docs/cuda_backend.md).

    CudaBackend
      DeviceTarget  the VerifyEngine of verify.onnx: per slot a DeviceStaticKVCache, n_accepted / next_token [1],
                    q scratch; for a tree verify graph parents [1, T] per T, path [1, T_max + 1] and kv_compact.onnx
                    (the accepted rows moved on the device, one binding per (slot, T): docs/trees.md)
      DeviceDraft   the DraftEngine of draft_step.onnx (opened on first use); per slot a cache, q [1, k_max, V],
                    token [1]; a tree pack's draft model in its tree form also runs token trees' rows (tree_step,
                    its device buffers in cuda_draft_tree.py)
      DeviceHead    the DraftEngine of a static head_step.onnx (backends/cuda_head.py), over the target's features
                    cache: a head pack's verify writes its features in place, like its KV cache
    The verify and draft policy above them (pad rows, one-hot q, rollback) is runtime/target.py's.

Everything a graph reads or writes lives on the device and is bound by pointer (IOBinding): the static KV
cache (written in place), input_ids / position_ids staging buffers (one pair per S for S <= k_max + 1, one
[1, max_len] pair for longer prefills), the static mask, the sampling inputs, the uniforms, q and the
outputs. The draft step writes q straight into the rows the verify reads. Per step the host uploads the S
new ids, their positions and the mask (a few KB), and reads back one token per draft step and n_accepted /
next_token per verify, never logits.

Three forms of each graph, one session each (opened on first use but the greedy form):
    greedy     the head's If inlined as its greedy branch (graphs/greedy_form.py): no control flow, so with
               `enable_cuda_graph` ONNX Runtime captures one CUDA graph per run shape (gpu_graph_id per
               (slot, S, k)) and replays it: fixed shapes, fixed addresses. A run over more than k_max + 1
               tokens (a prefill, or the draft catching up after k = 0 steps) runs as captured chunks: of
               LONG_CHUNK tokens while more than that are left, then of k_max + 1 and the rest, so two chunk
               shapes serve every length: no graph per prompt length. Opened at load.
    plain      for sampling requests that filter nothing (temperature only: top_k 0 or >= V, top_p 1), the head's
               If inlined as its sampling branch and the transform's filter If as its unfiltered branch
               (graphs/sampling_form.py): no control flow, captured like the greedy form (a draft run per q row, a
               verify per (k, q buffer); runs over more than k_max + 1 tokens uncaptured); opened on the first such
               request (chain graphs of the draft model and the target; a graph it does not fit, e.g. the tensorrt
               form's, keeps its sampling requests on the next)
    sampling   the graph as exported (the If chooses greedy or sampling; not capturable), opened on the first
               sampling request that filters (top-k, top-p), or every sampling request where the plain form is not
               offered: each form opened holds the model's weights once more on the device.
A request's mode (SamplingParams: greedy, plain sampling or sampling) picks the session at reset. Needs a pack exported with
`--kv-cache static`: fp16, or fp32 in the standard attention form. `device="cpu"` runs the same code on
the CPU EP (tests, no capture).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from specpack import names
from specpack.contract.manifest import GraphEntry, HeadEntry, Manifest, ModelEntry
from specpack.errors import SpecpackError
from specpack.limits import numpy_dtype
from specpack.runtime.backend import BackendOptions
from specpack.runtime.device_buffers import DeviceArray, DeviceStaticKVCache, DeviceView, bind
from specpack.runtime.engine import HeadTreeRun, TopRows, TreeResult, VerifyRun, feature_buffer_shape, tree_refusal
from specpack.runtime.graph_check import check_graph_matches
from specpack.runtime.ort_session import EXTERNAL_DATA_FOLDER
from specpack.runtime.state import DecodeState, VerifyResult
from specpack.runtime.target import EngineBackend, refuse_cpu_only

if TYPE_CHECKING:
    from specpack.runtime.backends.cpu_batched import BatchedEngines
    from specpack.runtime.backends.cuda_head import DeviceHead
    from specpack.runtime.batched_draft import BatchedGreedyDrafter
    from specpack.runtime.batched_target import BatchedRuns

PROVIDER = "CUDAExecutionProvider"
SKIP_CAPTURE = -1  # gpu_graph_id of an uncaptured run
# ONNX Runtime runs a new gpu_graph_id once as a plain run (its allocations), captures it on the next run and replays
# it from then on: a shape's first CAPTURE_RUNS runs cost several replays each (warm-up runs, WarmupRuns). Its CUDA EP
# keeps the captured graphs per thread (PerThreadContext): a shape captured on one thread (the load's precapture, on the
# caller's) is run plainly and captured again on another (the batcher's), so runs are counted per thread
CAPTURE_RUNS = 2


class WarmupRuns:
    """The backend's count of warm-up runs so far, in every session it opened (CudaBackend.warmup_runs): one shared
    counter, so reading it per step allocates nothing."""

    def __init__(self) -> None:
        self.count = 0
# A greedy run over more than k_max + 1 tokens goes as captured chunks of LONG_CHUNK tokens, then of k_max + 1.
# Measured on an H200 (bench/README.md, "Drafters on the GPU"): an uncaptured run over 82 tokens took about 50 ms,
# a captured chunk of k_max + 1 = 9 tokens 1.3 ms (the 0.5B draft) to 2.2 ms (the 1.5B target): a catch-up after
# 64 k = 0 steps in 9-token chunks cost the draft about 6 target steps, which kept adaptive k below plain decoding.
LONG_CHUNK = 32


def load(path: Path, manifest: Manifest, options: BackendOptions) -> CudaBackend:
    import onnxruntime as ort

    available = ort.get_available_providers()
    if PROVIDER not in available:
        raise SpecpackError("the cuda device needs ONNX Runtime's CUDA execution provider",
                            expected=f"{PROVIDER} in onnxruntime.get_available_providers()",
                            found=f"onnxruntime {ort.__version__} with {', '.join(available)}",
                            hint="install onnxruntime-gpu (instead of onnxruntime) on a machine with an NVIDIA GPU, "
                                 "or use --device cpu")
    return CudaBackend(path, manifest, options)


class DeviceSession:
    """One ONNX Runtime session over one form of a graph, run through IOBindings, with CUDA graph ids."""

    def __init__(self, model: Path | bytes, folder: Path, entry: ModelEntry | HeadEntry, device: str, capture: bool,
                 threads: int | None, external: dict[str, bytes] | None = None,
                 warmups: WarmupRuns | None = None) -> None:
        """external: verified bytes of the external data files (a pinned load; then `folder` is never read); warmups:
        the backend's counter of warm-up runs (each captured shape's first CAPTURE_RUNS runs)."""
        import onnxruntime as ort

        self._external, self.entry_name = external, entry.graph.path
        self._ort = ort
        self.error: str | None = None  # why capture was refused, if it was
        self.capture = capture
        self.tf32 = entry.dtype != "fp32"  # fp32 graphs: no TF32 matmuls (use_tf32 = 0)
        try:
            self.session = self._open(model, folder, device, capture, threads)
        except Exception as err:  # onnxruntime raises its own types; e.g. nodes left on the CPU (memcpy)
            if not capture:
                raise SpecpackError(f"ONNX Runtime could not load {entry.graph.path} on {device}",
                                    expected="a valid ONNX graph", found=str(err).splitlines()[0]) from err
            self.error, self.capture = str(err).splitlines()[0], False
            self.session = self._open(model, folder, device, False, threads)
        self._external = None  # ONNX Runtime copied the weights: the verified bytes are not held twice
        check_graph_matches(entry.graph, self.session, entry.graph.path)
        # what the graph takes, as the manifest declares it (checked above against the session): e.g. no
        # position_ids for a graph whose positions are "internal" (the builder's rotary inside its attention)
        self.input_names = {spec.name for spec in entry.graph.inputs}
        self._graph_ids: dict[tuple[Any, ...], int] = {}
        self._run_options: dict[int, Any] = {}
        self._local = threading.local()  # .runs: graph id -> its runs on this thread, up to CAPTURE_RUNS
        self._warmups = warmups if warmups is not None else WarmupRuns()

    def _open(self, model: Path | bytes, folder: Path, device: str, capture: bool, threads: int | None) -> Any:
        from specpack.runtime.ort_session import session_options

        opts = session_options(threads)
        providers: list[Any] = ["CPUExecutionProvider"]
        if device == "cuda":
            cuda_options = {"enable_cuda_graph": "1" if capture else "0"}
            if not self.tf32:
                cuda_options["use_tf32"] = "0"
            providers.insert(0, (PROVIDER, cuda_options))
        if self._external is not None and isinstance(model, bytes):  # verified bytes: nothing read from disk
            from specpack.contract.verified_read import GraphBytes
            from specpack.runtime.ort_session import open_session

            return open_session(GraphBytes(self.entry_name, model, self._external), opts, providers)
        opts.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(folder))
        source = str(model) if isinstance(model, Path) else model
        return self._ort.InferenceSession(source, sess_options=opts, providers=providers)

    def run(self, binding: Any, key: tuple[Any, ...] | None) -> None:
        """Run; `key` names a fixed-shape, fixed-address run (captured once, then replayed), None one that is not."""
        graph_id = SKIP_CAPTURE
        if self.capture and key is not None:
            graph_id = self._graph_ids.setdefault(key, len(self._graph_ids))
            runs = getattr(self._local, "runs", None)
            if runs is None:
                runs = self._local.runs = {}
            done = runs.get(graph_id, 0)
            if done < CAPTURE_RUNS:  # a warm-up run on this thread (counted once past: nothing allocated per step)
                runs[graph_id] = done + 1
                self._warmups.count += 1
        options = self._run_options.get(graph_id)
        if options is None:
            options = self._run_options[graph_id] = self._ort.RunOptions()
            options.add_run_config_entry("gpu_graph_id", str(graph_id))
        self.session.run_with_iobinding(binding, options)

    @property
    def graphs_captured(self) -> int:
        return len(self._graph_ids) if self.capture else 0


@dataclass
class SlotBase:
    """What every engine keeps per request slot: its cache, its request's sampling inputs and mode, and the bindings of
    its run shapes (bound once)."""

    cache: DeviceStaticKVCache
    sampling: dict[str, DeviceArray]                                    # temperature, top_k, top_p [1] each
    bindings: dict[tuple[Any, ...], Any] = field(default_factory=dict)  # run shape -> IOBinding, bound once
    greedy: bool = True
    plain: bool = False                      # sampling on the plain form (graphs/sampling_form.py): captured runs

    @property
    def fixed(self) -> bool:
        """Whether the request's runs are bound once per run shape and captured (the greedy and the plain form)."""
        return self.greedy or self.plain

    @staticmethod
    def sampling_buffers(device: str) -> dict[str, DeviceArray]:
        return {names.TEMPERATURE: DeviceArray((1,), np.float32, device),
                names.TOP_K: DeviceArray((1,), np.int64, device), names.TOP_P: DeviceArray((1,), np.float32, device)}


@dataclass
class _Slot(SlotBase):
    """One request slot of a model: SlotBase and the staging buffers of its input ids and positions."""

    ids: dict[int, DeviceArray] = field(default_factory=dict)     # S -> input_ids [1, S] (S <= k_max + 1)
    positions: dict[int, DeviceArray] = field(default_factory=dict)  # S -> position_ids [1, S]


SlotT = TypeVar("SlotT", bound=SlotBase)


class SlotSessions(Generic[SlotT]):
    """An engine's sessions (greedy form, plain sampling form, sampling form: each opened on first use) and its
    slots; a request's mode picks the session at reset."""

    slots: list[SlotT]
    plain_form = False  # whether this engine runs plain sampling requests on the plain form (its _run binds them once)

    def __init__(self, backend: CudaBackend, entry: ModelEntry | HeadEntry) -> None:
        self.backend, self.entry, self.device = backend, entry, backend.device
        self._sessions: dict[bool | str, DeviceSession] = {}  # True: greedy form, "plain", False: as exported
        self._lock = threading.Lock()
        self.plain_error: str | None = None  # why this graph has no plain form (its sampling requests: exported)

    def session(self, greedy: bool, plain: bool = False) -> DeviceSession:
        """The greedy form (captured graphs), the plain sampling form (captured) or the graph as exported (sampling),
        opened on first use."""
        key: bool | str = "plain" if plain and not greedy else greedy
        if key not in self._sessions:
            with self._lock:
                if key not in self._sessions:
                    self._sessions[key] = self._open(key)
        return self._sessions[key]

    def _open(self, key: bool | str) -> DeviceSession:
        if key == "plain":
            from specpack.graphs.sampling_form import plain_sampling_form

            return self.backend.open_session(self.entry, True, greedy_form_of=plain_sampling_form)
        return self.backend.open_session(self.entry, bool(key))

    def reset(self, state: DecodeState) -> None:
        slot = self.slots[state.slot]
        slot.cache.reset()
        params = state.params
        slot.greedy = params.greedy
        slot.plain = (self.plain_form and self.plain_error is None and not params.greedy
                      and not params.filters(self.backend.manifest.vocab_size))
        for name, array in state.sampling_inputs.items():  # [1] each, once per request
            slot.sampling[name].write(array)
        if slot.plain:
            try:
                self.session(False, plain=True)
            except ValueError as err:  # graphs/sampling_form.py: this graph has no plain form
                self.plain_error, slot.plain = str(err), False
        self.session(slot.greedy, slot.plain)

    def cache(self, slot: int) -> DeviceStaticKVCache:
        return self.slots[slot].cache

    def close(self) -> None:
        for slot in self.slots:
            slot.bindings.clear()
        self._sessions.clear()


class _DeviceModel(SlotSessions[_Slot]):
    """What both models share: per slot a device cache and staging buffers; bind once per run shape, run."""

    entry: ModelEntry

    def __init__(self, backend: CudaBackend, entry: ModelEntry) -> None:
        super().__init__(backend, entry)
        m = backend.manifest
        # runs over at most this many tokens have a buffer (and a graph) per S: k_max + 1, or a tree's T_max + 1
        self.short_max = backend.drafts_max + 1
        self.vocab = m.vocab_size
        self.slots = [self._slot() for _ in range(backend.options.slots)]
        self._long_host = np.zeros((2, 1, m.max_len), np.int64)  # [ids | positions, 1, max_len]: long prefills
        self._long = [DeviceArray((1, m.max_len), np.int64, self.device) for _ in range(2)]

    def _slot(self) -> _Slot:
        e, m = self.entry, self.backend.manifest
        cache = DeviceStaticKVCache(e.num_layers, e.kv_heads, e.head_dim, m.max_len, numpy_dtype(e.dtype), self.device)
        return _Slot(cache, SlotBase.sampling_buffers(self.device))

    def _staging(self, slot: _Slot, n: int) -> tuple[DeviceArray, DeviceArray]:
        if n not in slot.ids:
            slot.ids[n] = DeviceArray((1, n), np.int64, self.device)
            slot.positions[n] = DeviceArray((1, n), np.int64, self.device)
        return slot.ids[n], slot.positions[n]

    def _run(self, state: DecodeState, end: int, key: tuple[int | str, ...], inputs: dict[str, DeviceView],
             outputs: dict[str, DeviceView], chunks: bool = True) -> None:
        """Run over state.ids[cached:end]. `inputs` / `outputs`: the head's buffers, at fixed addresses for a
        greedy run (bound once per run shape), rebound every run when sampling. chunks: a long run may go as
        chunks (not a tree's: each chunk would take the last T rows for the nodes)."""
        slot = self.slots[state.slot]
        cache, session = slot.cache, self.session(slot.greedy, slot.plain)
        chunked = self.backend.chunked_runs and slot.greedy and chunks
        if chunked:
            # captured chunks; each one's head outputs are overwritten by the next, the cache keeps every token
            while end - cache.length > self.short_max and end - cache.length != LONG_CHUNK:
                left = end - cache.length
                self._run(state, cache.length + (LONG_CHUNK if left > LONG_CHUNK else self.short_max), key, inputs,
                          outputs)
        start = cache.length
        n = end - start
        kv_inputs = cache.bind_inputs(n)  # uploads the mask when the length changed
        if n <= self.short_max or (chunked and n == LONG_CHUNK):
            ids, positions = self._staging(slot, n)
            ids.write(state.ids[None, start:end])                          # [1, S]
            positions.write(self.backend.positions[:, start:end])          # [1, S]
            bkey = (slot.greedy, slot.plain, n, *key)
            binding = slot.bindings.get(bkey)
            if binding is None:
                binding = slot.bindings[bkey] = session.session.io_binding()
                bind(binding, self.device, {names.INPUT_IDS: ids.view(), names.POSITION_IDS: positions.view(),
                                            **kv_inputs, **{k: v.view() for k, v in slot.sampling.items()}},
                     cache.bind_outputs(n), session.input_names)
                bind(binding, self.device, inputs, outputs, session.input_names)
            elif not slot.fixed:
                bind(binding, self.device, inputs, outputs, session.input_names)
            session.run(binding, (state.slot, n, *key) if slot.fixed else None)
        else:  # sampling, or chunked runs off: a prefix of the [1, max_len] buffers, uncaptured
            self._long_host[0, 0, :n] = state.ids[start:end]
            self._long_host[1, 0, :n] = self.backend.positions[0, start:end]
            for buffer, host in zip(self._long, self._long_host, strict=True):
                buffer.write(host)
            binding = session.session.io_binding()
            bind(binding, self.device, {names.INPUT_IDS: self._long[0].view((1, n)),
                                        names.POSITION_IDS: self._long[1].view((1, n)),
                                        **kv_inputs, **{k: v.view() for k, v in slot.sampling.items()}, **inputs},
                 {**cache.bind_outputs(n), **outputs}, session.input_names)
            session.run(binding, None)
        cache.advance(n)


class DeviceDraft(_DeviceModel):
    """draft_step.onnx: S new tokens in, one drawn token (read back) and its q (left on the device) out. In the draft's
    tree form (a tree pack's draft model: docs/trees.md, "Trees drafted by the draft model") also a TreeDraftEngine:
    a chain step binds no own row (cuda_draft_tree.py's W = 0 views), `tree_step` a token tree's runs."""

    def __init__(self, backend: CudaBackend, entry: ModelEntry) -> None:
        super().__init__(backend, entry)
        m = backend.manifest
        k_max = m.k_max
        # [slots, k_max, V]: each slot's q rows, one buffer, so that a batched verify binds rows [lo, hi) in place
        self._q = DeviceArray((len(self.slots), k_max, self.vocab), np.float32, self.device)
        self._q_rows = k_max * self.vocab  # elements per slot
        self._token = [DeviceArray((1,), np.int64, self.device) for _ in self.slots]               # [1]
        self._uniform = [DeviceArray((1,), np.float32, self.device) for _ in self.slots]           # [1]
        from specpack.runtime.backends.cuda_draft_tree import DraftTreeSlot
        from specpack.runtime.head_tree_rows import draft_tree_buffers

        self.tree = draft_tree_buffers(m, len(self.slots))  # the host side of tree runs (None: chains only)
        self.tree_width = 0 if self.tree is None else self.tree.width  # K
        self.plain_form = self.tree is None  # chains: the plain sampling form (a tree form's head has more outputs)
        self._tree = [DraftTreeSlot.allocate(self.tree_width, m.max_len, self.device)
                      for _ in self.slots] if self.tree is not None else []

    def step(self, state: DecodeState, end: int, row: int) -> int:
        slot, uniform = self.slots[state.slot], self._uniform[state.slot]
        if not slot.greedy:
            uniform.write(state.uniforms.draft[row : row + 1])
        # greedy: one fixed row (a captured graph keeps its addresses); the greedy verify never reads q. Plain
        # sampling: a binding (and a captured graph) per q row
        probs = self._q_view(state.slot, (1, self.vocab), 0 if slot.greedy else row * self.vocab)  # [1, V]
        inputs, outputs = self._chain_views(state.slot, probs)
        self._run(state, end, () if slot.greedy else (row,), inputs, outputs)
        return int(self._token[state.slot].read()[0])

    def _chain_views(self, i: int, probs: DeviceView) -> tuple[dict[str, DeviceView], dict[str, DeviceView]]:
        """What a chain step binds (the tree form: no own row, the last row's top-K)."""
        inputs, outputs = {names.UNIFORM: self._uniform[i].view()}, {names.TOKEN: self._token[i].view(), names.PROBS: probs}
        if self._tree:
            inputs |= self._tree[i].inputs(0)
            outputs |= self._tree[i].outputs(0)
        return inputs, outputs

    def tree_step(self, state: DecodeState, run: HeadTreeRun | None) -> TopRows:
        """A token tree's run (engine.TreeDraftEngine), as OrtDraft.tree_step: run None, the catch-up (a greedy chain
        step's binding and captured graph: its top-K read back); else `run`'s W own rows (their positions and masks
        uploaded, one binding and graph per W). The host builds the inputs (head_tree_rows.HeadTreeBuffers)."""
        host = self.tree
        if host is None:
            raise tree_refusal("this pack's draft model (exported without the tree form)")
        i, slot = state.slot, self.slots[state.slot]
        start, device = slot.cache.length, self._tree[i]
        index = host.next_run(i, run)
        if run is None:  # the catch-up over the committed tokens not yet cached
            end, w = state.length, 0
            self._run(state, end, (), *self._chain_views(i, self._q_view(i, (1, self.vocab))))
        else:
            end, w = start + len(run.tokens), len(run.tokens)
            state.ids[start:end] = run.tokens  # past the committed tokens: the proposal overwrites them
            host.row_inputs(i, run, start)  # fills the host buffers, uploaded whole (the first W rows are bound)
            device.positions.write(host.positions[i])
            device.mask.write(host.mask[i])
            self._run(state, end, ("tree", w), {names.UNIFORM: self._uniform[i].view(), **device.inputs(w)},
                      {names.TOKEN: self._token[i].view(), names.PROBS: self._q_view(i, (1, self.vocab)),
                       **device.outputs(w)}, chunks=False)
        host.tokens[i][index, : w + 1] = device.tokens.read()[0, : w + 1]
        host.logprobs[i][index, : w + 1] = device.logprobs.read()[0, : w + 1]
        return host.top_rows(i, index, w, start if w else end - 1)

    def q(self, state: DecodeState, k: int) -> DeviceView:
        return self._q_view(state.slot, (1, k, self.vocab))  # [1, k, V] on the device

    def _q_view(self, slot: int, shape: tuple[int, ...], offset: int = 0) -> DeviceView:
        return self._q.view(shape, slot * self._q_rows + offset)

    def q_rows(self, lo: int, hi: int) -> DeviceView:
        """Slots [lo, hi)'s q rows in place, [hi - lo, k_max, V]: a batched verify's draft_probs (cuda_batched.py)."""
        return self._q_view(lo, (hi - lo, self.backend.manifest.k_max, self.vocab))

    def check_q(self, slot: int, q: DeviceView) -> None:
        """`q` must be what `q` gave for this slot (the batched verify reads q of the slot's own drafts only)."""
        if q.ptr != self._q_view(slot, (1,)).ptr:
            raise RuntimeError(f"slot {slot}: a q view that is not this slot's rows")

    def host_q(self, slot: int, q: DeviceView, k: int) -> np.ndarray:
        """`q` (what `q` gave for this slot) read back: [k, V] fp32 on the host (the batched verify's draft_probs where
        a batch also holds a deterministic sampling proposal; the whole buffer is read)."""
        self.check_q(slot, q)
        return self._q.read()[slot, :k]  # [k, V]


class DeviceTarget(_DeviceModel):
    """verify.onnx: committed tokens not yet cached + k drafts in; n accepted and the next token read back.

    The tree form (a pack exported with --max-tree-nodes T_max) takes `parents` in place of draft_probs and gives
    `path`: a chain is verified as a tree of width 1 (parents -1, 0, .., k - 2), a tree with its own parents; after a
    tree verify Target._tree calls the cache's keep_rows, which runs kv_compact.onnx here (`_compact`)."""

    def __init__(self, backend: CudaBackend, entry: ModelEntry) -> None:
        super().__init__(backend, entry)
        k_max, tree = backend.manifest.k_max, entry.graph.tree
        self.tree_nodes = 0 if tree is None else tree.max_nodes  # T_max; 0: the chain form
        self.plain_form = tree is None  # the chain form's plain sampling form (verify's binding per (k, q buffer))
        # q the greedy form binds (it never reads it), and one-hot q of deterministic proposals when sampling
        self._q_scratch = [DeviceArray((1, k_max, self.vocab), np.float32, self.device) for _ in self.slots]
        self._uniforms = [{k: DeviceArray((1, k + 1), np.float32, self.device) for k in range(self.short_max)}
                          for _ in self.slots]  # k -> [1, k + 1]
        self._chain = np.arange(-1, self.tree_nodes - 1, dtype=np.int64)[None]  # [1, T_max] host: a chain's parents
        # T -> parents [1, T] per slot (one element allocated for T = 0, bound as [1, 0]); path [1, T_max + 1] per slot
        self._parents = [{t: DeviceArray((1, max(t, 1)), np.int64, self.device) for t in range(self.tree_nodes + 1)}
                         for _ in self.slots] if tree is not None else []
        self._path = [DeviceArray((1, self.tree_nodes + 1), np.int64, self.device) for _ in self._parents]
        self._compact_session: DeviceSession | None = None
        self._compact_bindings: dict[tuple[int, int], Any] = {}  # (slot, T) -> IOBinding, bound once
        if tree is not None:  # kv_compact.onnx, opened at load (verified bytes for a pinned pack)
            graph = GraphEntry(path=tree.kv_compact.path, data_files=[], inputs=tree.kv_compact.inputs,
                               outputs=tree.kv_compact.outputs, kv_cache="static")
            self._compact_session = backend.open_session(entry.model_copy(update={"graph": graph}), greedy=False,
                                                         capture=backend.cuda_graphs)
            for i, slot in enumerate(self.slots):
                slot.cache.compact = partial(self._compact, i)
        self._n = [DeviceArray((1,), np.int64, self.device) for _ in self.slots]
        self._next = [DeviceArray((1,), np.int64, self.device) for _ in self.slots]
        self.features: list[DeviceArray] = []  # a head pack's features cache [1, 1, max_len, F] per slot, in place
        if backend.manifest.head is not None:
            shape = feature_buffer_shape(backend.manifest)
            self.features = [DeviceArray(shape, numpy_dtype(entry.dtype), self.device) for _ in self.slots]

    def verify(self, run: VerifyRun) -> VerifyResult:
        if self.tree_nodes:  # the tree form verifies a chain as a tree of width 1 (its head has no draft_probs)
            path = self._run_tree(run, self._chain[:, : run.k])
            return VerifyResult(len(path), int(self._next[run.state.slot].read()[0]))
        state, k, i = run.state, run.k, run.state.slot
        slot = self.slots[i]
        uniforms = self._uniforms[i][k]
        q: DeviceView = self._q_scratch[i].view((1, k, self.vocab))  # [1, k, V]: the greedy form never reads it
        if not slot.greedy:
            uniforms.write(state.uniforms.verify[:, : k + 1])
            if run.q is not None:
                q = run.q
        inputs = {names.DRAFT_PROBS: q, names.UNIFORMS: uniforms.view()}
        outputs = {names.N_ACCEPTED: self._n[i].view(), names.NEXT_TOKEN: self._next[i].view()}
        if self.features:  # the features cache, past bound as present (the graph writes the run's rows in place)
            inputs[names.PAST_TARGET_FEATURES] = outputs[names.TARGET_FEATURES] = self.features[i].view()
        # plain sampling: a binding per (k, q buffer): the draft's q rows, or the scratch of a deterministic proposal
        self._run(state, state.length + k, (k,) if slot.greedy else (k, q.ptr), inputs, outputs)
        return VerifyResult(int(self._n[i].read()[0]), int(self._next[i].read()[0]))

    def verify_tree(self, run: VerifyRun) -> TreeResult:
        if not self.tree_nodes or run.parents is None:
            raise tree_refusal("this pack's verify graph (exported without --max-tree-nodes)")
        path = self._run_tree(run, run.parents[None])
        return TreeResult(path, int(self._next[run.state.slot].read()[0]))

    def _run_tree(self, run: VerifyRun, parents: np.ndarray) -> np.ndarray:
        """The tree form over `parents` [1, T] (host); the accepted nodes (path rows 1..n, minus one: node indices).
        Greedy runs are captured per (slot, S, T): parents, uniforms and path at fixed addresses per T."""
        state, k, i = run.state, run.k, run.state.slot
        if k > self.tree_nodes:
            raise tree_refusal(f"a verify of {k} nodes (this pack's tree form takes {self.tree_nodes} at most)")
        staged, uniforms = self._parents[i][k], self._uniforms[i][k]
        if k:
            staged.write(parents)  # [1, T]
        if not self.slots[i].greedy:
            uniforms.write(state.uniforms.verify[:, : k + 1])
        inputs = {names.PARENTS: staged.view((1, k)), names.UNIFORMS: uniforms.view()}
        outputs = {names.N_ACCEPTED: self._n[i].view(), names.NEXT_TOKEN: self._next[i].view(),
                   names.PATH: self._path[i].view((1, k + 1))}
        if self.features:
            inputs[names.PAST_TARGET_FEATURES] = outputs[names.TARGET_FEATURES] = self.features[i].view()
        self._run(state, state.length + k, (k,), inputs, outputs, chunks=k == 0)
        self.slots[i].cache.tree_verified(k)
        n = int(self._n[i].read()[0])
        return self._path[i].read()[0, 1 : n + 1] - 1  # [n] node indices, increasing

    def _compact(self, i: int, nodes: int) -> None:
        """kv_compact.onnx over slot i's cache after a tree verify of `nodes` nodes: the mask the verify ran with, its
        path [1, T + 1] and every cache buffer in place (present bound onto past); one binding and graph per (slot, T)."""
        session = self._compact_session
        assert session is not None  # set as the cache's compact only with a tree form
        binding = self._compact_bindings.get((i, nodes))
        if binding is None:
            cache_inputs, cache_outputs = self.slots[i].cache.bound()
            features = {names.PAST_TARGET_FEATURES: self.features[i].view()} if self.features else {}
            binding = self._compact_bindings[(i, nodes)] = session.session.io_binding()
            bind(binding, self.device, {**cache_inputs, **features, names.PATH: self._path[i].view((1, nodes + 1))},
                 {**cache_outputs, **({names.TARGET_FEATURES: self.features[i].view()} if self.features else {})},
                 session.input_names)
        session.run(binding, (i, nodes))

    def upload_q(self, slot: int, host_q: np.ndarray, k: int) -> DeviceView:
        """A host q (a deterministic proposal's one-hot rows) uploaded into the slot's scratch."""
        self._q_scratch[slot].write(host_q)  # [1, k_max, V]
        return self._q_scratch[slot].view((1, k, self.vocab))


class CudaBackend(EngineBackend[DeviceTarget, "DeviceDraft | DeviceHead"]):
    """Both engines on one ONNX Runtime device, every buffer there; the draft opens on first use."""

    name = "cuda"

    def __init__(self, path: Path, manifest: Manifest, options: BackendOptions, *, device: str = "cuda",
                 cuda_graphs: bool = True, chunked_runs: bool | None = None, precapture: bool | None = None,
                 batched_greedy: bool | None = None) -> None:
        """device "cuda" (CUDA EP) or "cpu" (the same code on the CPU EP, for tests; no CUDA graphs).
        chunked_runs: greedy runs over more than k_max + 1 tokens as captured chunks (LONG_CHUNK, k_max + 1; None: where
        graphs are captured); precapture: every greedy shape run before its first use, on each thread
        (cuda_precapture.py; None: options.precapture where graphs are captured; at load too unless it is "batcher");
        batched_greedy: greedy batches on the batched verify graph's greedy form (cuda_batched.py; None: where graphs
        are captured)."""
        refuse_cpu_only(manifest, "cuda", static_heads=True, trees=True)
        for label, entry in manifest.models():  # an n-gram pack has no draft model
            if entry.graph.kv_cache != "static" or entry.dtype not in ("fp32", "fp16"):
                raise SpecpackError("the cuda backend needs graphs with the static KV cache, fp32 or fp16",
                                    expected="a pack exported with --kv-cache static --dtype fp16 (or fp32)",
                                    found=f"{label}: {entry.graph.kv_cache} KV cache, {entry.dtype}",
                                    hint="re-export with spec-export --kv-cache static --dtype fp16")
            if device == "cuda" and entry.dtype == "fp32" and entry.graph.attention == "gqa":
                # measured on an H200: ONNX Runtime runs this GroupQueryAttention on the CPU (Memcpy nodes around
                # the key cache), the cache is no longer shared in place, and greedy drafts change the output
                raise SpecpackError("the cuda backend cannot run fp32 GroupQueryAttention graphs",
                                    expected="--dtype fp16 with --attention gqa, or fp32 with --attention standard",
                                    found=f"{label}: fp32, gqa attention",
                                    hint="re-export with spec-export --kv-cache static --dtype fp16")
        tree = manifest.target.graph.tree
        if tree is not None and tree.max_nodes < manifest.k_max:
            raise SpecpackError("this pack's tree verify graph takes fewer nodes than its k_max",
                                expected=f"--max-tree-nodes >= --k ({manifest.k_max})", found=f"max_nodes {tree.max_nodes}",
                                hint="re-export with --max-tree-nodes at least --k")
        self.path, self.manifest, self.options, self.device = path, manifest, options, device
        self._warmups = WarmupRuns()  # every session's warm-up runs (open_session hands it over)
        self.cuda_graphs = cuda_graphs and options.cuda_graphs and device == "cuda"
        self.chunked_runs = self.cuda_graphs if chunked_runs is None else chunked_runs
        if options.precapture not in (True, False, "batcher"):
            raise SpecpackError("invalid precapture", expected='True, False or "batcher"', found=repr(options.precapture))
        # precapture: shapes captured before their first use, on each thread that runs them (CAPTURE_RUNS); at load on
        # the loading thread too, but for "batcher" (a server: every request goes through a batcher, precapture_thread)
        self.precapture = self.cuda_graphs and options.precapture is not False if precapture is None else precapture
        self.precapture_at_load = self.precapture and options.precapture != "batcher"
        self.batched_greedy = self.cuda_graphs if batched_greedy is None else batched_greedy
        # the slots whose shapes precapture runs: slot 0 alone where batched graphs take a batch's rows (cuda_precapture)
        self.precapture_slots = 1 if manifest.target.batched is not None and options.slots > 1 else options.slots
        self.drafts_max = manifest.k_max if tree is None else tree.max_nodes  # the most drafts (nodes) a verify takes
        width = manifest.max_len + self.drafts_max + 1
        self.positions = np.arange(width, dtype=np.int64)[None, :]  # [1, width] host, sliced per run
        target = DeviceTarget(self, manifest.target)
        target.session(True)  # the greedy form opens at load
        if self.precapture_at_load:
            from specpack.runtime.backends.cuda_precapture import precapture_target

            precapture_target(target, manifest.max_len, manifest.k_max)
        drafts = manifest.draft_model is not None or manifest.head is not None
        super().__init__(target, self._open_draft if drafts else None, k_max=manifest.k_max,
                         vocab_size=manifest.vocab_size, pad_single_steps=options.pad_single_steps)
        self._draft_captured: set[int] = set()  # the threads that ran the draft's precapture (_open_draft, precapture_thread)
        self._loading = True                     # no draft precapture at load for "batcher"
        if (options.verified_reads or self.precapture_at_load) and drafts:  # pinned, or precaptured: the draft's too
            self.draft().engine.session(True)
        self._loading = False

    def _open_draft(self) -> DeviceDraft | DeviceHead:
        draft = self._new_draft()
        if self.precapture and not (self._loading and not self.precapture_at_load):
            from specpack.runtime.backends.cuda_precapture import precapture_draft

            precapture_draft(draft, self.manifest.max_len, self.manifest.k_max)
            self._draft_captured.add(threading.get_ident())
        return draft

    def _new_draft(self) -> DeviceDraft | DeviceHead:
        if self.manifest.head is not None:
            from specpack.runtime.backends.cuda_head import DeviceHead

            return DeviceHead(self, self.manifest.head, self._target.engine.features)
        return DeviceDraft(self, self.manifest.draft)

    def open_session(self, entry: ModelEntry | HeadEntry, greedy: bool, capture: bool | None = None,
                     greedy_form_of: Callable[[Path, bytes | None], bytes] | None = None) -> DeviceSession:
        """The greedy form (If inlined, captured where the EP allows) or the graph as exported, its cache writes an
        element per index (graphs/element_scatter.py); for a pinned pack (options.verified_reads) from bytes hashed as
        they are read, whenever the session opens. capture: whether the session captures CUDA graphs (None: the greedy
        form does, where the backend captures); greedy_form_of: how the greedy form is made (default
        graphs/greedy_form.py's; a batched verify graph's: graphs/batched_greedy_form.py)."""
        graph_path = self.path / entry.graph.path
        model: Path | bytes = graph_path
        external = None
        if self.options.verified_reads:  # a pinned load: the bytes hashed as they were read, now
            from specpack.contract.verified_read import graph_bytes

            verified = graph_bytes(self.path, self.manifest, entry.graph)
            model, external = verified.model, verified.external
        from specpack.graphs.element_scatter import element_scatter_bytes  # needs onnx: the device extra
        from specpack.graphs.greedy_form import greedy_form

        if greedy:
            model = (greedy_form_of or greedy_form)(graph_path, model if isinstance(model, bytes) else None)
        # cache writes one element per index: ONNX Runtime's CUDA ScatterND copies a row per thread, serially
        model = element_scatter_bytes(model if isinstance(model, bytes) else graph_path.read_bytes())
        capture = greedy and self.cuda_graphs if capture is None else capture
        return DeviceSession(model, graph_path.parent, entry, self.device, capture, self.options.threads, external,
                             self._warmups)

    def batched_engines(self, max_batch: int) -> BatchedEngines | None:
        """The pack's batched graphs (spec-export --max-batch) for up to max_batch rows, their caches on this device
        (cuda_batched.py; never captured); None for a pack without them. What pack_batching.start_batching picks up."""
        from specpack.runtime.backends.cuda_batched import open_device_batched

        return open_device_batched(self, max_batch)

    def capture_report(self) -> dict[str, Any]:
        """Whether each opened greedy and plain sampling session ("target", "target plain", ...) captures CUDA graphs,
        how many, and why not."""
        target = self._target.engine
        models = {"target": target, "draft": self._draft.engine if self._draft is not None else None}
        sessions = {f"{label}{suffix}": s for label, model in models.items() if model is not None
                    for key, suffix in ((True, ""), ("plain", " plain")) for s in [model._sessions.get(key)]
                    if s is not None}
        if target._compact_session is not None:
            sessions["kv_compact"] = target._compact_session
        return {label: {"captured_graphs": s.graphs_captured, "capture": s.capture, "refused": s.error}
                for label, s in sessions.items()}

    def warmup_runs(self) -> int:
        """Runs of captured shapes before their graphs replay, in every session opened so far: a step that ran one is
        no cost sample for adaptive k (adaptive_k.MeasuredCosts; a capture costs several steps once)."""
        return self._warmups.count

    def precapture_thread(self, batched: BatchedRuns | None, drafter: BatchedGreedyDrafter | None) -> int:
        """On a batcher's thread before its first step (ONNX Runtime captures per thread: CAPTURE_RUNS): the batched
        engines' decode steps (precapture_batched) if it has them, and the per-slot chains (the load's, on its own
        thread, unless precapture is "batcher"; with batched engines slot 0's, where a solo row decodes) on this one,
        the draft opened first if it was not; nothing without precapture. The runs made (a draft opened here: its
        captures not counted)."""
        if not self.precapture:
            return 0
        from specpack.runtime.backends import cuda_precapture as pre

        m = self.manifest
        if m.draft_model is not None or m.head is not None:
            self.draft().engine.session(True)  # opened now if not yet, not in a request (_open_draft)
        runs = 0
        if batched is not None:  # the per-slot draft serves sampling rows there (plain ones captured on first use)
            engine = self.draft().engine if m.draft_model is not None else None
            q_of = engine.q if isinstance(engine, DeviceDraft) else None  # sampling rows' q in place (batched_verify)
            runs = pre.precapture_batched(batched, drafter, m.max_len, m.k_max, q_of)
        # the per-slot chains (slot 0's where batched engines take the batch: a solo row's, scheduler.py)
        runs += pre.precapture_target(self._target.engine, m.max_len, m.k_max)
        if self.draft_loaded and threading.get_ident() not in self._draft_captured:
            runs += pre.precapture_draft(self.draft().engine, m.max_len, m.k_max)
            self._draft_captured.add(threading.get_ident())
        return runs
