"""A Pack's requests through the scheduler (Pack.start_batching, Pack.submit; docs/batching.md).

    PackJob        what Pack.submit queues: the prepared request, its Handle, the caller's cancel event
    PackRows       the scheduler's openers and finisher over one pack: a job -> its row (state on the slot, k policy,
                   drafter, text out), in the batch or solo (alone on the per-slot engines: a batched engine's lone
                   request), a finished row -> the handle's Generation (or the error it ended with)
    start_batching the Scheduler over the pack's backend and its Batcher thread

A request decodes in a batch exactly as Pack.run decodes it alone: the same DecodeState, k policy, drafter and text
out (stop strings), on its own cache slot; only the thread that runs its steps differs.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from specpack.errors import SpecpackError
from specpack.runtime.batch_k import BatchKCap, BatchPolicy, NoCap
from specpack.runtime.batcher import Batcher, Handle
from specpack.runtime.loop import Decoding
from specpack.runtime.request import PreparedRequest
from specpack.runtime.scheduler import ChunkedTarget, Row, Scheduler, SchedulerConfig, SerialVerifier
from specpack.runtime.stop_strings import TextOut

if TYPE_CHECKING:
    from specpack.runtime.backend import TargetModel
    from specpack.runtime.batched_draft import BatchedGreedyDrafter
    from specpack.runtime.batched_target import BatchedRuns
    from specpack.runtime.drafter import Drafter
    from specpack.runtime.pack import Generation, Pack


@dataclass
class PackJob:
    prepared: PreparedRequest
    handle: Handle[Generation]
    cancel: threading.Event | None = None      # the caller's own cancel event (Pack.run's), beside handle.cancel()
    text: TextOut | None = field(default=None)  # set when the job is admitted


class _Either(threading.Event):
    """Set when either event is (the handle's cancel, the caller's)."""

    def __init__(self, a: threading.Event, b: threading.Event | None) -> None:
        super().__init__()
        self._a, self._b = a, b

    def is_set(self) -> bool:
        return self._a.is_set() or (self._b is not None and self._b.is_set())


class PackRows:
    """The scheduler's opener and finisher for one pack."""

    def __init__(self, pack: Pack, target: TargetModel, model_drafter: Drafter | None = None,
                 batched_draft: BatchedRuns | None = None) -> None:
        """model_drafter: in place of the pack's own for requests with the "model" drafter (a batched drafter);
        batched_draft: its engine, whose slot a solo row takes (`open_solo`)."""
        self.pack, self.target, self.model_drafter = pack, target, model_drafter
        self.batched_draft = batched_draft
        self.batcher: Batcher[PackJob] | None = None  # told when a job finishes

    def open(self, job: PackJob, slot: int) -> Row[PackJob]:
        return self._open(job, slot, self.target, self.model_drafter)

    def open_solo(self, job: PackJob, slot: int) -> Row[PackJob]:
        """The job's row alone on the pack's per-slot engines, as Pack.run decodes it (scheduler.py, solo rows); the
        batched draft's rows of its slot emptied (its pad rows there write from 0: no run narrows for it; the
        scheduler empties the batched target's)."""
        row = self._open(job, slot, self.pack.backend.target(), None)
        if self.batched_draft is not None:
            self.batched_draft.reset(row.state)
        return row

    def on_join(self, row: Row[PackJob]) -> None:
        """A solo row's drafter as it joins the batch (scheduler.py, `on_join`): the batched greedy draft for a greedy
        model row (its cache caught up at its next drafts, as a new row's)."""
        state, decoding = row.state, row.decoding
        if self.model_drafter is not None and decoding.drafter is self.pack.drafters.get("model") \
                and state.params.greedy:
            decoding.drafter = self.model_drafter
            self.model_drafter.begin(state)

    def _open(self, job: PackJob, slot: int, target: TargetModel, model_drafter: Drafter | None) -> Row[PackJob]:
        pack, prepared = self.pack, job.prepared
        request = prepared.request
        policy = pack.policy(request.k, prepared.drafter, request.sampling, request.seed, request.tree)
        job.text = text = TextOut(pack.tokenizer, request.stop, job.handle.text)
        state = pack.new_state(prepared, policy, slot)
        drafter = pack.drafters[prepared.drafter]
        if prepared.drafter == "model" and model_drafter is not None and request.sampling.greedy:
            drafter = model_drafter  # the batched greedy draft; a sampling row's q comes from its own slot
        decoding = Decoding(state, target, drafter, policy, text.push,
                            time.perf_counter)
        halt = text.halt(_Either(job.handle.cancel_event, job.cancel))
        own_k = not request.sampling.greedy and request.seed is not None
        return Row(job, slot, decoding, halt, own_k=own_k)

    def finish(self, row: Row[PackJob], outcome: str | BaseException) -> None:
        """Never raises: whatever goes wrong ends up in the handle. The batcher counts the job out before its handle
        is told, so a caller that submits again as soon as its result is in finds the place free."""
        job = row.job
        generation: Generation | None = None
        error: BaseException | None = outcome if isinstance(outcome, BaseException) else None
        if error is None:
            try:
                if job.text is None:
                    raise SpecpackError("internal: a finished row without its text", expected="an admitted job",
                                        found="none")
                generation = self.pack.generation(job.prepared, row.state, job.text, str(outcome))
            except BaseException as err:  # on_text raised while the text was flushed
                error = err
        if self.batcher is not None:
            self.batcher.finished()
        job.handle.finish(generation, error)


def start_batching(pack: Pack, max_batch: int, max_waiting: int, prefill_chunk: int,
                   batched: BatchedRuns | None = None, batched_draft: BatchedGreedyDrafter | None = None,
                   batch_policy: BatchPolicy | None = None, prefill_budget: int | None = None,
                   solo: bool = True) -> Batcher[PackJob]:
    """The scheduler over the pack's backend (its verifies in turn, one per row: SerialVerifier), or over a batched
    target (one run per step: runtime/batched_verify.py) and optionally a batched draft (batched_draft.py), on its
    own thread. Without `batched`, a pack exported with --max-batch gets its own (the backend's batched_engines: cpu, cuda)
    when max_batch > 1. batch_policy: the cap on k (None: BatchKCap with a batched target, else NoCap); solo: with a
    batched target, a request admitted alone decodes on the per-slot engines of slot 0 (scheduler.py, solo rows;
    False: through the batched graphs, at batch 1)."""
    if isinstance(max_batch, int) and max_batch > pack.slots:
        raise SpecpackError("max_batch exceeds the backend's cache slots", expected=f"max_batch <= {pack.slots}",
                            found=f"max_batch {max_batch}",
                            hint="load the pack with options=BackendOptions(slots=N), one KV cache per row")
    config = SchedulerConfig(max_batch=max_batch, prefill_chunk=prefill_chunk, prefill_budget=prefill_budget)
    closers = []
    if batched is None and max_batch > 1 and hasattr(pack.backend, "batched_engines"):  # the pack's own (--max-batch)
        engines = pack.backend.batched_engines(max_batch)
        if engines is not None:
            batched, batched_draft = engines.target, batched_draft or engines.drafter
            closers = [engines.target.close] + ([engines.drafter.engine.close] if engines.drafter is not None else [])
    if batched is not None:  # one run per step: speculation is turned down as the batch grows (batch_k.py)
        rows = PackRows(pack, batched, batched_draft, batched_draft.engine if batched_draft is not None else None)
        scheduler = Scheduler(config, batched, rows.open, rows.finish, batched,
                              batch_policy=batch_policy or BatchKCap(pack.manifest.k_max, max_batch,
                                                                     warmups=pack.backend.warmup_runs),
                              row_drafter=batched_draft,
                              row_prefill=batched if batched.caches.launch_bound else None,
                              open_solo=rows.open_solo if solo else None,
                              # where a run costs its launch a solo step beside the batch's would add to every
                              # iteration: the solo row joins the batch (scheduler.py)
                              solo_joins=batched.caches.launch_bound, on_join=rows.on_join)
    else:
        target = pack.backend.target()
        if not hasattr(target, "prefill_chunk"):
            raise SpecpackError("this backend's target cannot prefill in chunks", expected="an EngineBackend's Target",
                                found=type(target).__name__)
        rows = PackRows(pack, target)
        chunked: ChunkedTarget = target  # type: ignore[assignment]
        scheduler = Scheduler(config, chunked, rows.open, rows.finish, SerialVerifier(target, time.perf_counter),
                              batch_policy=batch_policy or NoCap())
    # the backend's captures on the batcher's thread (CUDA graphs are kept per thread): the shapes its steps run
    prepare = partial(pack.backend.precapture_thread, batched, batched_draft if batched is not None else None)
    batcher = Batcher(scheduler, pack.exclusive, max_waiting=max_waiting, prepare=prepare)
    batcher.closers.extend(closers)
    rows.batcher = batcher
    return batcher
