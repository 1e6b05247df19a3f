"""A drafter's trees against its chains on the CPU, one tree pack, same prompts, same run (issue 23).

    python bench/cpu_head_trees.py --pack PACK --prompts HumanEval.jsonl.gz mt_bench_question.jsonl \\
        --out bench/results/cpu_head_trees.json [--prompts-per-file 4] [--max-new-tokens 64] [--threads 2]
        [--drafter head|ngram|model] [--categories summarization rag ...]

PACK: `spec-export --draft-head HEAD --kv-cache static --max-tree-nodes T` (the head), `--drafter ngram --kv-cache
static --max-tree-nodes T` (prompt lookup), or `--draft D --kv-cache static --max-tree-nodes T` (the draft model in its
tree form). Each prompt is decoded greedily by every configuration back to back: the target alone (k 0), the
drafter's chains (the head: k 2; prompt lookup and the draft model: k 4; all adaptive) and its trees (4, 8, 16
nodes a step, the tree policy). Reported per configuration: the median over prompts of tau (tokens per verify),
alpha, decode tokens/s and its ratio to the target alone's, and whether every output equals the target alone's (per
prompt: `identical`, and `first_difference`, the first position where it does not).
`--categories`: only a prompt file's prompts of these categories (Spec-Bench's); `--only LABEL ...`: only those
configurations (and ar); `--repeat N`: N interleaved rounds per prompt, tokens/s the median of the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

from specpack.bench.report import cpu_model
from specpack.limits import TreeOption

CHAIN_K = {"head": 2, "ngram": 4, "model": 4}  # the fixed chain each drafter is benchmarked at (bench/gpu_head.py;
# the model drafter: the k of `make demo`'s pack)


def configs(drafter: str) -> list[tuple[str, int | None, TreeOption]]:
    """(label, k, tree) of every configuration."""
    k = CHAIN_K[drafter]
    return [("ar", 0, "off"), (f"chain-k{k}", k, "off"), ("chain-auto", None, "off"),
            ("tree-4", None, 4), ("tree-8", None, 8), ("tree-16", None, 16), ("tree-auto", None, "auto")]


def main() -> None:
    import specpack
    from specpack.prompts import read_prompts

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pack", required=True)
    parser.add_argument("--prompts", nargs="+", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompts-per-file", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drafter", choices=sorted(CHAIN_K), default="head")
    parser.add_argument("--categories", nargs="*", help="only prompts of these categories")
    parser.add_argument("--only", nargs="*", help="only these configurations (labels; ar always runs)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds over the configurations per prompt, interleaved; tokens/s: the median")
    args = parser.parse_args()
    CONFIGS = [c for c in configs(args.drafter) if not args.only or c[0] == "ar" or c[0] in args.only]

    load_start = os.getloadavg()
    pack = specpack.load(args.pack, threads=args.threads)
    prompts = [p for path in args.prompts
               for p in [q for q in read_prompts([path], None)
                         if not args.categories or q.category in args.categories][: args.prompts_per_file]]
    for _, k, tree in CONFIGS:  # warm-up: sessions, the policies' first costs
        pack.generate(prompts[0].text, 8, k=k, drafter=args.drafter, tree=tree, chat=prompts[0].chat)
    rows: list[dict[str, Any]] = []
    for prompt in prompts:
        row: dict[str, Any] = {"id": prompt.id}
        for _ in range(args.repeat):  # rounds interleave the configurations: drift on a shared VM hits all alike
            for label, k, tree in CONFIGS:
                out = pack.generate(prompt.text, args.max_new_tokens, k=k, drafter=args.drafter, tree=tree,
                                    chat=prompt.chat)
                rates = [*row.get(label, {}).get("rounds", []), out.stats["tokens_per_s"]]
                row[label] = {key: out.stats[key] for key in ("alpha", "tau", "tree")}
                row[label] |= {"tokens": out.tokens, "rounds": rates, "tokens_per_s": statistics.median(rates)}
                print(f"{prompt.id} {label}: tau {out.stats['tau']} alpha {out.stats['alpha']} "
                      f"{out.stats['tokens_per_s']:.2f} tok/s", flush=True)
        for label, _, _ in CONFIGS:  # against the target alone's tokens (the last round's of each)
            got, want = row[label]["tokens"], row["ar"]["tokens"]
            row[label]["identical"] = got == want
            row[label]["first_difference"] = _first_difference(got, want)
        for label, _, _ in CONFIGS:
            row[label].pop("tokens")
            row[label]["speedup"] = row[label]["tokens_per_s"] / row["ar"]["tokens_per_s"]
        rows.append(row)
    summary = {label: {"tau": _median(rows, label, "tau"), "alpha": _median(rows, label, "alpha"),
                       "tokens_per_s": _median(rows, label, "tokens_per_s"), "speedup": _median(rows, label, "speedup"),
                       "identical": sum(r[label]["identical"] for r in rows)} for label, _, _ in CONFIGS}
    record = {"pack": str(args.pack), "drafter": args.drafter, "prompts": [p.id for p in prompts],
              "max_new_tokens": args.max_new_tokens, "repeat": args.repeat,
              "threads": args.threads, "machine": cpu_model(), "cpus": os.cpu_count(),
              "load_before": load_start, "load_after": os.getloadavg(), "summary": summary, "rows": rows}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    for label, s in summary.items():
        print(f"{label:11s} tau {s['tau']} alpha {s['alpha']} tok/s {s['tokens_per_s']:.2f} "
              f"x{s['speedup']:.2f} identical {s['identical']}/{len(rows)}")


def _first_difference(got: list[int], want: list[int]) -> int | None:
    """The first position where the two token lists differ (the shorter one's length if one is a prefix), or None."""
    at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    return at if at is not None or len(got) == len(want) else min(len(got), len(want))


def _median(rows: list[dict[str, Any]], label: str, key: str) -> float | None:
    values = [r[label][key] for r in rows if r[label][key] is not None]
    return statistics.median(values) if values else None


if __name__ == "__main__":
    main()
