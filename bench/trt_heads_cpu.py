"""The verify head alone, onnxruntime form against tensorrt form, on ONNX Runtime's CPU EP (a micro-benchmark).

    python bench/trt_heads_cpu.py --json bench/results/trt_heads_cpu.json

V = 151,936 (Qwen2.5), k = 4, logits N(0, 3^2) (a flat distribution: top-p needs more than the first
candidates, so the tensorrt form's bisection runs). Median of 15 runs after one warm-up, 2 threads. What the
CPU says about the form's extra work, not what TensorRT on a GPU would take.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from specpack.graphs import heads, sampling_trt
from specpack.sampling import SamplingParams

SETTINGS = [SamplingParams(0.0), SamplingParams(1.0), SamplingParams(0.8, top_k=50), SamplingParams(1.0, top_p=0.9),
            SamplingParams(1.0, top_p=0.999)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    vocab, k = 151_936, 4
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((1, k + 1, vocab)) * 3).astype(np.float32)  # [1, k+1, V]
    ids = rng.integers(0, vocab, (1, k + 1))  # [1, k+1]
    q = np.zeros((1, k, vocab), np.float32)  # [1, k, V]: one-hot drafts
    q[0, np.arange(k), ids[0, 1:]] = 1.0
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    rows = []
    for form, transform in (("onnxruntime", None), ("tensorrt", sampling_trt.transform)):
        model = heads.verify_head_model(vocab=vocab, **({} if transform is None else {"transform": transform}))
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for params in SETTINGS:
            feeds = {"logits": logits, "input_ids": ids, "draft_probs": q,
                     "uniforms": rng.random((1, k + 1), dtype=np.float32), **params.graph_inputs()}
            session.run(None, feeds)
            times = []
            for _ in range(args.runs):
                start = time.perf_counter()
                session.run(None, feeds)
                times.append(time.perf_counter() - start)
            rows.append({"form": form, "temperature": params.temperature, "top_k": params.top_k,
                         "top_p": params.top_p, "median_ms": round(float(np.median(times)) * 1e3, 2)})
            print(rows[-1], flush=True)
    args.json.write_text(json.dumps({"machine": "2-core AMD EPYC CPU, shared", "onnxruntime": ort.__version__,
                                     "vocab": vocab, "k": k, "runs": args.runs, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
