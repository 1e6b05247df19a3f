"""The n-gram drafter's parameters, chosen by replaying greedy outputs: no model runs, so it is cheap.

    python bench/ngram_replay.py bench/results/drafters_cpu.json --pack PACK [--json OUT]

Greedy speculative decoding emits exactly the target's own greedy tokens, so for a drafter that needs no
model (prompt lookup) every step can be replayed from the autoregressive output alone: the runtime's
NgramDrafter proposes from the prompt and the tokens so far, the accepted drafts are the leading ones that
equal the target's next tokens (the runtime's own loop over a target that replays the output: runtime/replay.py).
For each n range and k this gives tau (tokens per verify) and the steps
with a proposal; the predicted speedup uses the verify costs v(k) measured on the CPU (bench/README.md):
    predicted = decoded tokens / sum over steps of v(k of the step)     (v(0) = 1: a plain target step)
The prompts are those of the drafters.py results (their `ar` tokens), encoded with the pack's tokenizer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from drafters import CATEGORIES, PROMPTS, select_prompts

from specpack.runtime.k_policy import FixedK
from specpack.runtime.ngram_drafter import NgramConfig, NgramDrafter
from specpack.runtime.replay import replay_greedy

CPU_V = [1.0, 1.07, 1.17, 1.195, 1.22, 1.2525, 1.285, 1.3175, 1.35]  # v(0..8): 1, 2, 4, 8 measured, between linear
N_RANGES = [(1, 1), (1, 2), (1, 3), (2, 2), (2, 3), (2, 4), (3, 4), (3, 6), (4, 8)]
KS = (2, 4, 8)


class StepCosts(FixedK):
    """FixedK(k) that adds up each step's verify cost v(k of the step), in target steps, as the loop reports it."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.cost = 0.0

    def observe(self, k: int, n_accepted: int, elapsed_s: float, draft_s: float, *, tree: object = None) -> None:
        self.cost += CPU_V[k]


def replay(prompt: list[int], out: list[int], config: NgramConfig, k: int, eos: frozenset[int]) -> tuple[int, int, float]:
    """(steps, steps with a proposal, time in target steps) of greedy decoding of `out` after `prompt`, through the
    runtime's own loop (runtime/replay.py)."""
    policy = StepCosts(k)
    stats = replay_greedy(prompt + out, len(prompt), NgramDrafter(config), policy, eos).stats
    return stats.steps, stats.steps - stats.k_histogram[0], policy.cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("--pack", type=Path, required=True, help="for its tokenizer and eos ids (no model is loaded)")
    parser.add_argument("--spec-bench", type=Path, default=PROMPTS / "spec_bench_question.jsonl")
    parser.add_argument("--humaneval", type=Path, default=PROMPTS / "HumanEval.jsonl.gz")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from specpack.contract.manifest import Manifest
    from specpack.runtime.tokenizer import PackTokenizer

    results = json.loads(args.results.read_text())
    tokenizer = PackTokenizer.load(args.pack / "tokenizer")
    eos = frozenset(Manifest.read(args.pack).eos_token_ids)
    per = results["config"]["prompts_per_category"]
    prompts = {p.id: p for p in select_prompts(args.spec_bench, args.humaneval, list(CATEGORIES), per)}
    rows: dict[tuple[str, int, int, int], list[tuple[int, int, float, int]]] = defaultdict(list)
    for pid, entry in results["runs"].items():
        p, out = prompts[pid], entry["configs"]["ar"]["tokens"]
        ids = tokenizer.encode_chat(p.text) if p.chat else tokenizer.encode(p.text)
        for n_min, n_max in N_RANGES:
            for k in KS:
                steps, proposing, cost = replay(ids, out, NgramConfig(n_min, n_max), k, eos)
                rows[(entry["category"], n_min, n_max, k)].append((steps, proposing, cost, len(out) - 1))
    table: dict[str, Any] = {}
    print("| n range | k | " + " | ".join(c for c in CATEGORIES if any(r[0] == c for r in rows)) + " | median |")
    for n_min, n_max in N_RANGES:
        for k in KS:
            cells, speedups = [], []
            for category in CATEGORIES:
                got = rows.get((category, n_min, n_max, k))
                if not got:
                    continue
                speedup = statistics.median(decoded / cost for _, _, cost, decoded in got)
                tau = sum(d for _, _, _, d in got) / sum(s for s, _, _, _ in got)
                table.setdefault(f"{n_min}-{n_max} k{k}", {})[category] = {"predicted_speedup": speedup, "tau": tau}
                cells.append(f"{speedup:.2f}x")
                speedups.append(speedup)
            print(f"| {n_min}..{n_max} | {k} | " + " | ".join(cells) + f" | {statistics.median(speedups):.2f}x |")
    if args.json is not None:
        args.json.write_text(json.dumps({"v": CPU_V, "predicted": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
