"""Up to --max-batch decodes at a time per pack: a bounded FIFO of jobs, a dispatcher task and a worker thread per
decoding job (docs/serving.md).

    handler ─ submit(prepared) ─> waiting (deque, <= max_queue; full: 429) ─> dispatcher ─> worker threads
       ^                                                              <= max_batch at once  pack.run(prepared,
       └──── job.events (asyncio.Queue): Piece*, then Done | Aborted | Failed <─────       on_text=..., cancel=job.halt)
                                                        Mailbox: one call_soon_threadsafe for the posts of a step

With max_batch 1, pack.run decodes each job alone (one at a time) on the one worker thread, where start() first has
the pack capture the shapes its jobs run (Pack.precapture_thread: CUDA graphs are kept per thread; its error is every
job's); with more, the pack batches (its scheduler,
runtime/scheduler.py, started by build_app): each worker's pack.run joins the running batch and waits for its end.

Stopping a decode early: abort(job, reason) (client gone, timeout, shutdown) sets job.halt, which is the runtime's
cancel event: the loop checks it before every step, so generation stops within one step and returns with its
statistics. A stop string (the request's `stop`) is cut and ends generation in the pack the same way (Pack.run).
The dispatcher starts a job only while fewer than max_batch workers run.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specpack.errors import SpecpackError
from specpack.runtime.request import PreparedRequest
from specpack.serve.api_errors import APIError, from_specpack
from specpack.serve.metrics import ServerMetrics

if TYPE_CHECKING:
    from specpack.runtime.batcher import Batcher
    from specpack.runtime.pack import Pack

log = logging.getLogger("specpack.serve")


@dataclass(frozen=True)
class Piece:
    text: str                      # new output text, stop strings already cut


@dataclass(frozen=True)
class Done:
    finish_reason: str             # "stop" (eos or a stop string) | "length"
    prompt_tokens: int
    completion_tokens: int
    stats: dict[str, Any]          # the runtime's statistics (Generation.stats)


@dataclass(frozen=True)
class Aborted:
    reason: str                    # "disconnect" | "timeout" | "shutdown"


@dataclass(frozen=True)
class Failed:
    error: APIError


Event = Piece | Done | Aborted | Failed


class Mailbox:
    """Events from the decoding threads to their jobs' queues on the event loop, one wake-up for many: the first post
    after a delivery schedules one (call_soon_threadsafe writes to the loop's self-pipe, a system call); the posts that
    come before it runs go with it, in order. A batch step's rows post their text together (16 rows: one wake-up a
    step, not 16)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue[Event], Event]] = []
        self._scheduled = False

    def post(self, events: asyncio.Queue[Event], event: Event) -> None:
        """From any thread."""
        with self._lock:
            self._pending.append((events, event))
            if self._scheduled:
                return
            self._scheduled = True
        self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            pending, self._pending, self._scheduled = self._pending, [], False
        for events, event in pending:
            events.put_nowait(event)


class Job:
    def __init__(self, request: PreparedRequest, mailbox: Mailbox) -> None:
        self.request = request
        self.arrival = time.monotonic()
        self.halt = threading.Event()      # the runtime's cancel event: set, no further step starts (abort, stop string)
        self.aborted: str | None = None
        self.finished = False              # the consumer has seen the last event
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.timer: asyncio.TimerHandle | None = None
        self._mailbox = mailbox

    def post(self, event: Event) -> None:
        """From the worker thread (or the batcher's)."""
        self._mailbox.post(self.events, event)

    async def next(self) -> Event:
        event = await self.events.get()
        if not isinstance(event, Piece):
            self.finished = True
        return event

    async def stream(self) -> AsyncIterator[Event]:
        """Every event up to and including the last one."""
        while not self.finished:
            yield await self.next()


class Decoder:
    """Owns the pack: jobs start in arrival order, at most max_batch at once, each in a worker thread."""

    def __init__(self, pack: Pack, metrics: ServerMetrics, *, max_queue: int, timeout_s: float,
                 max_batch: int = 1, batcher: Batcher[Any] | None = None) -> None:
        """batcher: the pack's running batch (Pack.start_batching) where max_batch > 1: its thread decodes every job."""
        self.pack, self.metrics, self.batcher = pack, metrics, batcher
        self.max_queue, self.timeout_s, self.max_batch = max_queue, timeout_s, max_batch
        self.draining = False
        self.stopping: asyncio.Event | None = None  # set when draining begins: request bodies still arriving get 503
        self._held = 0  # places held by requests being tokenized (place())
        self._waiting: deque[Job] = deque()
        self._wakeup: asyncio.Event | None = None
        self._current: set[Job] = set()  # decoding
        self._executor = ThreadPoolExecutor(max_workers=max_batch, thread_name_prefix="specpack-decode")
        self._precaptured: Future[int] | None = None  # max_batch 1: the worker's captures (start), before any job
        self._task: asyncio.Task[None] | None = None
        self._mailbox: Mailbox | None = None  # the event loop's (start)
        self._running: set[asyncio.Future[None]] = set()
        self._mean_s = 1.0  # recent decode time, for Retry-After
        self._progress = time.monotonic()  # a job started or ended, or a piece of text came (the health probe's watchdog)

    @property
    def idle(self) -> bool:
        """Nothing decoding, waiting or being tokenized (a health probe may use the pack without queueing behind a job)."""
        return not (self._current or self._waiting or self._held)

    @property
    def stalled_s(self) -> float | None:
        """Seconds since a decoding job last made progress (started, ended, or gave text); None while none decodes."""
        return time.monotonic() - self._progress if self._current else None

    # --- the event loop's side ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self.max_batch == 1:  # one worker thread decodes every job: its shapes captured there first (per thread)
            self._precaptured = self._executor.submit(self.pack.precapture_thread)
        self._wakeup = asyncio.Event()
        self.stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._mailbox = Mailbox(loop)
        self._task = loop.create_task(self._dispatch())

    async def ready(self) -> None:
        """Once the thread that decodes has captured its shapes (CUDA graphs are kept per thread: the batcher's `prepare`,
        or the worker's Pack.precapture_thread), so that the first requests do not wait for captures (8.4 s at 16
        clients on an H200: bench/README.md); what the captures raised is raised here (the server does not start)."""
        if self._precaptured is not None:
            await asyncio.wrap_future(self._precaptured)
        if self.batcher is not None:
            await asyncio.to_thread(self.batcher.prepared.wait)
            if self.batcher.broken is not None:
                raise self.batcher.broken

    @contextmanager
    def place(self) -> Iterator[Callable[[PreparedRequest], Job]]:
        """Hold a place in the queue while the request is tokenized and prepared, so that a request is refused (503,
        429) before its prompt costs memory; yields `enqueue(request) -> Job`. Held places count as waiting requests."""
        self._check_room()
        self._held += 1
        try:
            yield self._enqueue
        finally:
            self._held -= 1

    def submit(self, request: PreparedRequest) -> Job:
        """Queue a decode, or refuse it at once: 503 while shutting down, 429 when the queue is full."""
        with self.place() as enqueue:
            return enqueue(request)

    def _check_room(self) -> None:
        if self.draining or self._wakeup is None:
            raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
        pending = len(self._waiting) + self._held
        free_rows = max(0, self.max_batch - len(self._current))  # rows the batch can still take (max_batch 1: 1 or 0)
        if pending >= self.max_queue + max(0, free_rows - 1) and (self._current or pending):
            retry = max(1, math.ceil(self._mean_s * (pending + 1) / self.max_batch))
            raise APIError(429, f"the queue is full ({pending} requests waiting); retry in {retry} s",
                           type="rate_limit_error", code="queue_full", headers={"Retry-After": str(retry)})

    def _enqueue(self, request: PreparedRequest) -> Job:
        if self.draining or self._wakeup is None or self._mailbox is None:  # shutdown began while it was tokenized
            raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
        loop = asyncio.get_running_loop()
        job = Job(request, self._mailbox)
        job.timer = loop.call_later(self.timeout_s, self.abort, job, "timeout")
        self._waiting.append(job)
        self.metrics.queue_depth.set(len(self._waiting))
        self._wakeup.set()
        return job

    def abort(self, job: Job, reason: str) -> None:
        """Stop a job wherever it is (waiting or decoding); its consumer gets Aborted(reason)."""
        if job.finished or job.aborted is not None:
            return
        job.aborted = reason
        job.halt.set()
        if job in self._waiting:
            self._waiting.remove(job)
            self.metrics.queue_depth.set(len(self._waiting))
        self.metrics.cancelled.labels(reason).inc()
        job.events.put_nowait(Aborted(reason))

    def release(self, job: Job, reason: str = "disconnect") -> None:
        """The consumer is done with the job (answered, or gone): stop it if it still runs."""
        if job.timer is not None:
            job.timer.cancel()
        self.abort(job, "shutdown" if self.draining else reason)

    def drain(self, grace_s: float | None = None) -> None:
        """Shutting down: refuse new requests, abort the waiting ones; the decoding ones may go on for grace_s
        seconds (None: until they end), then are aborted (its client gets a 503, in the stream if one started).
        Only the first call counts: a signal and the server's shutdown both drain."""
        if self.draining:
            return
        self.draining = True
        if self.stopping is not None:
            self.stopping.set()
        for job in list(self._waiting):
            self.abort(job, "shutdown")
        if grace_s is not None:
            asyncio.get_running_loop().call_later(grace_s, self._abort_current)

    def _abort_current(self) -> None:
        for job in list(self._current):
            self.abort(job, "shutdown")

    async def close(self) -> None:
        """Abort everything, wait for the worker, stop the dispatcher."""
        self.drain()
        self._abort_current()
        if self._running:
            await asyncio.wait(self._running)
        if self._task is not None:
            self._task.cancel()
        self._executor.shutdown(wait=True)

    async def _dispatch(self) -> None:
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        while True:
            while not self._waiting or len(self._current) >= self.max_batch:
                self._wakeup.clear()
                await self._wakeup.wait()
            job = self._waiting.popleft()
            self._current.add(job)
            self.metrics.queue_depth.set(len(self._waiting))
            self.metrics.running.set(len(self._current))
            running = loop.run_in_executor(self._executor, self._decode, job)
            self._running.add(running)  # cancelling the dispatcher leaves the workers be: close() waits for them
            running.add_done_callback(lambda done, job=job: self._ended(job, done))  # type: ignore[misc]

    def _ended(self, job: Job, running: asyncio.Future[None]) -> None:
        """A worker returned (on the event loop): its place frees up for the next job."""
        self._running.discard(running)
        self._current.discard(job)
        self.metrics.running.set(len(self._current))
        if self._wakeup is not None:
            self._wakeup.set()

    # --- the worker thread's side ------------------------------------------------------------------------------

    def _decode(self, job: Job) -> None:
        """Run one job to its end, posting its events; never raises."""
        if job.halt.is_set():
            return
        started = self._progress = time.monotonic()
        try:
            done = self._generate(job)
            if done is not None:
                job.post(done)
        except SpecpackError as err:
            job.post(Failed(from_specpack(err)))
        except Exception as err:  # a bug: report it as a 500 without the traceback, log it with one
            log.exception("decode failed")
            job.post(Failed(APIError(500, f"internal error: {type(err).__name__}", type="server_error")))
        finally:
            self._progress = time.monotonic()
            self._mean_s = 0.8 * self._mean_s + 0.2 * (self._progress - started)

    def _generate(self, job: Job) -> Done | None:
        """The pack runs the job's request (its stop strings cut the text) with the job's halt as its cancel event;
        None when the job was aborted (its consumer already has Aborted)."""
        prepared, metrics = job.request, self.metrics
        last: float | None = None  # when on_text was last called

        def on_text(piece: str) -> None:
            nonlocal last
            now = time.monotonic()
            if last is None:
                metrics.ttft.observe(now - job.arrival)
            else:
                metrics.itl.observe(now - last)
            last = self._progress = now
            job.post(Piece(piece))

        if self._precaptured is not None:
            self._precaptured.result()  # done: it ran first on this worker; its error is every job's
        gen = self.pack.run(prepared, on_text=on_text, cancel=job.halt)
        metrics.prompt_tokens.inc(len(prepared.ids))
        metrics.generated_tokens.inc(len(gen.tokens))
        metrics.observe_stats(gen.stats)
        if gen.finish_reason == "cancelled":
            return None
        finish = "stop" if gen.finish_reason in ("eos", "stop") else "length"
        return Done(finish, len(prepared.ids), len(gen.tokens), gen.stats)
