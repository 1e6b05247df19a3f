"""ONNX Runtime's CPU MatMulNBits at 4 and 8 bits, blocks of 16 and 32, for 1 and k + 1 rows (issue 9's lead:
the GGUF-exact target carries its Q6_K tensors as 8-bit blocks of 16).

    python bench/matmulnbits_bits.py [--threads 2] [--reps 30] [--json bench/results/matmulnbits_bits.json]

One MatMulNBits node per case (accuracy level 4, as spec-export writes them; random weights, zero points
none for 8 bits as the GGUF path writes them, uint8 for 4 bits as ONNX Runtime's quantizer does), at the
shapes of the 1.5B target's lm_head (K 1536, N 151,936) and an MLP projection (K 1536, N 8960); median
milliseconds of --reps runs after 5 warm-ups, with the weights' bytes read over that time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from specpack.bench.report import cpu_model

SHAPES = {"lm_head": (1536, 151936), "mlp_up": (1536, 8960)}


def graph(k: int, n: int, bits: int, block: int) -> bytes:
    """MatMulNBits(A [M, K], B packed [N, K/block, block*bits/8], scales [N * K/block]) -> [M, N]."""
    rng = np.random.default_rng(0)
    blocks = k // block
    packed = rng.integers(0, 256, (n, blocks, block * bits // 8), dtype=np.uint8)
    scales = (rng.random(n * blocks, dtype=np.float32) * 0.01).astype(np.float32)
    inits = [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scales, "scales")]
    inputs = ["A", "B", "scales"]
    if bits == 4:  # uint8 zero points, two per byte
        inits.append(numpy_helper.from_array(np.full((n, (blocks + 1) // 2), 0x88, np.uint8), "zp"))
        inputs.append("zp")
    node = helper.make_node("MatMulNBits", inputs, ["Y"], domain="com.microsoft", K=k, N=n, bits=bits,
                            block_size=block, accuracy_level=4)
    g = helper.make_graph([node], "mmnb", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    return bytes(model.SerializeToString())


def time_case(model: bytes, k: int, m: int, threads: int, reps: int) -> float:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    a = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    times = []
    for i in range(5 + reps):
        t0 = time.perf_counter()
        session.run(None, {"A": a})
        if i >= 5:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rows", default="1,5")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "matmulnbits_bits.json")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    cases: list[dict[str, object]] = []
    out: dict[str, object] = {"machine": cpu_model(), "onnxruntime": ort.__version__,
                              "onnx": onnx.__version__, "threads": args.threads, "reps": args.reps, "cases": cases}
    print("| shape | bits | block | " + " | ".join(f"M={m} ms" for m in rows) + " | GB/s at M=1 |")
    for name, (k, n) in SHAPES.items():
        for bits, block in ((4, 32), (8, 32), (8, 16)):
            model = graph(k, n, bits, block)
            ms = {m: 1e3 * time_case(model, k, m, args.threads, args.reps) for m in rows}
            weight_bytes = n * k * bits / 8 + n * (k // block) * 4
            case: dict[str, object] = {"shape": name, "K": k, "N": n, "bits": bits, "block": block,
                    "ms": {str(m): v for m, v in ms.items()}, "weight_bytes": weight_bytes,
                    "gb_s_m1": weight_bytes / (ms[rows[0]] / 1e3) / 1e9}
            cases.append(case)
            print(f"| {name} | {bits} | {block} | " + " | ".join(f"{ms[m]:.2f}" for m in rows)
                  + f" | {weight_bytes / (ms[rows[0]] / 1e3) / 1e9:.1f} |", flush=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
