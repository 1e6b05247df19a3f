"""The same pair in two (or more) packs on the CPU, e.g. the concat and the static KV form of the int4 pair: each
prompt decoded greedily by every pack at k 0, adaptive k and a fixed k, back to back, so drift hits every pack.

    python bench/cpu_pack_forms.py --pack concat=PACK_A --pack static=PACK_B --prompts HumanEval.jsonl.gz \\
        --out bench/results/cpu_pack_forms.json [--prompts-per-file 6] [--max-new-tokens 96] [--k 4] [--threads 2]

Reported per pack and configuration: the median over prompts of decode tokens/s (after the first token), alpha,
whether the tokens equal that pack's k 0 tokens; and per configuration each pack's tokens/s over the first pack's
(median of per-prompt ratios). Chains only (`tree="off"`), the pack's own drafter.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any


def main() -> None:
    import specpack
    from specpack.prompts import read_prompts

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pack", action="append", required=True, help="NAME=DIR, twice or more")
    parser.add_argument("--prompts", nargs="+", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompts-per-file", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=4, help="the fixed k beside k 0 and adaptive k")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    load_start = os.getloadavg()
    named = dict(item.split("=", 1) for item in args.pack)
    packs = {name: specpack.load(path, threads=args.threads) for name, path in named.items()}
    ks: dict[str, int | None] = {"ar": 0, "auto": None, f"k{args.k}": args.k}
    prompts = [p for path in args.prompts for p in read_prompts([path], None)[: args.prompts_per_file]]
    for pack in packs.values():  # warm-up: sessions, adaptive k's first costs
        for k in ks.values():
            pack.generate(prompts[0].text, 16, k=k, chat=prompts[0].chat, tree="off")
    rows: list[dict[str, Any]] = []
    for prompt in prompts:
        row: dict[str, Any] = {"id": prompt.id}
        for name, pack in packs.items():
            for label, k in ks.items():
                out = pack.generate(prompt.text, args.max_new_tokens, k=k, chat=prompt.chat, tree="off")
                row[f"{name}-{label}"] = {"tokens_per_s": out.stats["tokens_per_s"], "alpha": out.stats["alpha"],
                                          "tau": out.stats["tau"], "tokens": out.tokens}
            for label in ks:
                row[f"{name}-{label}"]["identical"] = row[f"{name}-{label}"]["tokens"] == row[f"{name}-ar"]["tokens"]
        rows.append(row)
        print(prompt.id, " ".join(f"{key} {value['tokens_per_s']:.1f}" for key, value in row.items() if key != "id"),
              flush=True)
    labels = [f"{name}-{label}" for name in packs for label in ks]
    summary = {label: {"tokens_per_s": statistics.median(r[label]["tokens_per_s"] for r in rows),
                       "alpha": statistics.median(r[label]["alpha"] for r in rows),
                       "identical": sum(r[label]["identical"] for r in rows)} for label in labels}
    first = next(iter(packs))
    over_first = {f"{name}-{label}": statistics.median(r[f"{name}-{label}"]["tokens_per_s"]
                                                        / r[f"{first}-{label}"]["tokens_per_s"] for r in rows)
                  for name in packs for label in ks if name != first}
    result = {"machine": {"cores": os.cpu_count(), "loadavg_start_end": [load_start, os.getloadavg()],
                          "threads": args.threads},
              "packs": named, "max_new_tokens": args.max_new_tokens, "rows": rows, "summary": summary,
              f"over_{first}": over_first, "time": time.ctime()}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"summary": summary, f"over_{first}": over_first}, indent=1))
    for loaded in packs.values():
        loaded.close()


if __name__ == "__main__":
    main()
