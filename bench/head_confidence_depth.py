"""Would a draft length chosen per step from the head's own confidence pay on this machine? (EAGLE-2's observation:
a head's probability of its token tracks its acceptance; SpecDec++ / AdaEDL stop drafting when it falls.) One tree
pack of a head, greedy, fixed k: per step, each drafted token's head confidence (exp of its top-1 log-probability,
the tree form's `tree_logprobs`, which a chain step binds too) and the drafts accepted; per k 0-3, the median verify
and head-run times. Then, offline: the tokens per unit time of fixed k 1-3 and of the rule "draft i is verified when
the product of the confidences of drafts 1..i is at least theta" (draft 1 always; the head runs once more only while
the product allows it), on the k = 3 steps, with the measured costs.

    python bench/head_confidence_depth.py TREE_HEAD_PACK --prompts HumanEval.jsonl.gz [--limit 12]
        [--max-new-tokens 96] [--json OUT]

Greedy acceptance is a prefix, so a k = 3 step with n accepted tells what any shorter draft of it would have accepted
(min(n, m)). Not a runtime mode: a measurement that says whether one is worth building.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

THETAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
BINS = ((0.0, 0.3), (0.3, 0.5), (0.5, 0.7), (0.7, 0.85), (0.85, 0.95), (0.95, 1.01))


def calibration(conf: np.ndarray, accepted: np.ndarray) -> list[dict[str, Any]]:
    """Per confidence bin: steps and the share accepted."""
    out = []
    for lo, hi in BINS:
        m = (conf >= lo) & (conf < hi)
        out.append({"bin": [lo, hi], "steps": int(m.sum()), "accepted": float(accepted[m].mean()) if m.any() else None})
    return out


def rate(steps: list[dict[str, Any]], verify: dict[int, float], head: float, theta: float | None, k: int = 3) -> float:
    """Tokens per unit time over `steps` (k = 3, greedy): fixed k (theta None) or the confidence rule up to k."""
    tokens = cost = 0.0
    for s in steps:
        m, runs = k, k
        if theta is not None:
            m, runs, product = 1, 1, s["conf"][0]
            for i in range(1, k):
                if product < theta:
                    break
                runs += 1
                product *= s["conf"][i]
                if product < theta:
                    break
                m += 1
        tokens += min(s["n"], m) + 1
        cost += verify[m] + runs * head
    return tokens / cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pack")
    parser.add_argument("--prompts", nargs="+", required=True)
    parser.add_argument("--limit", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import specpack as sp
    import specpack.runtime.ort_session as ort_session
    from specpack.bench.report import cpu_model
    from specpack.prompts import read_prompts
    from specpack.runtime import loop
    from specpack.runtime.backends import cpu

    confs: list[float] = []
    steps: list[dict[str, Any]] = []
    runs: dict[str, list[float]] = {}
    head_step, commit, graph_run = cpu.OrtHead.step, loop.Decoding.commit, ort_session.OrtGraph.run

    def step(self: Any, state: Any, end: int, row: int) -> int:
        token = head_step(self, state, end, row)
        w = 1 if end > state.length else 0  # the run's last row: its own row, or the catch-up's last
        if int(self.tree.tokens[state.slot][0, w, 0]) != token:
            raise SystemExit("the tree form's top-1 is not the drafted token: not a greedy tree pack")
        confs.append(float(np.exp(self.tree.logprobs[state.slot][0, w, 0])))
        return token

    def committing(self: Any, proposal: Any, result: Any, verify_s: float) -> None:
        steps.append({"k": proposal.k, "n": result.n_accepted, "conf": list(confs)})
        confs.clear()
        commit(self, proposal, result, verify_s)

    def timed(self: Any, binding: Any, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        t = time.perf_counter()
        graph_run(self, binding, inputs, outputs)
        if "hidden_in" in self.input_names:
            key = "head" if inputs["draft_ids"].shape[1] or inputs["input_ids"].shape[1] <= 4 else "catch-up"
        else:
            key = f"verify {inputs['input_ids'].shape[1]}"
        runs.setdefault(key, []).append(time.perf_counter() - t)

    cpu.OrtHead.step = step  # type: ignore[method-assign]
    loop.Decoding.commit = committing  # type: ignore[method-assign]
    ort_session.OrtGraph.run = timed  # type: ignore[method-assign]
    pack = sp.load(args.pack)
    if pack.manifest.head is None or not pack.manifest.head.tree_width:
        raise SystemExit(f"{args.pack}: not a head pack with the tree form (--max-tree-nodes)")
    prompts = read_prompts(args.prompts, None)[: args.limit]
    k3_steps: list[dict[str, Any]] = []
    speed: dict[int, list[float]] = {k: [] for k in range(4)}
    pack.generate(pack.encode(prompts[0].text, chat=prompts[0].chat), 8, k=1, tree="off")  # warm
    runs.clear()
    for i, prompt in enumerate(prompts):
        ids = pack.encode(prompt.text, chat=prompt.chat)
        for k in [(i + j) % 4 for j in range(4)]:  # rotated order
            steps.clear()
            confs.clear()
            result = pack.generate(ids, args.max_new_tokens, k=k, tree="off")
            speed[k].append(result.stats["tokens_per_s"])
            if k == 3:
                k3_steps += [s for s in steps if s["k"] == 3 and len(s["conf"]) == 3]
        print(prompt.id, {k: round(v[-1], 2) for k, v in speed.items()}, flush=True)
    ar = statistics.median(runs["verify 2"])  # a greedy k 0 step runs two rows, as k 1's verify
    verify = {m: statistics.median(runs[f"verify {m + 1}"]) / ar for m in (1, 2, 3)}
    head = statistics.median(runs["head"]) / ar
    conf1 = np.array([s["conf"][0] for s in k3_steps])
    conf12 = np.array([s["conf"][0] * s["conf"][1] for s in k3_steps])
    result = {
        "machine": cpu_model(), "pack": args.pack, "max_new_tokens": args.max_new_tokens, "prompts": len(prompts),
        "k3_steps": len(k3_steps), "ar_step_ms": 1e3 * ar,
        "costs_in_ar_steps": {"verify": verify, "head_run": head},
        "tokens_per_s_median": {k: statistics.median(v) for k, v in speed.items()},
        "calibration_draft1": calibration(conf1, np.array([s["n"] >= 1 for s in k3_steps])),
        "calibration_drafts12": calibration(conf12, np.array([s["n"] >= 2 for s in k3_steps])),
        "rate_fixed": {k: rate(k3_steps, verify, head, None, k) for k in (1, 2, 3)},
        "rate_confidence": {str(t): rate(k3_steps, verify, head, t) for t in THETAS},
        "rate_confidence_k2": {str(t): rate(k3_steps, verify, head, t, 2) for t in THETAS},
    }
    best = max(result["rate_confidence"].values())
    result["best_rule_over_k1"] = best / result["rate_fixed"][1]
    print(json.dumps({k: v for k, v in result.items() if k not in ("calibration_draft1", "calibration_drafts12")},
                     indent=1))
    if args.json:
        args.json.write_text(json.dumps({**result, "steps": k3_steps}, indent=1))


if __name__ == "__main__":
    main()
