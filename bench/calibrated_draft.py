"""Cost in acceptance of a calibrated INT8 (int8-sq) or FP8 draft against the fp32 draft, on the real pair.

    flock /tmp/specpack-heavy.lock python bench/calibrated_draft.py --plain-dir DIR --draft-dir D --target-dir T \\
        --calib-prompts gsm8k_test.jsonl --prompts HumanEval.jsonl.gz mt_bench_question.jsonl --methods int8-sq fp8 \\
        --work /dev/shm/calib --json bench/results/calibrated_draft.json

DIR holds the plain fp32 concat graphs draft.onnx and target.onnx (spec-export's intermediates). The draft is
quantized (calibration/qdq.py, calibration set from --calib-prompts, seeded), then quantize/fidelity.py
replays greedy speculation from teacher-forced passes: alpha and tau of the quantized and of the fp32 draft
for the fp32 target's greedy continuations of each prompt file's first --limit prompts. Optionally
(--target-methods) the target is quantized too and its top-1 agreement and mean KL against the fp32 target
are measured on the same prompts, teacher-forced on the fp32 target's greedy continuations (the Q/DQ graph runs
once a prompt: generating with it on the CPU took longer than a device call allows).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from specpack.bench.report import cpu_model
from specpack.calibration.qdq import quantize_calibrated
from specpack.calibration.sets import calibration_set
from specpack.export.tokenizer_export import SUBDIR, write_tokenizer
from specpack.quantize.fidelity import FidelityInputs, measure_fidelity, prompt_texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plain-dir", type=Path, required=True)
    ap.add_argument("--draft-dir", type=Path, required=True, help="the draft's model dir (tokenizer for calibration)")
    ap.add_argument("--target-dir", type=Path, required=True, help="the target's model dir (the pack's tokenizer)")
    ap.add_argument("--calib-prompts", required=True)
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--prompts", nargs="+", required=True)
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--methods", nargs="*", default=["int8-sq", "fp8"])
    ap.add_argument("--target-methods", nargs="*", default=[])
    ap.add_argument("--work", type=Path, required=True, help="scratch dir for the quantized graphs (deleted after)")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--machine", help="the machine, in words, for the record (default: the processor and its cores)")
    args = ap.parse_args()

    args.work.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = json.loads(args.json.read_text()) if args.json.is_file() else {}
    out.update({"machine": args.machine or f"{cpu_model()}, {os.cpu_count()} cores",
                "plain": str(args.plain_dir), "calib_prompts": Path(args.calib_prompts).name,
                "calib_samples": args.calib_samples, "limit": args.limit, "new_tokens": args.new_tokens})
    tokenizer = write_tokenizer(args.target_dir, args.work)
    try:
        for role, methods, model_dir in (("draft", args.methods, args.draft_dir),
                                         ("target", args.target_methods, args.target_dir)):
            calib = calibration_set(args.calib_prompts, args.calib_samples, 0, model_dir)
            plain = args.plain_dir / f"{role}.onnx"
            for method in methods:
                graph = args.work / f"{role}.{method}.onnx"
                start = time.perf_counter()
                record = quantize_calibrated(plain, graph, method, calib, cache=False)
                entry = out.setdefault(role, {}).setdefault(method, {})
                entry["quantization"] = {**record, "wall_s": round(time.perf_counter() - start, 1)}
                for prompt_file in args.prompts:
                    inputs = FidelityInputs(
                        target=graph if role == "target" else args.plain_dir / "target.onnx",
                        draft=graph if role == "draft" else args.plain_dir / "draft.onnx",
                        target_reference=plain if role == "target" else None,
                        draft_reference=plain if role == "draft" else None,
                        tokenizer_dir=args.work / SUBDIR, eos_ids=tuple(tokenizer.eos_token_ids), ks=(1, 2, 4, 8),
                        new_tokens=args.new_tokens, continuations="reference" if role == "target" else "target")
                    result = measure_fidelity(inputs, prompt_texts(prompt_file, args.limit))
                    entry[Path(prompt_file).name.split(".")[0]] = result
                    print(role, method, Path(prompt_file).name, json.dumps(result.get(role), default=str)[:600],
                          flush=True)
                    args.json.write_text(json.dumps(out, indent=1))
                for f in args.work.glob(f"{role}.{method}.onnx*"):
                    f.unlink()
    finally:
        shutil.rmtree(args.work, ignore_errors=True)
    args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
