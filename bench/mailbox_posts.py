"""What posting a batch step's text to the event loop costs the decoding thread (specpack/serve/decoder.py's Mailbox).

    python bench/mailbox_posts.py [--rows 16 64] [--steps 2000] [--rounds 3] [--json OUT]

An event loop runs on its own thread (as uvicorn's does beside the batcher's); the measuring thread plays the batcher:
each step posts one Piece per row, then sleeps 0.5 ms (a step's compute, the GIL released). Per step: the median time
of the posts, one call_soon_threadsafe per event (the server before the Mailbox) against Mailbox.post (one wake-up of
the loop for the posts made before a delivery runs); rounds alternate the two.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from pathlib import Path

from specpack.bench.report import machine_info
from specpack.serve.decoder import Event, Mailbox, Piece

STEP_S = 0.0005


def time_posts(kind: str, rows: int, steps: int) -> float:
    """Median microseconds a step's `rows` posts take the posting thread."""
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    queues: list[asyncio.Queue[Event]] = [asyncio.Queue() for _ in range(rows)]
    mailbox = Mailbox(loop)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        for queue in queues:
            if kind == "call_soon_threadsafe":
                loop.call_soon_threadsafe(queue.put_nowait, Piece("x"))
            else:
                mailbox.post(queue, Piece("x"))
        times.append(time.perf_counter() - t0)
        time.sleep(STEP_S)
    loop.call_soon_threadsafe(loop.stop)
    runner.join()
    loop.close()
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result: dict[str, object] = {"machine": machine_info(1), "steps": args.steps, "step_sleep_s": STEP_S, "rows": {}}
    for rows in args.rows:
        rounds: dict[str, list[float]] = {"call_soon_threadsafe": [], "mailbox": []}
        for _ in range(args.rounds):
            for kind in rounds:
                rounds[kind].append(time_posts(kind, rows, args.steps))
        medians = {kind: statistics.median(values) for kind, values in rounds.items()}
        result["rows"][str(rows)] = {"rounds_us": rounds, "median_us": medians,  # type: ignore[index]
                                      "ratio": medians["call_soon_threadsafe"] / medians["mailbox"]}
        print(f"{rows} rows: call_soon_threadsafe {medians['call_soon_threadsafe']:.1f} us a step, "
              f"Mailbox {medians['mailbox']:.1f} us ({medians['call_soon_threadsafe'] / medians['mailbox']:.2f}x)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
