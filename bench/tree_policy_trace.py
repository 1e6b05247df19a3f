"""What the tree policy chooses step by step on the CPU, beside adaptive chains, on one prompt (issue 23):

    python bench/tree_policy_trace.py --pack TREE_PACK --prompts spec_bench_question.jsonl --id spec_bench_question/242 \\
        [--drafter ngram] [--max-new-tokens 64] [--rounds 2] [--out OUT.json]

Each round decodes the prompt greedily with chains (`tree="off"`, adaptive k) and with trees (`tree="auto"`), every
step recorded: [nodes, accepted, step ms, the tree's shape (or "chain"), its parents]. Printed per run: tokens/s, tau,
how often each node budget was chosen, the shapes, the drafts accepted and the step time per budget.
"""

from __future__ import annotations

import argparse
import collections
import json
from typing import Any


class TracedPolicy:
    """A request's policy with every step recorded (bench only)."""

    def __init__(self, policy: Any, steps: list[list[Any]]) -> None:
        self.policy, self.steps = policy, steps
        self.shape: Any = None

    @property
    def k_max(self) -> int:
        return int(self.policy.k_max)

    def next_k(self, state: Any) -> int:
        k = int(self.policy.next_k(state))
        self.shape = getattr(state, "tree", None)
        return k

    def observe(self, k: int, n_accepted: int, elapsed_s: float, draft_s: float, *, tree: Any = None) -> None:
        self.steps.append([k, n_accepted, round(elapsed_s * 1e3, 1), "chain" if tree is None else str(self.shape),
                           None if tree is None else tree.parents.tolist()])
        self.policy.observe(k, n_accepted, elapsed_s, draft_s, tree=tree)


def main() -> None:
    import specpack
    from specpack.prompts import read_prompts

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pack", required=True)
    parser.add_argument("--prompts", nargs="+", required=True)
    parser.add_argument("--id", required=True, help="the prompt's id, e.g. spec_bench_question/242")
    parser.add_argument("--drafter", default="ngram")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out")
    args = parser.parse_args()
    pack = specpack.load(args.pack, threads=args.threads)
    prompt = next(p for p in read_prompts(args.prompts) if p.id == args.id)
    ids = pack.encode(prompt.text, chat=prompt.chat)
    steps: list[list[Any]] = []
    make = pack.policy
    pack.policy = lambda *a, **kw: TracedPolicy(make(*a, **kw), steps)  # type: ignore[method-assign]
    runs = []
    for round_ in range(args.rounds):
        for label, tree in (("chain-auto", "off"), ("tree-auto", "auto")):
            steps.clear()
            out = pack.generate(ids, args.max_new_tokens, drafter=args.drafter, tree=tree)
            budgets = collections.Counter(s[0] for s in steps)
            run = {"round": round_, "label": label, "tokens_per_s": out.stats["tokens_per_s"], "tau": out.stats["tau"],
                   "budgets": dict(sorted(budgets.items())),
                   "shapes": dict(collections.Counter(s[3] for s in steps).most_common()),
                   "accepted_per_budget": {k: sum(s[1] for s in steps if s[0] == k) / n for k, n in budgets.items()},
                   "ms_per_budget": {k: sum(s[2] for s in steps if s[0] == k) / n for k, n in budgets.items()},
                   "steps": list(steps)}
            runs.append(run)
            print(f"{label} round {round_}: {run['tokens_per_s']:.2f} tok/s, tau {run['tau']:.2f}, budgets "
                  f"{run['budgets']}, shapes {run['shapes']}")
    pack.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"pack": args.pack, "prompt": args.id, "drafter": args.drafter, "threads": args.threads,
                       "max_new_tokens": args.max_new_tokens, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
