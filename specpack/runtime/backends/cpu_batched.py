"""The batched engines of a pack (docs/batching.md): a pack exported with --max-batch holds each model's batched graph
(the manifest's `batched`); `open_batched` opens them for the scheduler, sized for max_batch rows, over the caches of
the backend that asks (the cpu backend's host buffers; the cuda backend's device buffers: cuda_batched.py).

    target  verify_batched.onnx (head "verify")  -> BatchedTarget: every request's verify in the step's one run
    draft   draft_batched.onnx  (head "greedy")  -> BatchedGreedyDrafter: the greedy rows' j-th drafts in one run (a
                                                    sampling row drafts on its own slot: its q comes from the pack's
                                                    draft_step.onnx)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from specpack.contract.manifest import BatchedForm, Manifest, ModelEntry
from specpack.errors import SpecpackError
from specpack.limits import numpy_dtype
from specpack.runtime.batched_caches import CacheOpener
from specpack.runtime.batched_draft import BatchedGreedyDrafter
from specpack.runtime.batched_target import BatchedGreedyTarget
from specpack.runtime.batched_verify import BatchedTarget, QReader, QRows
from specpack.runtime.ort_session import OrtGraph

# how a backend opens a model's batched graph: a session over host caches (OrtGraph), or its own caches (CacheOpener)
GraphOpener = Callable[[ModelEntry, BatchedForm], "OrtGraph | CacheOpener"]


class BatchedEngines(NamedTuple):
    target: BatchedTarget
    drafter: BatchedGreedyDrafter | None


def open_batched(m: Manifest, max_batch: int, open_graph: GraphOpener, read_q: QReader | None = None,
                 q_rows: QRows | None = None) -> BatchedEngines | None:
    """None when the pack has no batched target graph; refused past the batch it was exported for. read_q, q_rows: how
    the batched verify reads a sampling row's q (BatchedTarget; None: a host array)."""
    form = m.target.batched
    if form is None:
        return None
    if max_batch > form.max_batch:
        raise SpecpackError("max_batch exceeds what the pack's batched graphs were exported for",
                            expected=f"max_batch <= {form.max_batch}", found=f"max_batch {max_batch}",
                            hint="re-export with spec-export --max-batch N, or batch fewer requests")
    width = m.max_len + m.k_max + 1  # a padded row never runs off its buffer
    t = m.target
    target = BatchedTarget(open_graph(t, form), vocab_size=m.vocab_size, read_q=read_q, q_rows=q_rows,
                           num_layers=t.num_layers,
                           kv_heads=t.kv_heads, head_dim=t.head_dim, width=width, slots=max_batch, k_max=m.k_max,
                           dtype=numpy_dtype(t.dtype))
    drafter = None
    draft = m.draft_model
    if draft is not None and draft.batched is not None:
        engine = BatchedGreedyTarget(open_graph(draft, draft.batched), num_layers=draft.num_layers,
                                     kv_heads=draft.kv_heads, head_dim=draft.head_dim, width=width, slots=max_batch,
                                     k_max=m.k_max, dtype=numpy_dtype(draft.dtype))
        drafter = BatchedGreedyDrafter(engine)
    return BatchedEngines(target, drafter)
