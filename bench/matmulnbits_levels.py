"""MatMulNBits at accuracy level 4 (int8 activations, as spec-export writes it) against level 1 (fp32 activations), by
the number of rows M, on ONNX Runtime's CPU EP: one int4 node (blocks of 32, zero points, random weights) per shape of
the 1.5B target, 2 threads, the mean of max(5, 200 / M) runs after 3 warm-ups (bench/README.md, "The static int4 pack
with its batched graphs").

    python bench/matmulnbits_levels.py [--rows 1 2 4 5 8 16 20 64 150 256] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from specpack.bench.report import machine_info

SHAPES = ((1536, 8960), (8960, 1536), (1536, 1536))  # K x N: up / gate, down, attention projections


def session(k: int, n: int, level: int, block: int = 32) -> ort.InferenceSession:
    rng = np.random.default_rng(0)
    blocks = k // block
    inits = [numpy_helper.from_array(rng.integers(0, 255, (n, blocks, block // 2), dtype=np.uint8), "B"),
             numpy_helper.from_array((rng.random(n * blocks) * 0.01).astype(np.float32), "S"),
             numpy_helper.from_array(rng.integers(0, 255, n * ((blocks + 1) // 2), dtype=np.uint8), "Z")]
    node = helper.make_node("MatMulNBits", ["A", "B", "S", "Z"], ["Y"], domain="com.microsoft", K=k, N=n, bits=4,
                            block_size=block, accuracy_level=level)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 5, 8, 16, 20, 64, 150, 256])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out: dict[str, object] = {"machine": machine_info(2), "ms": {}}
    for k, n in SHAPES:
        for level in (4, 1):
            s, times = session(k, n, level), {}
            for m in args.rows:
                x = np.random.default_rng(1).random((m, k), dtype=np.float32)
                for _ in range(3):
                    s.run(None, {"A": x})
                reps = max(5, 200 // m)
                t = time.perf_counter()
                for _ in range(reps):
                    s.run(None, {"A": x})
                times[m] = (time.perf_counter() - t) / reps * 1e3
            out["ms"][f"{k}x{n} level {level}"] = times  # type: ignore[index]
            print(f"{k} x {n} level {level}: " + " ".join(f"M{m} {ms:.2f}" for m, ms in times.items()))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
