"""The cuda backend's batched engines (docs/batching.md; docs/cuda_backend.md, "Batched graphs"): the pack's batched
graphs (spec-export --max-batch) opened on the backend's device, their KV caches there, the row layout and the
acceptance BatchedTarget's / BatchedGreedyTarget's (the same code as the cpu backend's, cpu_batched.open_batched).

    DeviceCaches  per cache tensor one DeviceArray [slots, kv_heads, M, head_dim] (zero-filled once); a run over the
                  slots [lo, hi) binds each at ptr + lo * kv_heads * M * head_dim elements with shape
                  [hi - lo, kv_heads, M, head_dim], past and present the same view (written in place), as HostCaches
                  binds numpy views [lo:hi]
    per run       ids, positions [B, S], mask [B, M], draft_counts, token_counts, sampling inputs [B], uniforms
                  [B, K + 1], draft_probs [B, K, V] in; n_accepted, next_token [B] or best [B, min(S, k_max + 1)] out:
                  host arrays;
                  a greedy batch's draft_probs (never read) is a view of a zero buffer on the device (`ignored`), not
                  [B, K, V] fp32 copied in per step (155 MB at 64 rows and K 4)
    decode steps  (S <= k_max + 1) on a session that captures: over slots [0, 2^n) (BatchedRuns.span), every host
                  array staged in a device buffer of its name and shape, one IOBinding per run shape bound once, the
                  shape's CUDA graph captured on its first runs and replayed after (`_run_fixed`); other runs
                  (prefills, catch-ups, batches with a sampling row) uncaptured, their host arrays copied to device
                  buffers of the run where a session of these caches captures (`staged`)
    q             a sampling row drafted on its own slot (DeviceDraft) has its q on the device, in one [slots, k_max,
                  V] buffer: a run whose sampling rows are all the model's binds draft_probs to rows [lo, hi) of it in
                  place (K = k_max; batched_verify.py, `q_rows`); one with a deterministic sampling proposal (one-hot
                  q, built on the host) reads the model rows' q back (DeviceDraft.host_q) into a host draft_probs

Sessions (CudaBackend.open_session; cache writes widened per element): the draft's batched graph (its argmax head has
no control flow) captured, its K + 1 from shapes (graphs/batched_fixed_rows.py: as exported it is max k_b + 1, a device
value, which no CUDA graph replays); the target's batched verify graph as exported, uncaptured (its head is a Scan
over rows with the sampling If inside), its greedy form (graphs/batched_greedy_form.py), captured, for the decode
steps whose rows are all greedy, and its plain form (graphs/batched_plain_form.py), captured, for those whose rows are
greedy or sample without top-k / top-p (CudaBackend.batched_greedy opens both, by default where the backend captures:
the target's weights twice more on the device; the batcher pre-captures both: backends/cuda_precapture.py).
A capture ONNX Runtime refuses turns that session's capture off (`error` says why).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from specpack.contract.manifest import BatchedForm, ModelEntry
from specpack.errors import SpecpackError
from specpack.runtime.backends.cpu_batched import BatchedEngines, open_batched
from specpack.runtime.batched_caches import Bound, CacheOpener, KVLayout
from specpack.runtime.device_buffers import DeviceArray, DeviceView, bind
from specpack.runtime.state import DecodeState, Proposal

if TYPE_CHECKING:
    from specpack.runtime.backends.cuda import CudaBackend, DeviceDraft, DeviceSession


class DeviceCaches:
    """BatchedCaches on an ONNX Runtime device (runtime/batched_caches.py). A run is uncaptured (one IOBinding per
    session, rebound per run), or, asked to `capture` (a decode step: S <= k_max + 1) on a session that captures,
    a fixed-address run (`_run_fixed`): every host input and output staged in a device buffer of its name and shape,
    one IOBinding per run shape bound once, the session's CUDA graph for that shape replayed (docs/batching.md, "On the
    GPU"). A verify graph's greedy form (graphs/batched_greedy_form.py, `greedy_session`) runs the batches whose rows
    are all greedy: the graph as exported has a Scan over rows with the sampling If inside, which no CUDA graph takes."""

    def __init__(self, session: DeviceSession, layout: KVLayout, device: str,
                 greedy_session: DeviceSession | None = None, fixed_rows: int | None = None,
                 plain_session: DeviceSession | None = None) -> None:
        """fixed_rows: the session's greedy head reads min(S, fixed_rows) rows (graphs/batched_fixed_rows.py);
        plain_session: the verify graph's plain form (graphs/batched_plain_form.py), for batches of greedy and
        temperature-only sampling rows."""
        self.session, self.greedy_session, self.layout, self.device = session, greedy_session, layout, device
        self.plain_session = plain_session
        self.fixed_rows = fixed_rows
        self.input_names = session.input_names
        self.launch_bound = device == "cuda"  # an uncaptured run's launches cost more than its rows (bench/README.md)
        # where a session captures, no run binds host memory (its host arrays copied to the device first)
        self.staged = any(s is not None and s.capture for s in (session, greedy_session, plain_session))
        self._buffers = [DeviceArray(layout.shape, layout.dtype, device) for _ in range(2 * layout.num_layers)]
        self._past, self._present = layout.names()
        self._binding = {id(s): s.session.io_binding() for s in (session, greedy_session, plain_session)
                         if s is not None}
        self._fixed: dict[tuple[Any, ...], Any] = {}                       # run shape -> its IOBinding, bound once
        self._stage: dict[tuple[Any, ...], DeviceArray] = {}               # (in/out, name, shape, dtype) -> buffer
        self._ignored: DeviceArray | None = None  # flat, zeros; `ignored` views

    def rows(self, lo: int, hi: int) -> tuple[dict[str, Bound], dict[str, Bound]]:
        shape = (hi - lo, *self.layout.shape[1:])                      # [B, H, M, D]
        views = [b.view(shape, lo * self.layout.row_elements) for b in self._buffers]
        past: dict[str, Bound] = dict(zip(self._past, views, strict=True))
        present: dict[str, Bound] = dict(zip(self._present, views, strict=True))
        return past, present

    def run(self, inputs: Mapping[str, Bound], outputs: Mapping[str, Bound], *, greedy: bool = False,
            capture: bool = False, plain: bool = False) -> None:
        """On the greedy form if every row is greedy and there is one, else on the plain form if every row is greedy or
        samples without filters (`plain`) and there is one, else on the graph as exported: a decode step on
        a session that captures at fixed addresses (`_run_fixed`); any other run uncaptured, its host arrays copied to
        device buffers of this run where `staged` (a session that captures is never handed host memory), else bound
        as they are (ONNX Runtime copies them)."""
        session = self.session
        if greedy and self.greedy_session is not None:
            session = self.greedy_session
        elif plain and self.plain_session is not None:
            session = self.plain_session
        if capture and session.capture:
            self._run_fixed(session, inputs, outputs)
            return
        binding = self._binding[id(session)]
        if not self.staged:
            bind(binding, self.device, inputs, outputs, session.input_names)
            session.run(binding, None)  # None: not captured
            return
        wanted = {name: v for name, v in inputs.items() if name in session.input_names}
        copies = {name: DeviceArray(v.shape, v.dtype, self.device, host=v) for name, v in wanted.items()
                  if isinstance(v, np.ndarray)}
        results = {name: DeviceArray(v.shape, v.dtype, self.device) for name, v in outputs.items()
                   if isinstance(v, np.ndarray)}
        bind(binding, self.device, {**wanted, **{n: a.view() for n, a in copies.items()}},
             {**outputs, **{n: a.view() for n, a in results.items()}})
        session.run(binding, None)
        for name, result in results.items():
            np.copyto(outputs[name], result.read())  # type: ignore[arg-type]

    def _run_fixed(self, session: DeviceSession, inputs: Mapping[str, Bound], outputs: Mapping[str, Bound]) -> None:
        """The run at fixed addresses: host arrays through staging buffers, the binding of this shape bound once, the
        shape's CUDA graph (captured on its first runs, then replayed). A capture that fails turns the session's
        capture off (the run again, uncaptured; `session.error` says why)."""
        wanted = {name: v for name, v in inputs.items() if name in session.input_names}
        host_in = {name: v for name, v in wanted.items() if isinstance(v, np.ndarray)}
        host_out = {name: v for name, v in outputs.items() if isinstance(v, np.ndarray)}
        key = (id(session), *sorted((name, v.shape, v.ptr) for name, v in {**wanted, **outputs}.items()
                                    if not isinstance(v, np.ndarray)),
               *sorted(("in", name, v.shape) for name, v in host_in.items()),
               *sorted(("out", name, v.shape) for name, v in host_out.items()))
        staged_in = {name: self._staged("in", name, v) for name, v in host_in.items()}
        staged_out = {name: self._staged("out", name, v) for name, v in host_out.items()}
        binding = self._fixed.get(key)
        if binding is None:
            binding = self._fixed[key] = session.session.io_binding()
            bind(binding, self.device, {**wanted, **{n: a.view() for n, a in staged_in.items()}},
                 {**outputs, **{n: a.view() for n, a in staged_out.items()}})
        for name, v in host_in.items():
            staged_in[name].write(np.ascontiguousarray(v))
        try:
            session.run(binding, key)
        except Exception as err:  # onnxruntime's own types: a node the graph capture does not take
            if not session.capture:
                raise
            session.capture, session.error = False, f"batched capture refused: {str(err).splitlines()[0]}"
            session.run(binding, None)
        for name, v in host_out.items():
            np.copyto(v, staged_out[name].read())

    def _staged(self, way: str, name: str, host: np.ndarray) -> DeviceArray:
        key = (way, name, host.shape, host.dtype.str)
        if (buffer := self._stage.get(key)) is None:
            buffer = self._stage[key] = DeviceArray(host.shape, host.dtype, self.device)
        return buffer

    def ignored(self, shape: tuple[int, ...], dtype: type) -> Bound:
        size = int(np.prod(shape))
        if self._ignored is None or self._ignored.shape[0] < size or self._ignored.dtype != np.dtype(dtype):
            self._ignored = DeviceArray((size,), dtype, self.device)
        return self._ignored.view(tuple(shape))

    def close(self) -> None:
        self._ignored = None
        for binding in [*self._binding.values(), *self._fixed.values()]:
            binding.clear_binding_inputs()
            binding.clear_binding_outputs()
        self._fixed.clear()
        self._stage.clear()
        self._buffers.clear()


def open_device_batched(backend: CudaBackend, max_batch: int) -> BatchedEngines | None:
    """The pack's batched engines over device caches (cpu_batched.open_batched's checks and sizes); None without
    batched graphs."""

    def open_graph(entry: ModelEntry, form: BatchedForm) -> CacheOpener:
        entry = entry.model_copy(update={"graph": form.graph})
        if form.head == "greedy":  # the argmax head: no control flow, captured with its K from shapes
            from specpack.graphs.batched_fixed_rows import batched_fixed_rows

            rows = backend.manifest.k_max + 1
            session = backend.open_session(entry, greedy=True, capture=backend.cuda_graphs,
                                           greedy_form_of=partial(batched_fixed_rows, rows=rows))
            return partial(DeviceCaches, session, device=backend.device, fixed_rows=rows)
        session = backend.open_session(entry, greedy=False, capture=False)
        greedy = plain = None
        if backend.batched_greedy:  # greedy batches on the greedy form; batches of greedy and temperature-only
            # sampling rows on the plain form: both captured (the target's weights twice more on the device)
            from specpack.graphs.batched_greedy_form import SAMPLING_INPUTS, batched_greedy_form
            from specpack.graphs.batched_plain_form import PLAIN_DROPPED, batched_plain_form

            greedy = backend.open_session(_without(entry, SAMPLING_INPUTS), greedy=True, capture=backend.cuda_graphs,
                                          greedy_form_of=batched_greedy_form)
            plain = backend.open_session(_without(entry, PLAIN_DROPPED), greedy=True, capture=backend.cuda_graphs,
                                         greedy_form_of=batched_plain_form)
        return partial(DeviceCaches, session, device=backend.device, greedy_session=greedy, plain_session=plain)

    return open_batched(backend.manifest, max_batch, open_graph, partial(_draft_q, backend),
                        partial(_draft_q_rows, backend))


def _without(entry: ModelEntry, dropped: tuple[str, ...]) -> ModelEntry:
    """The entry of a form of a batched verify graph: the graph's inputs but those the form no longer reads."""
    inputs = [spec for spec in entry.graph.inputs if spec.name not in dropped]
    return entry.model_copy(update={"graph": entry.graph.model_copy(update={"inputs": inputs})})


def _draft_q(backend: CudaBackend, state: DecodeState, proposal: Proposal) -> np.ndarray:
    """A sampling row's q, drafted on its own slot by the backend's draft model, as host rows [k, V] (a batch that
    also holds a deterministic sampling proposal, whose one-hot q is built on the host)."""
    return _draft_engine(backend, proposal).host_q(state.slot, proposal.q, proposal.k)  # type: ignore[arg-type]


def _draft_q_rows(backend: CudaBackend, lo: int, hi: int, rows: list[tuple[DecodeState, Proposal]]) -> DeviceView:
    """Slots [lo, hi)'s q rows in the draft model's buffer, in place ([hi - lo, k_max, V]), once each sampling row's
    q is checked to be its own slot's rows (its drafts there, rows [0, k_b))."""
    engine = None
    for state, proposal in rows:
        engine = _draft_engine(backend, proposal)
        engine.check_q(state.slot, proposal.q)  # type: ignore[arg-type]
    if engine is None:
        raise SpecpackError("internal: q rows asked for a batch without sampling rows", expected="a sampling row",
                            found="none")
    return engine.q_rows(lo, hi)


def _draft_engine(backend: CudaBackend, proposal: Proposal) -> DeviceDraft:
    from specpack.runtime.backends.cuda import DeviceDraft

    engine = backend.draft().engine
    if not isinstance(engine, DeviceDraft) or not isinstance(proposal.q, DeviceView):
        raise SpecpackError("the batched verify reads q from the draft model's buffers", expected="a draft model "
                            "pack (drafter model or ngram)", found=f"{type(engine).__name__}, q {type(proposal.q).__name__}",
                            hint="docs/batching.md: head packs are not exported with --max-batch")
    return engine
