"""Adaptive k against fixed k on synthetic acceptance: does the policy alone lock at k = 0 at a drafter's costs?

    python bench/adaptive_synthetic.py [--c 0.126] [--v 1,1,1.005,...] [--seeds 8] [--json OUT.json]

Each request decodes 128 tokens greedily through the runtime's own loop (adaptive_replay.py's `replay`): its draft
matches the target's next token independently with probability p (the request's; the list below cycles through
0.35-0.65, the spread of position-1 acceptance a trained head shows per prompt on the GPU), every step costs
k c + v(k) target steps with 10 % lognormal noise on the times the policy sees. The requests run in order on one
cost model, as a pack keeps it; `auto-pooled` is adaptive k as a pack runs it since Run G, each request's acceptance
shrunk toward the rates pooled over the earlier requests (PackAcceptance), `auto` the request's alone. Defaults: the
head pack of Run F (H100: c 0.126, v(k) measured, v(1) taken as 1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from adaptive_replay import K_MAX, replay

from specpack.runtime.adaptive_k import AcceptanceModel, AdaptiveConfig, AdaptiveK, MeasuredCosts, PackAcceptance
from specpack.runtime.k_policy import FixedK

ACCEPTANCE = (0.55, 0.5, 0.45, 0.6, 0.35, 0.55, 0.5, 0.65, 0.4, 0.55) * 2  # p per request, in order
NEW_TOKENS = 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--c", type=float, default=0.126)
    parser.add_argument("--v", default="1,1,1.005,1.01,1.02,1.024,1.03,1.032,1.042", help="v(0..8) in target steps")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    v = [float(x) for x in args.v.split(",")]
    config = AdaptiveConfig()
    runs: dict[str, list[dict[str, Any]]] = {"auto": [], "auto-pooled": [], "k1": [], "k2": [], "k3": []}
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        costs = {"auto": MeasuredCosts(K_MAX, config.window, config.verify_slope),
                 "auto-pooled": MeasuredCosts(K_MAX, config.window, config.verify_slope)}
        pooled = PackAcceptance(K_MAX, config)  # what a pack keeps across its requests (Pack.policy)
        for p in ACCEPTANCE:
            matches = [bool(m) for m in rng.random(NEW_TOKENS - 1) < p]
            for name, rows in runs.items():
                policy: Any = FixedK(int(name[1:])) if name.startswith("k") else AdaptiveK(
                    K_MAX, config, costs=costs[name],
                    acceptance=AcceptanceModel(K_MAX, config, pack=pooled if name == "auto-pooled" else None))
                rows.append({"p": p, **replay(matches, policy, args.c, v, rng, 0.1)})
    summary: dict[str, Any] = {}
    for name, rows in runs.items():
        speedups = [r["speedup"] for r in rows]
        summary[name] = {"mean": statistics.mean(speedups), "min": min(speedups),
                         "by_p": {str(p): statistics.mean(r["speedup"] for r in rows if r["p"] == p)
                                  for p in sorted(set(ACCEPTANCE))}}
    locked = sum(r["k_histogram"][0] > 0.8 * sum(r["k_histogram"]) for r in runs["auto"])
    summary["auto_requests_mostly_at_k0"] = f"{locked} of {len(runs['auto'])}"
    for name in ("auto", "auto-pooled"):
        summary[f"{name}_over_k2"] = statistics.mean(a["speedup"] / b["speedup"]
                                                      for a, b in zip(runs[name], runs["k2"], strict=True))
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"c": args.c, "v": v, "seeds": args.seeds, "acceptance": ACCEPTANCE,
                                         "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
