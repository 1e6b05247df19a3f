"""The batched verify head alone (graphs/batched_head.py) against the batch-1 head run once per row, on ONNX Runtime's
CPU EP (a micro-benchmark: what the Scan over rows costs beside the per-row work it does).

    python bench/batched_head_cpu.py --json bench/results/batched_head_cpu.json

V = 151,936 (Qwen2.5), K = 4 drafts per row, logits N(0, 3^2), one-hot q, every row the same setting; B rows in one
run of the batched head against B runs of the batch-1 head (heads.verify_head_model). Median of --runs after one
warm-up, 2 threads.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from specpack.graphs import heads
from specpack.graphs.batched_head import batched_verify_head_model
from specpack.sampling import SamplingParams

SETTINGS = [SamplingParams(0.0), SamplingParams(1.0), SamplingParams(1.0, top_p=0.9)]


def _median_ms(fn: object, runs: int) -> float:
    fn()  # type: ignore[operator]
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t)
    return 1000 * float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    args = ap.parse_args()
    vocab, k = 151_936, 4
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    cpu = ["CPUExecutionProvider"]
    batched = ort.InferenceSession(batched_verify_head_model().SerializeToString(), options, providers=cpu)
    single = ort.InferenceSession(heads.verify_head_model().SerializeToString(), options, providers=cpu)
    rng = np.random.default_rng(0)
    rows = []
    for params in SETTINGS:
        for batch in args.batches:
            logits = (rng.standard_normal((batch, k + 1, vocab)) * 3).astype(np.float32)   # [B, K+1, V]
            ids = rng.integers(0, vocab, (batch, k + 1))                                    # [B, K+1]
            q = np.zeros((batch, k, vocab), np.float32)                                     # [B, K, V] one-hot
            for b in range(batch):
                q[b, np.arange(k), ids[b, 1:]] = 1.0
            u = rng.random((batch, k + 1), dtype=np.float32)
            one = params.graph_inputs()
            feeds = {"logits": logits, "input_ids": ids, "draft_probs": q, "uniforms": u,
                     "draft_counts": np.full(batch, k), "token_counts": np.full(batch, k + 1),
                     **{name: np.repeat(value, batch) for name, value in one.items()}}
            rows_feeds = [{"logits": logits[b : b + 1], "input_ids": ids[b : b + 1], "draft_probs": q[b : b + 1],
                           "uniforms": u[b : b + 1], **one} for b in range(batch)]
            together = _median_ms(lambda f=feeds: batched.run(None, f), args.runs)
            apart = _median_ms(lambda fs=rows_feeds: [single.run(None, f) for f in fs], args.runs)
            rows.append({"params": str(params), "batch": batch, "batched_ms": round(together, 2),
                         "one_at_a_time_ms": round(apart, 2)})
            print(rows[-1], flush=True)
    out = {"vocab": vocab, "k": k, "threads": 2, "load_average": os.getloadavg(), "rows": rows}
    args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
