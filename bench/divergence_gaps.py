"""Where a GPU run's greedy outputs left AR's, the fp32 target's top-2 logit gap there (transformers, on the CPU):

    python bench/divergence_gaps.py RESULT.json --target-dir HF_DIR --tokenizer PACK/tokenizer \\
        --prompts mt_bench_question.jsonl HumanEval.jsonl.gz [--phases headtrees trees] [--out OUT.json]

RESULT.json: bench/gpu_head.py's output; each phase's rows hold per configuration the tokens, and "ar" the AR
tokens. For every configuration that differs, the first differing position, both tokens, the fp32 top-3 and the
logit of AR's token minus the other's: a gap near 0 is a rounding tie the fp16 kernels broke, not a rule error.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from specpack.prompts import read_prompts
    from specpack.runtime.tokenizer import PackTokenizer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result")
    parser.add_argument("--target-dir", required=True, help="the target's Hugging Face dir (a GGUF's conversion)")
    parser.add_argument("--tokenizer", required=True, help="a pack's tokenizer dir (the target's)")
    parser.add_argument("--prompts", nargs="+", required=True, help="the prompt files the run read")
    parser.add_argument("--phases", nargs="+", default=["headtrees", "trees"])
    parser.add_argument("--out")
    args = parser.parse_args()
    with open(args.result) as f:
        result = json.load(f)
    prompts = {p.id: p for p in read_prompts(args.prompts)}
    tokenizer = PackTokenizer.load(args.tokenizer)
    model = AutoModelForCausalLM.from_pretrained(args.target_dir, dtype=torch.float32).eval()
    found: list[dict[str, Any]] = []
    for phase in args.phases:
        for row in result.get(phase, {}).get("rows", []):
            ar = row["ar"]["tokens"]
            prompt = prompts[row["id"]]
            ids = tokenizer.encode_chat(prompt.text) if prompt.chat else tokenizer.encode(prompt.text)
            for label, run in row.items():
                if not isinstance(run, dict) or "tokens" not in run or run["tokens"] == ar:
                    continue
                other = run["tokens"]
                i = next((j for j, (a, b) in enumerate(zip(ar, other, strict=False)) if a != b), None)
                if i is None:
                    found.append({"phase": phase, "id": row["id"], "config": label, "note": "one output is a prefix"})
                    continue
                with torch.no_grad():
                    logits = model(torch.tensor([ids + ar[:i]])).logits[0, -1]
                top = torch.topk(logits, 3)
                found.append({"phase": phase, "id": row["id"], "config": label, "position": i, "ar_token": ar[i],
                              "other_token": other[i], "fp32_top3": top.indices.tolist(),
                              "fp32_top3_logits": [round(float(v), 4) for v in top.values],
                              "fp32_ar_minus_other": round(float(logits[ar[i]] - logits[other[i]]), 4)})
                print(json.dumps(found[-1]))
    if args.out:
        with open(args.out, "w") as out:
            json.dump({"result": args.result, "target_dir": args.target_dir, "divergences": found}, out, indent=1)


if __name__ == "__main__":
    main()
