"""The decoder's Mailbox (specpack/serve/decoder.py): events posted from other threads reach each job's queue on the
event loop in the order they were posted, and the posts made before a delivery runs share one wake-up of the loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from specpack.serve.decoder import Done, Event, Mailbox, Piece


class CountingLoop:
    """The running loop, counting call_soon_threadsafe (each one a write to its self-pipe)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.wakeups = loop, 0

    def call_soon_threadsafe(self, callback: Any, *args: Any) -> Any:
        self.wakeups += 1
        return self.loop.call_soon_threadsafe(callback, *args)


def test_posts_from_threads_arrive_in_order_with_one_wakeup_per_delivery() -> None:
    async def main() -> tuple[list[list[Event]], int]:
        loop = CountingLoop(asyncio.get_running_loop())
        mailbox = Mailbox(loop)  # type: ignore[arg-type]  # what it calls of a loop
        queues: list[asyncio.Queue[Event]] = [asyncio.Queue() for _ in range(16)]

        def step_rows() -> None:  # a batch's steps on the batcher's thread: every row's text, then each row's end
            for step in range(50):
                for row, queue in enumerate(queues):
                    mailbox.post(queue, Piece(f"{row}:{step}"))
            for queue in queues:
                mailbox.post(queue, Done("length", 1, 50, {}))

        thread = threading.Thread(target=step_rows)
        thread.start()
        await asyncio.to_thread(thread.join)
        await asyncio.sleep(0)  # the last delivery
        got = []
        for queue in queues:
            events = []
            while not queue.empty():
                events.append(queue.get_nowait())
            got.append(events)
        return got, loop.wakeups

    got, wakeups = asyncio.run(main())
    for row, events in enumerate(got):
        assert events == [*(Piece(f"{row}:{step}") for step in range(50)), Done("length", 1, 50, {})]
    assert 1 <= wakeups < 16 * 51  # posts before a delivery share its wake-up (one post, one wake-up would be 816)
    print(f"{wakeups} wake-ups for {16 * 51} posts")
