"""The backend interface and registry (docs/architecture.md, "Backends").

A backend runs a pack's two graphs on one kind of device. It owns everything device-side: sessions,
buffers (host or device), the draft distributions q, and the KV caches, one set per cache slot. The
loop and the drafters reach it only through these few methods; per-request data comes in a DecodeState
(ids, lengths, uniforms, sampling inputs, slot) and goes out as a Proposal's q handle or a VerifyResult.

Every backend is an EngineBackend (runtime/target.py): the verify and draft policy written once, over two
engines per backend (runtime/engine.py) that only run graphs.

    name         module                                 what it runs
    cpu          specpack.runtime.backends.cpu          ONNX Runtime, CPU EP, host buffers (the default)
    cuda         specpack.runtime.backends.cuda         ONNX Runtime, CUDA EP, device buffers, CUDA graphs (static-cache packs)
    reference    specpack.runtime.backends.reference    the numpy oracle for sampling and acceptance, no KV cache
    tensorrt     specpack.runtime.backends.tensorrt     the pack's TensorRT engines, CUDA graphs (docs/tensorrt.md)

Each module has `load(path, manifest, options) -> Backend` and imports its heavy dependencies itself, so
that loading one backend never imports another's.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from specpack.errors import SpecpackError

if TYPE_CHECKING:
    from specpack.contract.manifest import Manifest
    from specpack.runtime.batched_draft import BatchedGreedyDrafter
    from specpack.runtime.batched_target import BatchedRuns
    from specpack.runtime.engine import HeadTreeRun, TopRows
    from specpack.runtime.state import DecodeState, Proposal, VerifyResult

BACKENDS: dict[str, str] = {  # device name -> module with `load(path, manifest, options) -> Backend`
    "cpu": "specpack.runtime.backends.cpu",
    "cuda": "specpack.runtime.backends.cuda",
    "reference": "specpack.runtime.backends.reference",
    "tensorrt": "specpack.runtime.backends.tensorrt",
}


@dataclass(frozen=True)
class BackendOptions:
    threads: int | None = None  # intra-op threads per session (None: the runtime's default)
    slots: int = 1              # cache sets (and request buffers) allocated: requests that may be in flight at once
    pad_single_steps: bool = True  # a greedy target step over one token runs as two rows, so that it takes the
                                   # kernels a verify of drafts takes (docs/architecture.md, "One row is never run
                                   # alone"); False: one row alone (bench/row_invariance.py measures the difference)
    verified_reads: bool = False   # every file from bytes hashed as they are read, every graph opened at load (a
                                   # pinned load: contract/verified_read.py); False: sessions read the checked files
    cuda_graphs: bool = True       # the cuda backend captures CUDA graphs for greedy runs; False: it runs them
                                   # uncaptured (bench/gpu.py measures both)
    precapture: bool | Literal["batcher"] = True  # where graphs are captured, every shape a greedy step can take is
                                   # captured before its first use (backends/cuda_precapture.py): at load on the loading
                                   # thread (the draft opens then), and on a batcher's thread when it starts (graphs are
                                   # kept per thread); "batcher": on a batcher's thread only (a server); False: each
                                   # shape on its first use


class TargetModel(Protocol):
    """The target with the verify head (verify.onnx): one pass over the drafts, n accepted and the next token out."""

    def reset(self, state: DecodeState) -> None:
        """Empty the cache of state.slot (a new request)."""
        ...

    def verify(self, state: DecodeState, proposal: Proposal) -> VerifyResult:
        """Run the target over the committed tokens it has not cached and the proposal's k drafts,
        state.ids[cached : state.length + k], with q from the proposal, state.uniforms.verify[:, :k+1] and
        state.sampling_inputs. Afterwards the cache holds the committed tokens and the accepted drafts:
        cached = state.length + n_accepted (the next token is fed with the next step's drafts)."""
        ...

    def rollback(self, state: DecodeState, length: int) -> None:
        """Keep at most the first `length` cached positions."""
        ...


class DraftModel(Protocol):
    """The draft with the sampling head (draft_step.onnx): S >= 1 tokens in, one drawn token and its q out."""

    def reset(self, state: DecodeState) -> None: ...

    def step(self, state: DecodeState, end: int, row: int) -> int:
        """Run the draft over state.ids[cached:end] (S >= 1: a prefill, one token, or a catch-up), draw the next
        token with state.uniforms.draft[row], write its q into row `row` of state.slot's q buffer; return the
        token. cached becomes `end`."""
        ...

    def q(self, state: DecodeState, k: int) -> Any:
        """The handle the target's verify reads: rows [0, k) of state.slot's q buffer ([1, k, V] fp32)."""
        ...

    def rollback(self, state: DecodeState, length: int) -> None:
        """Keep at most the first `length` cached positions."""
        ...


class TreeDraftModel(DraftModel, Protocol):
    """A draft that also drafts token trees (a tree pack's draft head, or draft model in its tree form:
    engine.TreeDraftEngine)."""

    tree_width: int  # the most children a node can get (0: the draft drafts chains only)

    def tree_step(self, state: DecodeState, run: HeadTreeRun | None) -> TopRows:
        """A tree's run on state.slot (engine.TreeDraftEngine.tree_step)."""
        ...


class Backend(Protocol):
    name: str

    @property
    def draft_loaded(self) -> bool:
        """Whether the draft model was opened (a request with k = 0, or an n-gram drafter, never opens it)."""
        ...

    def target(self) -> TargetModel:
        """The target model (opened at load)."""
        ...

    def draft(self) -> DraftModel:
        """The draft model, opened on the first call (a request with k = 0 never opens it; a pinned load opens it at
        load: BackendOptions.verified_reads)."""
        ...

    def warmup_runs(self) -> int:
        """Runs so far of a captured shape before its graph replays: what adaptive k must not time (0: none)."""
        ...

    def precapture_thread(self, batched: BatchedRuns | None, drafter: BatchedGreedyDrafter | None) -> int:
        """On the calling thread (a batcher's, before its first step): the shapes its steps run, captured there where
        the backend captures per thread (the cuda backend); the runs made (0: nothing to do)."""
        ...

    def close(self) -> None: ...


def open_backend(device: str, path: Path, manifest: Manifest, options: BackendOptions) -> Backend:
    """The backend registered as `device`, loaded over the pack at `path` (its files already checked)."""
    if device not in BACKENDS:
        raise SpecpackError(f"unknown device {device!r}", expected=" | ".join(sorted(BACKENDS)), found=repr(device))
    if isinstance(options.slots, bool) or not isinstance(options.slots, int) or options.slots < 1:
        raise SpecpackError("invalid slots", expected="an integer >= 1", found=repr(options.slots))
    module = importlib.import_module(BACKENDS[device])
    backend: Backend = module.load(path, manifest, options)
    return backend
