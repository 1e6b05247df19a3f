"""Prompt lookup with token trees against chains, replayed from the real pair's greedy outputs on the CPU's measured
verify costs: no model runs, so it is cheap (docs/trees.md, "Tree size policy").

    python bench/tree_replay.py bench/results/drafters_cpu.json --tokenizer DIR [--json OUT] [--margins 0,0.03]

Greedy speculative decoding emits the target's own greedy tokens, so a deterministic drafter's steps replay from the
autoregressive output alone (runtime/replay.py: the runtime's loop over a target that replays the output; a tree is
walked by the greedy tree rule). Each step costs V(T) target steps, T the nodes (or drafts) it verified (the n-gram
drafter's own time is microseconds): predicted speedup = decoded tokens / sum of V(T) over the steps. The policies get
these modeled step times in place of the clock (ModeledTimes), so adaptive k and the tree policy choose as they would
on that machine. Cost tables (bench/README.md), V(0) = 1 (a plain target step; every greedy step runs >= 2 rows):
    fp32   the real pair, fp32, ONNX Runtime CPU, 2 cores: v(1, 2, 4, 8) = 1.07, 1.17, 1.22, 1.35; linear between and
           beyond (0.0325 per row): rows are cheap
    int4   the int4 / GGUF-exact target on the same CPU: v(2, 3, 4) = 1.35, 1.60, 1.91, v(1) interpolated (1.17), then
           0.31 per row: each row costs about a third of a step (MatMulNBits' multi-row kernels)
The prompts are those of the drafters.py results (their `ar` tokens), encoded with the pair's tokenizer (`--tokenizer`:
a pack's tokenizer/ directory, or one written from the converted target by export/tokenizer_export.py's
write_tokenizer); a prompt whose id count differs from the results' `prompt_tokens` is skipped. `--margins`: the tree
policy (16 nodes) at each margin (tree_policy.py's MARGIN), as the geometric mean over the prompts of its speedup over
adaptive k's chains (k_max 8), and the worst prompt.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from drafters import CATEGORIES, PROMPTS, select_prompts

from specpack.runtime.adaptive_k import AdaptiveK
from specpack.runtime.k_policy import FixedK, KPolicy
from specpack.runtime.ngram_drafter import NgramConfig, NgramDrafter
from specpack.runtime.replay import replay_greedy
from specpack.runtime.state import DecodeState, TreeStep
from specpack.runtime.tree_policy import FixedTree, TreePolicy

NODES = 16  # the tree pack's --max-tree-nodes
WIDTH = NgramConfig().width


def _table(points: dict[int, float], per_row: float) -> list[float]:
    """V(0..NODES) from measured points: linear between them, `per_row` beyond the last."""
    known = sorted(points.items())
    out = []
    for t in range(NODES + 1):
        lo = max(p for p in known if p[0] <= t)
        hi = min((p for p in known if p[0] >= t), default=None)
        if hi is None:
            out.append(lo[1] + per_row * (t - lo[0]))
        else:
            out.append(lo[1] if hi[0] == lo[0] else lo[1] + (hi[1] - lo[1]) * (t - lo[0]) / (hi[0] - lo[0]))
    return out


COSTS = {"fp32": _table({0: 1.0, 1: 1.07, 2: 1.17, 4: 1.22, 8: 1.35}, 0.0325),
         "int4": _table({0: 1.0, 1: 1.17, 2: 1.35, 3: 1.60, 4: 1.91}, 0.31)}


class ModeledTimes:
    """A KPolicy that hands `policy` the step time V(T) in place of the clock, adds it up, and times its own Python."""

    def __init__(self, policy: KPolicy, v: list[float]) -> None:
        self.policy, self.v = policy, v
        self.cost, self.policy_s, self.steps = 0.0, 0.0, 0

    @property
    def k_max(self) -> int:
        return self.policy.k_max

    def next_k(self, state: DecodeState) -> int:
        start = time.perf_counter()
        k = self.policy.next_k(state)
        self.policy_s += time.perf_counter() - start
        return k

    def observe(self, k: int, n_accepted: int, elapsed_s: float, draft_s: float, *,
                tree: TreeStep | None = None) -> None:
        start = time.perf_counter()
        self.policy.observe(k, n_accepted, self.v[k], 0.0, tree=tree)
        self.policy_s += time.perf_counter() - start
        self.cost += self.v[k]
        self.steps += 1


CONFIGS: dict[str, tuple[Callable[[], KPolicy], int]] = {  # name -> (policy, n-gram width: 1 chains)
    "chain k=2": (lambda: FixedK(2), 1), "chain k=4": (lambda: FixedK(4), 1), "chain k=8": (lambda: FixedK(8), 1),
    "chain auto": (lambda: AdaptiveK(8), 1),
    "tree 4": (lambda: FixedTree(4, WIDTH), WIDTH), "tree 8": (lambda: FixedTree(8, WIDTH), WIDTH),
    "tree 16": (lambda: FixedTree(16, WIDTH), WIDTH), "tree auto": (lambda: TreePolicy(NODES, WIDTH), WIDTH),
}


def replay(ids: list[int], out: list[int], name: str, v: list[float], eos: frozenset[int]) -> dict[str, float]:
    make, width = CONFIGS[name]
    policy = ModeledTimes(make(), v)
    state = replay_greedy(ids + out, len(ids), NgramDrafter(NgramConfig(width=width)), policy, eos)
    decoded = len(state.out) - 1
    return {"speedup": decoded / policy.cost if policy.cost else 1.0, "tau": state.stats.tau,
            "policy_us": 1e6 * policy.policy_s / max(policy.steps, 1)}


def margin_sweep(cases: list[tuple[list[int], list[int]]], margins: list[float], eos: frozenset[int]) -> None:
    for costs, v in COSTS.items():
        base = [replay(ids, out, "chain auto", v, eos)["speedup"] for ids, out in cases]
        for margin in margins:
            CONFIGS["sweep"] = (lambda m=margin: TreePolicy(NODES, WIDTH, margin=m), WIDTH)  # type: ignore[misc]
            ratios = [replay(ids, out, "sweep", v, eos)["speedup"] / b for (ids, out), b in zip(cases, base, strict=True)]
            mean = math.exp(statistics.fmean(math.log(r) for r in ratios))
            print(f"{costs} margin {margin:.2f}: tree auto / chain auto {mean:.4f} (geometric mean over {len(ratios)} "
                  f"prompts), worst {min(ratios):.3f}, best {max(ratios):.3f}")
        del CONFIGS["sweep"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--spec-bench", type=Path, default=PROMPTS / "spec_bench_question.jsonl")
    parser.add_argument("--humaneval", type=Path, default=PROMPTS / "HumanEval.jsonl.gz")
    parser.add_argument("--eos", type=int, nargs="*", default=[151645, 151643])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--margins", default=None, help="comma-separated margins of the tree policy to compare")
    args = parser.parse_args()
    from specpack.runtime.tokenizer import PackTokenizer

    results = json.loads(args.results.read_text())
    tokenizer = PackTokenizer.load(args.tokenizer)
    per = results["config"]["prompts_per_category"]
    prompts = {p.id: p for p in select_prompts(args.spec_bench, args.humaneval, list(CATEGORIES), 4 * per)}
    rows: dict[tuple[str, str, str], list[dict[str, float]]] = defaultdict(list)  # (costs, category, config)
    skipped, cases = [], []
    for pid, entry in results["runs"].items():
        p, out = prompts[pid], entry["configs"]["ar"]["tokens"]
        ids = tokenizer.encode_chat(p.text) if p.chat else tokenizer.encode(p.text)
        if len(ids) != entry["prompt_tokens"]:
            skipped.append(pid)
            continue
        cases.append((ids, out))
        for costs, v in COSTS.items():
            for name in CONFIGS:
                rows[(costs, entry["category"], name)].append(replay(ids, out, name, v, frozenset(args.eos)))
    if args.margins is not None:
        margin_sweep(cases, [float(m) for m in args.margins.split(",")], frozenset(args.eos))
    summary: dict[str, Any] = {"skipped": skipped, "costs": COSTS, "by": {}}
    for costs in COSTS:
        print(f"\n{costs} verify costs: predicted speedup (median over prompts) / tau (mean)")
        cats = sorted({c for (k, c, _) in rows if k == costs})
        print(f"{'config':12}" + "".join(f"{c[:13]:>15}" for c in [*cats, "all"]) + f"{'policy us':>11}")
        for name in CONFIGS:
            cells, every = [], []
            for cat in cats:
                got = rows[(costs, cat, name)]
                every += got
                cells.append((statistics.median(r["speedup"] for r in got), statistics.fmean(r["tau"] for r in got)))
            overall = (statistics.median(r["speedup"] for r in every), statistics.fmean(r["tau"] for r in every))
            policy_us = statistics.median(r["policy_us"] for r in every)
            print(f"{name:12}" + "".join(f"{s:>9.3f}/{t:<5.2f}" for s, t in [*cells, overall]) + f"{policy_us:>11.0f}")
            summary["by"].setdefault(costs, {})[name] = {
                "by_category": {c: {"speedup": s, "tau": t} for c, (s, t) in zip(cats, cells, strict=True)},
                "overall": {"speedup": overall[0], "tau": overall[1]}, "policy_us_per_step": policy_us}
    if skipped:
        print(f"\nskipped (prompt ids differ from the results'): {', '.join(skipped)}")
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
