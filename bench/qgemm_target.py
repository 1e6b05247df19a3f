"""A target with int8 weights per column and int8 activations (ONNX Runtime's dynamic quantization, MLAS QGEMM):
how far it moves from the fp32 target, and what a verify of k + 1 rows costs against a step of one.

    python bench/qgemm_target.py MODEL_DIR --work DIR [--prompts FILE --limit 8] [--rows 1,2,3,4,5]
        [--context 128] [--exclude-k 8960] [--threads 2] [--json OUT]

bench/matmulnbits_rows.py found MatMulNBits (every block layout) paying 2-2.9x one row for 4-5 rows on an AVX2 CPU
without VNNI, and `DynamicQuantizeMatMul` 1.2-1.45x. This puts the whole target in that format:

1. MODEL_DIR's plain fp32 graph (export/'s contract; `DIR/target.onnx`, reused when present);
2. `onnxruntime.quantization.quantize_dynamic`: every MatMul with constant weights (the lm_head included;
   `--exclude-k` keeps in fp32 those whose input width K is listed, e.g. the MLP's down projection: K = the
   intermediate size) with int8 weights per column, activations quantized per tensor at run time
   (`DIR/target_dq8.onnx`);
3. fidelity (quantize/fidelity.py): top-1 agreement and mean KL of the quantized target against the fp32 one,
   teacher-forced on the fp32 target's greedy continuations;
4. the step cost of each graph: median milliseconds of a step of M rows on a cache of `--context` tokens.

Not a pack mode: an experiment whose numbers say whether one is worth building.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from specpack import names


def _quantize(plain: Path, out: Path, exclude_k: list[int]) -> dict[str, Any]:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(plain), load_external_data=False)
    weights = {t.name: tuple(t.dims) for t in model.graph.initializer}
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights]  # constant B [K, N]
    excluded = [n.name for n in matmuls if weights[n.input[1]][0] in exclude_k]
    start = time.perf_counter()
    quantize_dynamic(plain, out, weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"],
                     nodes_to_exclude=excluded, use_external_data_format=True)
    return {"matmuls": len(matmuls), "excluded": len(excluded), "seconds": round(time.perf_counter() - start, 1),
            "bytes": sum(p.stat().st_size for p in out.parent.glob(out.name + "*"))}


def _step_ms(graph: Path, rows: list[int], context: int, threads: int, reps: int) -> dict[str, float]:
    """Median ms of one step of M rows after a cache of `context` tokens, per M."""
    import onnxruntime as ort

    from specpack.runtime.ort_session import session_options

    session = ort.InferenceSession(str(graph), sess_options=session_options(threads), providers=["CPUExecutionProvider"])
    past = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    rng = np.random.default_rng(0)
    out: dict[str, float] = {}
    for m in rows:
        feeds: dict[str, np.ndarray] = {
            names.INPUT_IDS: rng.integers(0, 100, (1, m), dtype=np.int64),
            names.POSITION_IDS: np.arange(context, context + m, dtype=np.int64)[None],
            names.ATTENTION_MASK: np.ones((1, context + m), np.int64),
        }
        for spec in past:  # [1, kv_heads, context, head_dim]
            feeds[spec.name] = rng.standard_normal((1, spec.shape[1], context, spec.shape[3])).astype(np.float32)
        times = []
        for i in range(2 + reps):
            t0 = time.perf_counter()
            session.run([names.LOGITS], feeds)
            if i >= 2:
                times.append(time.perf_counter() - t0)
        out[str(m)] = round(1e3 * statistics.median(times), 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--prompts", default=None, help="a prompt file (specpack/prompts.py's formats); default: built-in")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--rows", default="1,2,3,4,5")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--exclude-k", default="", help="comma-separated input widths K of MatMuls kept in fp32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    from specpack.bench.report import machine_info
    from specpack.export.tokenizer_export import write_tokenizer
    from specpack.export.torch_export import export_plain_graph
    from specpack.quantize.fidelity import FidelityInputs, measure_fidelity, prompt_texts

    args.work.mkdir(parents=True, exist_ok=True)
    plain, quantized = args.work / "target.onnx", args.work / "target_dq8.onnx"
    if not plain.exists():
        export_plain_graph(args.model_dir, plain)
    tokenizer = write_tokenizer(args.model_dir, args.work)  # DIR/tokenizer/
    exclude_k = [int(k) for k in args.exclude_k.split(",") if k]
    result: dict[str, Any] = {"machine": machine_info(args.threads), "model_dir": str(args.model_dir),
                              "exclude_k": exclude_k}
    result["quantize"] = _quantize(plain, quantized, exclude_k)
    print("quantized:", result["quantize"], flush=True)
    rows = [int(r) for r in args.rows.split(",")]
    result["step_ms"] = {label: _step_ms(graph, rows, args.context, args.threads, args.reps)
                         for label, graph in (("dq8", quantized), ("fp32", plain))}
    print("step ms:", result["step_ms"], flush=True)
    inputs = FidelityInputs(target=quantized, draft=quantized, target_reference=plain, draft_reference=None,
                            tokenizer_dir=args.work / "tokenizer", eos_ids=tuple(tokenizer.eos_token_ids), ks=(),
                            threads=args.threads,
                            new_tokens=args.new_tokens, continuations="reference")
    prompts = prompt_texts(args.prompts, args.limit)
    result["fidelity"] = measure_fidelity(inputs, prompts)["target"]
    print("fidelity:", result["fidelity"], flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
