"""What a batched run costs against the same rows run one at a time: the batched static form (docs/batching.md) of a
model, timed per step shape on this machine. The cost model of batch_k.py's BatchKCap is V(B * S).

    python bench/batched_verify_cpu.py MODEL_DIR --graph-dir DIR [--threads 2] [--batches 1 2 4 8] [--rows 2 5]
        [--context 64] [--repeats 5] [--json bench/results/batched_verify_cpu.json]

Exports MODEL_DIR's batched graph with the greedy head into --graph-dir (once: reused when there), fills each of
max(batches) slots with `context` tokens, then for each B and S times one run of B rows x S tokens (batched) and B
runs of one row x S tokens (one at a time, the same graph at batch 1: what per-slot engines do), each from the same
cached length (median of --repeats). S = 2 is a greedy step (a token and its pad), S = k + 1 a verify of k drafts.

    python bench/batched_verify_cpu.py --pack PACK [--batches 1 2 4] [--rows 2 5] [--models target draft] [--json OUT]

--pack times a pack's own batched graphs (spec-export --max-batch: int4 / int8 ones included) as `serve --max-batch`
opens them (cache width max_len + k_max + 1): the target's verify_batched.onnx with every row a greedy verify of
S - 1 drafts (its head and its lm_head over S rows), and the draft's draft_batched.onnx (greedy head).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from specpack.runtime.batched_target import BatchedGreedyTarget


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path, nargs="?")
    ap.add_argument("--graph-dir", type=Path)
    ap.add_argument("--pack", type=Path, help="time this pack's batched graphs (no export)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--rows", type=int, nargs="+", default=[2, 5])
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--models", nargs="+", choices=("target", "draft"), default=["target", "draft"],
                    help="--pack: which batched graphs to time")
    args = ap.parse_args()
    if args.pack is not None:
        return time_pack(args)
    if args.model is None or args.graph_dir is None:
        ap.error("MODEL and --graph-dir, or --pack")

    from specpack.export.batched_export import export_batched_graph
    from specpack.export.model_info import read_model_info
    from specpack.graphs.attach import build_batched_greedy_graph

    info = read_model_info(args.model)
    plain, head = args.graph_dir / "target.onnx", args.graph_dir / "target_greedy.onnx"
    if not head.exists():
        t = time.perf_counter()
        export_batched_graph(args.model, plain)
        build_batched_greedy_graph(plain, head, info.vocab_rows)  # moves the weights beside `head`
        print(f"exported in {time.perf_counter() - t:.0f} s")
    slots = max(args.batches)
    engine = BatchedGreedyTarget(head, num_layers=info.num_layers, kv_heads=info.kv_heads, head_dim=info.head_dim,
                                 width=args.context + max(args.rows) + 1, slots=slots, k_max=max(args.rows),
                                 threads=args.threads)
    rng = np.random.default_rng(0)
    engine.run({s: rng.integers(0, 1000, args.context) for s in range(slots)})  # every slot's context, one run
    engine.lengths = [args.context] * slots

    def timed(groups: list[dict[int, np.ndarray]]) -> float:
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            for tokens in groups:
                engine.run(tokens)
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    results = []
    for seq in args.rows:
        for batch in args.batches:
            rows = {s: rng.integers(0, 1000, seq) for s in range(batch)}
            batched = timed([rows])
            alone = timed([{s: t} for s, t in rows.items()])
            results.append({"B": batch, "S": seq, "batched_ms": 1e3 * batched, "one_at_a_time_ms": 1e3 * alone,
                            "speedup": alone / batched})
            print(json.dumps(results[-1]))
    if args.json is not None:
        args.json.write_text(json.dumps({"model": str(args.model), "context": args.context, "threads": args.threads,
                                         "results": results}, indent=1) + "\n")


class _Greedy:
    """What BatchedTarget reads of a row's DecodeState for a greedy verify."""

    def __init__(self, slot: int) -> None:
        from specpack import names

        self.slot = slot
        self.params = SimpleNamespace(greedy=True)
        self.sampling_inputs = {names.TEMPERATURE: [0.0], names.TOP_K: [0], names.TOP_P: [1.0]}


def time_pack(args: argparse.Namespace) -> None:
    """The pack's batched target (every row a greedy verify of S - 1 drafts) and draft, B rows in one run against
    the same rows one run each, from the same cached length, with the serving width."""
    from specpack.contract.manifest import parse_manifest, read_manifest_bytes
    from specpack.runtime.batched_verify import BatchedTarget

    m = parse_manifest(read_manifest_bytes(args.pack))
    width, slots, k_max = m.max_len + m.k_max + 1, max(args.batches), max(m.k_max, max(args.rows) - 1)
    rng = np.random.default_rng(0)
    results = []
    for role, entry in (("target", m.target), ("draft", m.draft_model)):
        if entry is None or entry.batched is None or role not in args.models:
            continue
        shape = {"num_layers": entry.num_layers, "kv_heads": entry.kv_heads, "head_dim": entry.head_dim,
                 "width": width, "slots": slots, "k_max": k_max, "threads": args.threads}
        graph = args.pack / entry.batched.graph.path
        engine: BatchedTarget | BatchedGreedyTarget = (
            BatchedTarget(graph, vocab_size=m.vocab_size, **shape) if role == "target" else BatchedGreedyTarget(graph, **shape))
        engine.run({s: rng.integers(0, 1000, args.context) for s in range(slots)})
        engine.lengths = [args.context] * slots

        def one(rows: dict[int, np.ndarray], engine: BatchedTarget | BatchedGreedyTarget = engine) -> None:
            if isinstance(engine, BatchedTarget):  # a verify: the head reads its S - 1 drafts (the lm_head over S rows)
                verifies: Any = {s: (_Greedy(s), SimpleNamespace(k=len(t) - 1)) for s, t in rows.items()}  # duck-typed
                engine._run(rows, verifies)
            else:
                engine.run(rows)

        def timed(groups: list[dict[int, np.ndarray]], one: Callable[[dict[int, np.ndarray]], None] = one) -> float:
            one(groups[0])  # warm-up of this shape
            times = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                for rows in groups:
                    one(rows)
                times.append(time.perf_counter() - t)
            return statistics.median(times)

        for seq in args.rows:
            for batch in args.batches:
                rows = {s: rng.integers(0, 1000, seq) for s in range(batch)}
                batched = timed([rows])
                alone = timed([{s: t} for s, t in rows.items()])
                results.append({"model": role, "B": batch, "S": seq, "batched_ms": 1e3 * batched,
                                "one_at_a_time_ms": 1e3 * alone, "speedup": alone / batched,
                                "per_row_ms": 1e3 * batched / batch})
                print(json.dumps(results[-1]))
        engine.close()
    if args.json is not None:
        args.json.write_text(json.dumps({"pack": str(args.pack), "width": width, "context": args.context,
                                         "threads": args.threads, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
