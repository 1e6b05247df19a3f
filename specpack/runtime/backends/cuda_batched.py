"""The cuda backend's batched engines (docs/batching.md; docs/cuda_backend.md, "Batched graphs"): the pack's batched
graphs (spec-export --max-batch) opened on the backend's device, their KV caches there, the row layout and the
acceptance BatchedTarget's / BatchedGreedyTarget's (the same code as the cpu backend's, cpu_batched.open_batched).

    DeviceCaches  per cache tensor one DeviceArray [slots, kv_heads, M, head_dim] (zero-filled once); a run over the
                  slots [lo, hi) binds each at ptr + lo * kv_heads * M * head_dim elements with shape
                  [hi - lo, kv_heads, M, head_dim], past and present the same view (written in place), as HostCaches
                  binds numpy views [lo:hi]
    per run       ids, positions [B, S], mask [B, M], draft_counts, token_counts, sampling inputs [B], uniforms
                  [B, K + 1], draft_probs [B, K, V] in; n_accepted, next_token [B] or best [B, K+1] out: host arrays,
                  copied by ONNX Runtime; but a greedy batch's draft_probs (never read) is a view of a zero buffer
                  on the device (`ignored`), not [B, K, V] fp32 copied in per step (155 MB at 64 rows and K 4)
    q             a sampling row drafted on its own slot (DeviceDraft) has its q on the device: read back into the
                  batched verify's host draft_probs (DeviceDraft.host_q, [1, k_max, V] fp32 per sampling row per step)

Sessions: the graph as exported with its cache writes widened per element (CudaBackend.open_session, greedy=False),
never captured: B and S change from run to run (a CUDA graph per (B, S) shape is future work).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from specpack.contract.manifest import BatchedForm, ModelEntry
from specpack.errors import SpecpackError
from specpack.runtime.backends.cpu_batched import BatchedEngines, open_batched
from specpack.runtime.batched_caches import Bound, CacheOpener, KVLayout
from specpack.runtime.device_buffers import DeviceArray, DeviceView, bind
from specpack.runtime.state import DecodeState, Proposal

if TYPE_CHECKING:
    from specpack.runtime.backends.cuda import CudaBackend, DeviceSession


class DeviceCaches:
    """BatchedCaches on an ONNX Runtime device (runtime/batched_caches.py): one IOBinding, rebound per run."""

    def __init__(self, session: DeviceSession, layout: KVLayout, device: str) -> None:
        self.session, self.layout, self.device = session, layout, device
        self.input_names = session.input_names
        self.launch_bound = device == "cuda"  # an uncaptured run's launches cost more than its rows (bench/README.md)
        self._buffers = [DeviceArray(layout.shape, layout.dtype, device) for _ in range(2 * layout.num_layers)]
        self._past, self._present = layout.names()
        self._binding = session.session.io_binding()
        self._ignored: DeviceArray | None = None  # flat, zeros; `ignored` views

    def rows(self, lo: int, hi: int) -> tuple[dict[str, Bound], dict[str, Bound]]:
        shape = (hi - lo, *self.layout.shape[1:])                      # [B, H, M, D]
        views = [b.view(shape, lo * self.layout.row_elements) for b in self._buffers]
        past: dict[str, Bound] = dict(zip(self._past, views, strict=True))
        present: dict[str, Bound] = dict(zip(self._present, views, strict=True))
        return past, present

    def run(self, inputs: Mapping[str, Bound], outputs: Mapping[str, Bound]) -> None:
        bind(self._binding, self.device, inputs, outputs, self.session.input_names)
        self.session.run(self._binding, None)  # None: never captured

    def ignored(self, shape: tuple[int, ...], dtype: type) -> Bound:
        size = int(np.prod(shape))
        if self._ignored is None or self._ignored.shape[0] < size or self._ignored.dtype != np.dtype(dtype):
            self._ignored = DeviceArray((size,), dtype, self.device)
        return self._ignored.view(tuple(shape))

    def close(self) -> None:
        self._ignored = None
        self._binding.clear_binding_inputs()
        self._binding.clear_binding_outputs()
        self._buffers.clear()


def open_device_batched(backend: CudaBackend, max_batch: int) -> BatchedEngines | None:
    """The pack's batched engines over device caches (cpu_batched.open_batched's checks and sizes); None without
    batched graphs."""

    def open_graph(entry: ModelEntry, form: BatchedForm) -> CacheOpener:
        session = backend.open_session(entry.model_copy(update={"graph": form.graph}), greedy=False, capture=False)
        return partial(DeviceCaches, session, device=backend.device)

    return open_batched(backend.manifest, max_batch, open_graph, partial(_draft_q, backend))


def _draft_q(backend: CudaBackend, state: DecodeState, proposal: Proposal) -> np.ndarray:
    """A sampling row's q, drafted on its own slot by the backend's draft model, as host rows [k, V]."""
    from specpack.runtime.backends.cuda import DeviceDraft

    engine = backend.draft().engine
    if not isinstance(engine, DeviceDraft) or not isinstance(proposal.q, DeviceView):
        raise SpecpackError("the batched verify reads q from the draft model's buffers", expected="a draft model "
                            "pack (drafter model or ngram)", found=f"{type(engine).__name__}, q {type(proposal.q).__name__}",
                            hint="docs/batching.md: head packs are not exported with --max-batch")
    return engine.host_q(state.slot, proposal.q, proposal.k)
