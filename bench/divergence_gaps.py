"""Where a GPU run's greedy outputs left AR's, the fp32 target's top-2 logit gap there (transformers, on the CPU):

    python bench/divergence_gaps.py RESULT.json --target-dir HF_DIR --tokenizer PACK/tokenizer \\
        --prompts mt_bench_question.jsonl HumanEval.jsonl.gz [--phases headtrees trees] [--out OUT.json]

RESULT.json: bench/gpu_head.py's output; each phase's rows hold per configuration the tokens, and "ar" the AR
tokens. For every configuration that differs, the first differing position, both tokens, and the fp32 target's top-2
there (specpack.bench.peer_hf.logit_gaps, the bench's own gap, in a child process): a gap near 0 is a rounding tie the
fp16 kernels broke, not a rule error.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def main() -> None:
    from specpack.bench.peer_hf import logit_gaps
    from specpack.prompts import read_prompts
    from specpack.runtime.tokenizer import PackTokenizer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result")
    parser.add_argument("--target-dir", required=True, help="the target's Hugging Face dir (a GGUF's conversion)")
    parser.add_argument("--tokenizer", required=True, help="a pack's tokenizer dir (the target's)")
    parser.add_argument("--prompts", nargs="+", required=True, help="the prompt files the run read")
    parser.add_argument("--phases", nargs="+", default=["headtrees", "trees"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out")
    args = parser.parse_args()
    with open(args.result) as f:
        result = json.load(f)
    prompts = {p.id: p for p in read_prompts(args.prompts)}
    tokenizer = PackTokenizer.load(args.tokenizer)
    found: list[dict[str, Any]] = []
    requests: list[dict[str, Any]] = []
    for phase in args.phases:
        for row in result.get(phase, {}).get("rows", []):
            ar = row["ar"]["tokens"]
            prompt = prompts[row["id"]]
            ids = tokenizer.encode_chat(prompt.text) if prompt.chat else tokenizer.encode(prompt.text)
            for label, run in row.items():
                if not isinstance(run, dict) or "tokens" not in run or run["tokens"] == ar:
                    continue
                i = next((j for j, (a, b) in enumerate(zip(ar, run["tokens"], strict=False)) if a != b), None)
                found.append({"phase": phase, "id": row["id"], "config": label, "position": i,
                              **({"note": "one output is a prefix"} if i is None else
                                 {"ar_token": ar[i], "other_token": run["tokens"][i]})})
                if i is not None:
                    requests.append({"prompt": len(found) - 1, "position": i, "prefix": ids + ar[:i]})
    gaps, note = logit_gaps(args.target_dir, requests, threads=args.threads, dtype="fp32")
    for gap in gaps:
        record = found[gap["prompt"]]
        record |= {"fp32_top2": gap["top2_tokens"], "fp32_top2_logits": [round(v, 4) for v in gap["top2_logits"]],
                   "fp32_gap": round(gap["gap"], 4)}
    for record in found:
        print(json.dumps(record))
    if note:
        print(note)
    if args.out:
        with open(args.out, "w") as out:
            json.dump({"result": args.result, "target_dir": args.target_dir, "divergences": found, "note": note}, out,
                      indent=1)


if __name__ == "__main__":
    main()
