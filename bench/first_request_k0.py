"""A fresh pack's first request under adaptive k, with and without `padded_k0` (docs/architecture.md, "k policy"):
each prompt decoded greedily twice, the pack's carried costs and acceptance cleared before each (as for the first
request after `specpack.load`, e.g. every `specpack generate`), the two settings in alternating order.

    python bench/first_request_k0.py PACK --prompts HumanEval.jsonl.gz [--limit 8] [--max-new-tokens 96]
        [--json OUT]

Reported per prompt and setting: decode tokens/s, tau, the k of every step, and whether both settings gave the same
tokens (they must: greedy output does not depend on k).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pack")
    parser.add_argument("--prompts", nargs="+", required=True)
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import specpack as sp
    from specpack.bench.report import cpu_model
    from specpack.prompts import read_prompts
    from specpack.runtime import loop

    ks: list[int] = []
    commit = loop.Decoding.commit

    def recording(self: Any, proposal: Any, result: Any, verify_s: float) -> None:
        ks.append(proposal.k)
        commit(self, proposal, result, verify_s)

    loop.Decoding.commit = recording  # type: ignore[method-assign]
    pack = sp.load(args.pack)
    prompts = read_prompts(args.prompts, None)[: args.limit]
    pack.generate(pack.encode(prompts[0].text, chat=prompts[0].chat), 8, k=1)  # sessions warm, then forgotten
    rows = []
    for i, prompt in enumerate(prompts):
        ids = pack.encode(prompt.text, chat=prompt.chat)
        row: dict[str, Any] = {"id": prompt.id}
        for padded in ((True, False) if i % 2 == 0 else (False, True)):
            pack._costs.clear()
            pack._acceptance.clear()
            pack._padded_k0 = padded
            ks.clear()
            result = pack.generate(ids, args.max_new_tokens)
            row["padded" if padded else "slope"] = {
                "tokens_per_s": result.stats["tokens_per_s"], "tau": result.stats["tau"],
                "ks": "".join(str(k) for k in ks), "k0_steps": ks.count(0), "tokens": result.tokens}
        row["identical"] = row["padded"]["tokens"] == row["slope"]["tokens"]
        rows.append(row)
        print(prompt.id, {s: (round(row[s]["tokens_per_s"], 2), row[s]["ks"]) for s in ("padded", "slope")},
              row["identical"], flush=True)
    ratios = [r["padded"]["tokens_per_s"] / r["slope"]["tokens_per_s"] for r in rows]
    summary = {"padded_over_slope_median": statistics.median(ratios),
               "k0_steps": {s: sum(r[s]["k0_steps"] for r in rows) for s in ("padded", "slope")},
               "identical": sum(r["identical"] for r in rows), "prompts": len(rows)}
    print(json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps({"machine": cpu_model(), "pack": args.pack, "max_new_tokens": args.max_new_tokens,
                                         "rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
