"""The scheduler's thread and the caller's handle: `Pack.submit(request) -> Handle` (docs/batching.md).

    caller threads ── submit(job) ──> inbox (bounded: max_batch rows + max_waiting; past it QueueFull)
                                        │
    batcher thread:  loop { inbox -> scheduler.add;  with pack.exclusive(): scheduler.step() }   (scheduler.py)
                                        │ on_text, finish: from this thread
    Handle: iterate its text pieces as they come, cancel(), result() -> Generation (or the error it ended with)

The thread starts with the Batcher, first runs `prepare` (the backend's captures on this thread: CUDA graphs are
kept per thread; jobs submitted meanwhile wait for it; if it raises, every job ends with that error), and sleeps while
nothing is in flight. `close()` finishes every job still in
flight with a SpecpackError and joins the thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Generic, TypeVar

from specpack.errors import SpecpackError
from specpack.runtime.scheduler import Scheduler

J = TypeVar("J")
T = TypeVar("T")  # what a handle's result is (the Pack's Generation)


class QueueFull(SpecpackError):
    """submit() while max_batch requests decode and max_waiting more wait (the server answers 429)."""


class Handle(Generic[T]):
    """A submitted request, from any thread: `for piece in handle` (its text as it is decoded, stop strings cut),
    `cancel()` (no further step starts; the result's finish_reason is "cancelled"), `result(timeout)`."""

    def __init__(self, on_text: Callable[[str], None] | None = None) -> None:
        self.cancel_event = threading.Event()  # the runtime's cancel: checked before every step of the request
        self._on_text = on_text
        self._pieces: queue.SimpleQueue[str | None] = queue.SimpleQueue()  # text pieces, then None
        self._done = threading.Event()
        self._result: T | None = None
        self._error: BaseException | None = None

    def cancel(self) -> None:
        self.cancel_event.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> T:
        """The finished request's result; what it raised (an exception from on_text, a closed pack), raised here."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the request did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def __iter__(self) -> Iterator[str]:
        """The text pieces as they are decoded, until the request ends (then result() says how)."""
        while (piece := self._pieces.get()) is not None:
            yield piece

    # --- the batcher thread's side ---

    def text(self, piece: str) -> None:
        self._pieces.put(piece)
        if self._on_text is not None:
            self._on_text(piece)

    def finish(self, result: T | None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self._pieces.put(None)
        self._done.set()


class Batcher(Generic[J]):
    """Owns a Scheduler on a thread of its own; `submit` from any thread."""

    def __init__(self, scheduler: Scheduler[J], exclusive: Callable[[], AbstractContextManager[Any]], *,
                 max_waiting: int, prepare: Callable[[], Any] | None = None) -> None:
        """exclusive: the pack's lock around each step (Pack.exclusive), so that direct users of the backend (bench)
        never run between a step's phases; prepare: run on the thread before its first step, under `exclusive` (the
        backend's captures: Backend.precapture_thread); what it raises ends every job (`broken`)."""
        if isinstance(max_waiting, bool) or not isinstance(max_waiting, int) or max_waiting < 0:
            raise SpecpackError("invalid max_waiting", expected="an integer >= 0", found=repr(max_waiting))
        self.scheduler, self.max_waiting = scheduler, max_waiting
        self._exclusive = exclusive
        self._cv = threading.Condition()
        self._inbox: list[J] = []
        self._in_flight = 0           # submitted and not finished (under _cv)
        self._closing = False
        self.steps = 0                # iterations run (tests and metrics)
        self.batch_sizes: list[int] = []  # rows decoding at each iteration (bounded: the last 4096)
        self.on_step: Callable[[int], None] | None = None  # after each iteration, with its rows (server metrics)
        self.closers: list[Callable[[], None]] = []  # run by close() once the thread ended (engines it owns)
        self._prepare = prepare
        self.broken: Exception | None = None  # what `prepare` raised: every job ends with it
        self.prepared = threading.Event()     # set once `prepare` returned or raised
        self._thread = threading.Thread(target=self._run, name="specpack-batcher", daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    @property
    def in_flight(self) -> int:
        with self._cv:
            return self._in_flight

    def submit(self, job: J) -> None:
        """Queue a job, or refuse it at once: QueueFull past max_batch + max_waiting in flight; closed: SpecpackError."""
        with self._cv:
            if self._closing:
                raise SpecpackError("the pack is closing", expected="submit before close()", found="submit after it")
            limit = self.scheduler.config.max_batch + self.max_waiting
            if self._in_flight >= limit:
                raise QueueFull(f"the batch is full ({self._in_flight} requests in flight)",
                                expected=f"at most {limit} in flight (max_batch {self.scheduler.config.max_batch} + "
                                         f"max_waiting {self.max_waiting})", found=f"request {self._in_flight + 1}",
                                hint="retry when a request finishes")
            self._in_flight += 1
            self._inbox.append(job)
            self._cv.notify()

    def finished(self) -> None:
        """A job ended (the scheduler's finisher calls this once per job)."""
        with self._cv:
            self._in_flight -= 1

    def close(self) -> None:
        """Finish every job in flight with a SpecpackError; join the thread."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()
            closers, self.closers = self.closers, []
            for closer in closers:
                closer()

    def _run(self) -> None:
        if self._prepare is not None:
            try:
                with self._exclusive():
                    self._prepare()
            except Exception as err:
                self.broken = err
        self.prepared.set()
        while True:
            with self._cv:
                while not self._inbox and self.scheduler.idle and not self._closing:
                    self._cv.wait()
                jobs, self._inbox = self._inbox, []
                closing = self._closing
            for job in jobs:
                self.scheduler.add(job)
            if self.broken is not None:
                self.scheduler.cancel_all(self.broken)
                if closing:
                    return
                continue
            if closing:
                self.scheduler.cancel_all(SpecpackError("the pack was closed while the request was in flight",
                                                        expected="requests that end before close()",
                                                        found="close() with requests in flight"))
                return
            try:
                with self._exclusive():
                    self.scheduler.step()
            except Exception as err:  # a bug above the rows (each row's own errors end that row alone): end them all
                self.scheduler.cancel_all(err)
            self.steps += 1
            if len(self.batch_sizes) >= 4096:
                del self.batch_sizes[:2048]
            self.batch_sizes.append(rows := len(self.scheduler.rows))
            if self.on_step is not None:
                self.on_step(rows)
