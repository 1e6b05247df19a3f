"""Greedy output of a GGUF-exact pack against the dequantized fp32 pack of the same GGUF files, prompt by prompt.

    python bench/gguf_exact_vs_fp32.py EXACT_PACK FP32_PACK --prompts FILE [--limit 8] [--max-new-tokens 64]
        [--json OUT]

Both packs decode each prompt with the target alone (k = 0, greedy; speculative output equals it, which the
bench checks). Where the outputs first differ, the fp32 target's top-2 logit gap there (transformers, the
converted fp32 model the fp32 pack came from, in a child process) says whether it is a near-tie. The packs
load one at a time.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

Decoded = tuple[list[list[int]], list[list[int]], dict[str, Any]]  # prompt ids, outputs, the target's source record


def _decode(pack_dir: Path, prompts: list[Any], max_new_tokens: int, threads: int) -> Decoded:
    import specpack

    pack = specpack.load(pack_dir, threads=threads)
    try:
        ids = [pack.encode(p.text, chat=p.chat) for p in prompts]
        outputs = [pack.generate(x, max_new_tokens, k=0).tokens for x in ids]
        return ids, outputs, dict(pack.manifest.target.source)
    finally:
        pack.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exact", type=Path)
    parser.add_argument("fp32", type=Path)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from specpack.bench import peer_hf
    from specpack.bench.runner import first_divergence
    from specpack.prompts import read_prompts

    prompts = read_prompts([args.prompts], args.limit)
    ids, exact, _ = _decode(args.exact, prompts, args.max_new_tokens, args.threads)
    ids_fp32, fp32, source = _decode(args.fp32, prompts, args.max_new_tokens, args.threads)
    assert ids == ids_fp32, "the two packs encode the prompts differently"
    rows, requests = [], []
    for p, x, a, b in zip(prompts, ids, exact, fp32, strict=True):
        pos = first_divergence(b, a)
        rows.append({"prompt": p.id, "identical": pos is None, "divergence": pos, "exact_tokens": a, "fp32_tokens": b})
        if pos is not None:
            requests.append({"prompt": p.id, "position": pos, "prefix": x + b[:pos]})
    gaps, note = ([], None) if not requests else peer_hf.logit_gaps(source.get("resolved"), requests,
                                                                     threads=args.threads, dtype="fp32")
    by_prompt = {g["prompt"]: g for g in gaps}
    for row in rows:
        gap = by_prompt.get(row["prompt"])
        if gap is not None:
            row["fp32_top2_gap"] = gap["gap"]
            row["fp32_top2_tokens"] = gap["top2_tokens"]
            row["exact_token"] = row["exact_tokens"][row["divergence"]]
    result = {"exact_pack": str(args.exact), "fp32_pack": str(args.fp32), "prompts": str(args.prompts),
              "limit": args.limit, "max_new_tokens": args.max_new_tokens,
              "identical": sum(r["identical"] for r in rows), "n": len(rows), "note": note, "rows": rows}
    print(f"greedy output identical on {result['identical']} of {result['n']} prompts")
    for r in rows:
        if not r["identical"]:
            print(f"  {r['prompt']}: first differs at new token {r['divergence']}, fp32 top-2 logit gap "
                  f"{r.get('fp32_top2_gap', float('nan')):.3f} (top-2 {r.get('fp32_top2_tokens')}, exact pack chose "
                  f"{r.get('exact_token')})")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
