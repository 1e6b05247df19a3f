"""The draft head against the 0.5B draft model on the CPU, same target quantization, same prompts, same run
(issue 22's CPU target: the head drafter >= 1.3x the model drafter on HumanEval, int4 packs, 2 cores).

    python bench/cpu_head_vs_model.py --model-pack PACK_0.5B --head-pack PACK_HEAD --prompts HumanEval.jsonl.gz \\
        --out bench/results/cpu_head_vs_model.json [--prompts-per-file 6] [--max-new-tokens 96] [--threads 2]

Both packs are loaded once; each prompt is decoded greedily by every configuration back to back (AR through each
pack's own verify graph, the model drafter at adaptive k and k 4, each head at adaptive k and k 1-3), in an order
rotated by one configuration per prompt (`--order rotate`, the default), so that no configuration always takes the
same place, such as the first run on a pack after the other pack's runs (`--order fixed`: the list's order for every
prompt, as before 2026-12-08; bench/README.md, "Run L's head, both packs static"). Reported:
per configuration the median over prompts of decode tokens/s (after the first token) and of the speedup over its
own pack's AR, and each head's tokens/s over the model drafter's (adaptive vs adaptive, best fixed vs best fixed).
Several --head-pack (e.g. one head unquantized and `--quantize-draft int4`): each runs at adaptive k and k 1-3 (chains,
`tree="off"`), and a head pack with a tree verify graph (--max-tree-nodes) also at each `--trees` setting (auto or a
node count; its tree over the model drafter: `tree_auto`, and `best` over every configuration of the head).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from specpack.bench.report import cpu_model
from specpack.limits import TreeOption

Config = tuple[str, str, str, int | None, TreeOption]  # (label, pack, drafter, k, tree)
MODEL_CONFIGS: list[Config] = [
    ("model-ar", "model", "model", 0, "off"), ("model-auto", "model", "model", None, "off"),
    ("model-k4", "model", "model", 4, "off")]
HEAD_KS: list[tuple[str, int | None]] = [("ar", 0), ("auto", None), ("k1", 1), ("k2", 2), ("k3", 3)]


def head_label(i: int) -> str:
    """The i-th --head-pack's name: "head", then "head2", "head3", ..."""
    return "head" if i == 0 else f"head{i + 1}"


def main() -> None:
    import specpack
    from specpack.prompts import read_prompts

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-pack", required=True)
    parser.add_argument("--head-pack", nargs="+", required=True,
                        help="one or more head packs of the same target (e.g. its head unquantized and int4)")
    parser.add_argument("--prompts", nargs="+", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompts-per-file", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--order", choices=["rotate", "fixed"], default="rotate",
                        help="the configurations' order per prompt: rotated by one per prompt, or always the same")
    parser.add_argument("--trees", nargs="*", default=["auto", "4"],
                        help="tree settings for head packs with a tree verify graph (auto or a node count)")
    args = parser.parse_args()

    load_start = os.getloadavg()
    heads = [head_label(i) for i in range(len(args.head_pack))]
    packs = {name: specpack.load(path, threads=args.threads) for name, path in
             (("model", args.model_pack), *zip(heads, args.head_pack, strict=True))}
    configs: list[Config] = [*MODEL_CONFIGS, *((f"{h}-{suffix}", h, "head", k, "off") for h in heads
                                               for suffix, k in HEAD_KS)]
    trees = {h: [f"{h}-tree{t}" for t in args.trees] for h in heads if packs[h].manifest.target.graph.tree is not None}
    configs += [(f"{h}-tree{t}", h, "head", None, "auto" if t == "auto" else int(t)) for h in trees for t in args.trees]
    prompts = [p for path in args.prompts for p in read_prompts([path], None)[: args.prompts_per_file]]
    for _, pack, drafter, k, tree in configs:  # warm-up: sessions, adaptive k's first costs
        packs[pack].generate(prompts[0].text, 16, k=k, drafter=drafter, chat=prompts[0].chat, tree=tree)
    rows: list[dict[str, Any]] = []
    for index, prompt in enumerate(prompts):
        row: dict[str, Any] = {"id": prompt.id}
        turn = index % len(configs) if args.order == "rotate" else 0
        for label, pack, drafter, k, tree in [*configs[turn:], *configs[:turn]]:
            out = packs[pack].generate(prompt.text, args.max_new_tokens, k=k, drafter=drafter, chat=prompt.chat,
                                       tree=tree)
            row[label] = {"tokens_per_s": out.stats["tokens_per_s"], "alpha": out.stats["alpha"],
                          "tau": out.stats["tau"], "tokens": out.tokens}
        for pack in ("model", *heads):
            for label, owner, *_ in configs:
                if owner == pack:
                    row[label]["identical"] = row[label]["tokens"] == row[f"{pack}-ar"]["tokens"]
                    row[label]["speedup"] = row[label]["tokens_per_s"] / row[f"{pack}-ar"]["tokens_per_s"]
        rows.append(row)
        print(prompt.id, " ".join(f"{label} {row[label]['tokens_per_s']:.1f}" for label, *_ in configs), flush=True)
    summary = {label: {"tokens_per_s": statistics.median(r[label]["tokens_per_s"] for r in rows),
                       "speedup": statistics.median(r[label]["speedup"] for r in rows),
                       "alpha": statistics.median(r[label]["alpha"] for r in rows),
                       "identical": sum(r[label]["identical"] for r in rows)} for label, *_ in configs}
    head_vs_model = {h: {
        "auto": statistics.median(r[f"{h}-auto"]["tokens_per_s"] / r["model-auto"]["tokens_per_s"] for r in rows),
        "best_fixed": statistics.median(max(r[f"{h}-{k}"]["tokens_per_s"] for k in ("k1", "k2", "k3"))
                                        / r["model-k4"]["tokens_per_s"] for r in rows),
        **({"tree_auto": statistics.median(r[f"{h}-treeauto"]["tokens_per_s"] / r["model-auto"]["tokens_per_s"]
                                           for r in rows)} if f"{h}-treeauto" in trees.get(h, []) else {}),
        "best": statistics.median(max(r[label]["tokens_per_s"] for label, owner, *_ in configs
                                      if owner == h and not label.endswith("-ar"))
                                  / max(r["model-auto"]["tokens_per_s"], r["model-k4"]["tokens_per_s"]) for r in rows)}
        for h in heads}
    result = {"machine": {"cpu": cpu_model(), "cores": os.cpu_count(),
                          "loadavg_start_end": [load_start, os.getloadavg()], "threads": args.threads},
              "packs": {"model": args.model_pack, **dict(zip(heads, args.head_pack, strict=True))},
              "max_new_tokens": args.max_new_tokens, "order": args.order,
              "rows": rows, "summary": summary, "head_over_model": head_vs_model, "time": time.ctime()}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"summary": summary, "head_over_model": head_vs_model}, indent=1))
    for loaded in packs.values():
        loaded.close()


if __name__ == "__main__":
    main()
