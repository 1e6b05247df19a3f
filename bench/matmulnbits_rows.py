"""What a verify over k + 1 rows costs against a step over one, per weight format, on ONNX Runtime's CPU EP.

    python bench/matmulnbits_rows.py [--layers 28] [--rows 1,2,3,4,5,9] [--formats ...] [--threads 2] [--json OUT]

A chain of the 1.5B target's MLP matmuls (K 1536 -> N 8960 -> 1536, `--layers` times, random weights), so the
weights do not fit the cache and every run reads them from memory, as a decode step does (bench/matmulnbits_bits.py
times single nodes, whose weights can stay cached). Formats:

    nbits4_b32_zp    MatMulNBits 4-bit, blocks of 32, uint8 zero points (int4; the core of GGUF-exact Q4_K)
    nbits4_b32_sym   the same without zero points
    nbits4_b128_zp   4-bit, blocks of 128, zero points
    nbits8_b16       8-bit, blocks of 16 (GGUF-exact Q6_K)
    nbits8_b32       8-bit, blocks of 32 (int8, GGUF-exact Q8_0)
    dq8              DynamicQuantizeMatMul: int8 weights per column, activations quantized per tensor (MLAS QGEMM)
    fp32             MatMul (not in the default list: 28 layers of fp32 weights pass protobuf's 2 GB limit;
                     `--formats fp32 --layers 14` and double the times)

MatMulNBits at accuracy level 4 (int8 activations per block), as spec-export writes it. Median milliseconds of
`--reps` runs after two warm-ups, per row count; the ratio to one row is what v(k) pays for these weights.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HIDDEN, INTERMEDIATE = 1536, 8960
FORMATS: dict[str, tuple[int, int, bool] | str] = {
    "nbits4_b32_zp": (4, 32, True), "nbits4_b32_sym": (4, 32, False), "nbits4_b128_zp": (4, 128, True),
    "nbits8_b16": (8, 16, False), "nbits8_b32": (8, 32, False), "dq8": "dq8", "fp32": "fp32",
}


def _matmul(fmt: tuple[int, int, bool] | str, name: str, x: str, k: int, n: int,
            rng: np.random.Generator) -> tuple[list[Any], list[Any]]:
    """(nodes, initializers) computing name = x @ W, W [k, n] in format `fmt`."""
    if fmt == "fp32":
        w = numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32) * 0.01, f"{name}.w")
        return [helper.make_node("MatMul", [x, w.name], [name])], [w]
    if fmt == "dq8":
        w = numpy_helper.from_array(rng.integers(-127, 128, (k, n), dtype=np.int8), f"{name}.w")
        s = numpy_helper.from_array(rng.random(n, dtype=np.float32) * 0.01, f"{name}.s")
        return [helper.make_node("DynamicQuantizeMatMul", [x, w.name, s.name], [name], domain="com.microsoft")], [w, s]
    assert not isinstance(fmt, str)
    bits, block, zero_points = fmt
    blocks = k // block
    inits = [numpy_helper.from_array(rng.integers(0, 256, (n, blocks, block * bits // 8), dtype=np.uint8), f"{name}.b"),
             numpy_helper.from_array(rng.random(n * blocks, dtype=np.float32) * 0.01, f"{name}.s")]
    if zero_points:
        per = 8 // bits
        inits.append(numpy_helper.from_array(np.full((n, -(-blocks // per)), 0x88, np.uint8), f"{name}.z"))
    node = helper.make_node("MatMulNBits", [x, *(t.name for t in inits)], [name], domain="com.microsoft", K=k, N=n,
                            bits=bits, block_size=block, accuracy_level=4)
    return [node], inits


def chain(fmt: tuple[int, int, bool] | str, layers: int) -> bytes:
    """x [M, H] -> (up [H, I], down [I, H]) x layers, in one graph."""
    rng = np.random.default_rng(0)
    nodes: list[Any] = []
    inits: list[Any] = []
    x = "x"
    for layer in range(layers):
        for j, (k, n) in enumerate(((HIDDEN, INTERMEDIATE), (INTERMEDIATE, HIDDEN))):
            more_nodes, more_inits = _matmul(fmt, f"y{layer}_{j}", x, k, n, rng)
            nodes, inits, x = nodes + more_nodes, inits + more_inits, f"y{layer}_{j}"
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", HIDDEN])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["M", HIDDEN])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    return bytes(model.SerializeToString())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--rows", default="1,2,3,4,5,9")
    ap.add_argument("--formats", default=",".join(f for f in FORMATS if f != "fp32"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    from specpack.bench.report import machine_info

    rows = [int(r) for r in args.rows.split(",")]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    results: dict[str, dict[str, float]] = {}
    print("| format | " + " | ".join(f"M={m} ms" for m in rows) + " | " + " | ".join(f"M={m} / M=1" for m in rows[1:]) + " |")
    for name in args.formats.split(","):
        session = ort.InferenceSession(chain(FORMATS[name], args.layers), opts, providers=["CPUExecutionProvider"])
        ms = {}
        for m in rows:
            x = np.random.default_rng(1).standard_normal((m, HIDDEN)).astype(np.float32) * 0.01
            times = []
            for i in range(2 + args.reps):
                t0 = time.perf_counter()
                session.run(None, {"x": x})
                if i >= 2:
                    times.append(time.perf_counter() - t0)
            ms[str(m)] = 1e3 * statistics.median(times)
        results[name] = ms
        del session
        print(f"| {name} | " + " | ".join(f"{ms[str(m)]:.1f}" for m in rows) + " | "
              + " | ".join(f"{ms[str(m)] / ms[str(rows[0])]:.2f}" for m in rows[1:]) + " |", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": machine_info(args.threads), "onnxruntime": ort.__version__,
                                         "layers": args.layers, "weights_per_layer": 2 * HIDDEN * INTERMEDIATE,
                                         "reps": args.reps, "ms": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
