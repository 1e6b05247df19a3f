"""What a batched run costs against the same rows run one at a time: the batched static form (docs/batching.md) of a
model, timed per step shape on this machine. The cost model of batch_k.py's BatchKCap is V(B * S).

    python bench/batched_verify_cpu.py MODEL_DIR --graph-dir DIR [--threads 2] [--batches 1 2 4 8] [--rows 2 5]
        [--context 64] [--repeats 5] [--json bench/results/batched_verify_cpu.json]

Exports MODEL_DIR's batched graph with the greedy head into --graph-dir (once: reused when there), fills each of
max(batches) slots with `context` tokens, then for each B and S times one run of B rows x S tokens (batched) and B
runs of one row x S tokens (one at a time, the same graph at batch 1: what per-slot engines do), each from the same
cached length (median of --repeats). S = 2 is a greedy step (a token and its pad), S = k + 1 a verify of k drafts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from specpack.runtime.batched_target import BatchedGreedyTarget


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--graph-dir", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--rows", type=int, nargs="+", default=[2, 5])
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

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


if __name__ == "__main__":
    main()
