"""Adaptive k replayed on the acceptance a real run recorded: does the policy beat fixed k where acceptance comes in
bursts, as it does on real prompts (adaptive_synthetic.py's acceptance is independent per token)?

    python bench/adaptive_traces.py results/gpu_head_run_g_h100.json [--phase specbench] [--label head-2]
        [--c 0.132] [--v 1,0.987,...] [--third 0.5] [--seeds 8] [--json OUT.json]

Each request of the phase becomes a sequence of draft matches from its fixed-k run's step traces (gpu_head.py's
[k, accepted, ms, draft ms, warm-up runs]): a step of k drafts that accepted n gives n matches, then a miss if n < k;
after k accepted (the bonus token) the next draft's match is unknown and drawn with probability `--third`. The
requests then decode through the runtime's own loop (adaptive_replay.py's `replay`) in the run's order, each step
costing k c + v(k) target steps with 10 % noise on the times the policy sees: fixed k 1-3, adaptive k on the
request's acceptance alone (`auto`) and shrunk toward the pack's pooled rates (`auto-pooled`, Pack.policy since
Run G). Speedups are over AR; per category and the minimum over categories.
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

POLICIES = ("auto", "auto-pooled", "k1", "k2", "k3")


def matches_of(steps: list[list[float]], rng: np.random.Generator, third: float) -> list[bool]:
    """The draft matches a fixed-k run's steps show, one per committed token after the first."""
    out: list[bool] = []
    for k, accepted, *_ in steps:
        k, n = int(k), int(accepted)
        out += [True] * n + [False if n < k else bool(rng.random() < third)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", type=Path)
    parser.add_argument("--phase", default="specbench")
    parser.add_argument("--label", default="head-2", help="the fixed-k run whose step traces give the matches")
    parser.add_argument("--c", type=float, default=0.132)
    parser.add_argument("--v", default="1,0.987,1.001,1.011,1.018,1.026,1.03,1.033,1.04", help="v(0..8), target steps")
    parser.add_argument("--third", type=float, default=0.5)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    v = [float(x) for x in args.v.split(",")]
    rows = json.loads(args.result.read_text())[args.phase]["rows"]
    config = AdaptiveConfig()
    speedups: dict[str, dict[str, list[float]]] = {name: {} for name in POLICIES}
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        costs = {name: MeasuredCosts(K_MAX, config.window, config.verify_slope) for name in ("auto", "auto-pooled")}
        pooled = PackAcceptance(K_MAX, config)
        for row in rows:
            matches = matches_of(row[args.label]["steps"], rng, args.third)
            for name in POLICIES:
                policy: Any = FixedK(int(name[1:])) if name.startswith("k") else AdaptiveK(
                    K_MAX, config, costs=costs[name],
                    acceptance=AcceptanceModel(K_MAX, config, pack=pooled if name == "auto-pooled" else None))
                speedups[name].setdefault(row["category"], []).append(replay(matches, policy, args.c, v, rng, 0.1)["speedup"])
    summary: dict[str, Any] = {}
    for name, by_category in speedups.items():
        means = {category: statistics.mean(values) for category, values in sorted(by_category.items())}
        summary[name] = {"mean": statistics.mean(x for values in by_category.values() for x in values),
                         "min_category": min(means.values()), "by_category": means}
    print(json.dumps({name: {"mean": round(s["mean"], 3), "min_category": round(s["min_category"], 3)}
                      for name, s in summary.items()}, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"source": str(args.result), "phase": args.phase, "label": args.label, "c": args.c,
                                         "v": v, "third": args.third, "seeds": args.seeds, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
