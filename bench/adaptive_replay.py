"""k policies replayed exactly on the real pair's greedy outputs: adaptive k against every fixed k, no timing noise.

    python bench/adaptive_replay.py bench/results/drafters_cpu.json --pack PACK --draft-graph PLAIN_DRAFT.onnx \
        [--c 0.34] [--v 1,1.07,...] [--catch-up 0.0] [--noise 0.1] [--json bench/results/adaptive_replay.json]
        [--set decay=0.9 ...] [--out OUT.json]

Greedy speculative decoding emits exactly the target's greedy tokens, and a model draft proposed after an
accepted prefix is the draft's own greedy token on the target's text: so one teacher-forced pass of the plain
draft graph over prompt + the target's output (`ar` of drafters.py's results) gives, for every position,
whether the draft's argmax equals the target's next token, and any k policy replays exactly from that through the
runtime's own loop (runtime/replay.py): a step at k accepts the leading matches. Each step costs k c + v(k) target
steps (c, v(k): this machine's medians, measured by drafters.py's fixed-k runs), times lognormal noise of sigma
--noise (the step times the policy sees; seeded); the speedup is decoded tokens / the noiseless cost. The prompts
run in the bench's order on one policy state per drafter, as a pack keeps its measured costs across requests.
A model-drafter step right after k = 0 steps also pays --catch-up target steps per token committed without the
draft (the draft feeds them before its first draft; about 0.07 on an H200 with 9-token captured chunks, where
c = 0.63, and about 0.02 with the 32-token chunks that followed, estimated from the draft's prefill:
bench/README.md, "Drafters on the GPU", "Long captured chunks"), in its draft phase, as the loop times it.
The draft's predictions are stored in the JSON, so `--replay-only` reruns the policies without the model;
`--set NAME=VALUE` replays an AdaptiveConfig other than the default, `--out` writes elsewhere than --json.
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

from drafters import CATEGORIES, PROMPTS, select_prompts

from specpack.runtime.adaptive_k import AdaptiveConfig, AdaptiveK, MeasuredCosts
from specpack.runtime.k_policy import FixedK, KPolicy
from specpack.runtime.replay import ArgmaxDrafter, replay_greedy
from specpack.runtime.state import DecodeState

K_MAX = 8


def draft_matches(draft_graph: Path, ids: list[int], out: list[int]) -> list[bool]:
    """matches[i]: the draft's argmax after prompt + out[:i + 1] equals out[i + 1] (i < len(out) - 1)."""
    from specpack.quantize.fidelity import PlainSession

    logits = PlainSession(draft_graph).logits(ids + out[:-1])  # [S, V]
    predicted = logits[len(ids) : len(ids) + len(out) - 1].argmax(axis=-1)  # after prompt + out[:i+1]
    return [bool(p == t) for p, t in zip(predicted.tolist(), out[1:], strict=True)]


class ModeledCosts:
    """A KPolicy that hands `policy` modeled step times instead of the loop's clock: a step at k costs k c + v(k)
    target steps (+ --catch-up per token the draft skipped), times lognormal noise; it keeps the noiseless total."""

    def __init__(self, policy: KPolicy, c: float, v: list[float], rng: np.random.Generator, noise: float,
                 catch_up: float = 0.0) -> None:
        self.policy, self.c, self.v, self.rng, self.noise, self.catch_up = policy, c, v, rng, noise, catch_up
        self.behind = 0  # tokens committed by k = 0 steps since the draft last ran
        self.cost = 0.0

    @property
    def k_max(self) -> int:
        return self.policy.k_max

    def next_k(self, state: DecodeState) -> int:
        return self.policy.next_k(state)

    def observe(self, k: int, n_accepted: int, elapsed_s: float, draft_s: float, *, tree: object = None) -> None:
        drafting = k * self.c + (self.behind * self.catch_up if k else 0.0)
        self.behind = self.behind + 1 if k == 0 else 0
        step = drafting + self.v[k]
        jitter = float(np.exp(self.rng.normal(0.0, self.noise))) if self.noise else 1.0
        self.policy.observe(k, n_accepted, step * jitter, drafting * jitter)
        self.cost += step


def replay(matches: list[bool], policy: KPolicy, c: float, v: list[float], rng: np.random.Generator,
           noise: float, catch_up: float = 0.0) -> dict[str, Any]:
    """Greedy decoding of len(matches) + 1 tokens (the first from the prefill), k from `policy` each step, through
    the runtime's own loop (runtime/replay.py)."""
    total = len(matches) + 1
    out = list(range(1, total + 1))  # stand-in tokens after a one-token prompt: only the matches matter
    sequence = [0, *out]
    draft_next = [-1, *(out[i + 1] if match else -1 for i, match in enumerate(matches)), -1]  # -1: never accepted
    modeled = ModeledCosts(policy, c, v, rng, noise, catch_up)
    stats = replay_greedy(sequence, 1, ArgmaxDrafter(draft_next), modeled).stats
    hist = stats.k_histogram + [0] * (K_MAX + 1 - len(stats.k_histogram))
    return {"speedup": (total - 1) / modeled.cost, "tau": (total - 1) / stats.steps, "k_histogram": hist}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path)
    ap.add_argument("--pack", type=Path, help="for its tokenizer (no model is loaded)")
    ap.add_argument("--draft-graph", type=Path, help="the plain fp32 draft graph (export_plain_graph)")
    ap.add_argument("--c", type=float, default=0.34)
    ap.add_argument("--v", default="1,1.05,1.10,1.10,1.10,1.13,1.16,1.19,1.22", help="v(0..8) in target steps")
    ap.add_argument("--catch-up", type=float, default=0.0, help="target steps per token the draft catches up on")
    ap.add_argument("--set", nargs="*", default=[], help="AdaptiveConfig fields, NAME=VALUE")
    ap.add_argument("--out", type=Path, help="where to write (default: --json)")
    ap.add_argument("--noise", type=float, default=0.1)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "adaptive_replay.json")
    ap.add_argument("--replay-only", action="store_true", help="reuse the draft predictions stored in --json")
    args = ap.parse_args()
    v = [float(x) for x in args.v.split(",")]
    fields = AdaptiveConfig.__dataclass_fields__
    def parse(name: str, value: str) -> Any:
        kind = fields[name].type
        return int(value) if kind == "int" else value in ("1", "true", "True") if kind == "bool" else float(value)

    config = AdaptiveConfig(**{name: parse(name, value) for name, value in (item.split("=") for item in args.set)})
    results = json.loads(args.results.read_text())
    stored = json.loads(args.json.read_text()) if args.json.exists() else {}
    prompts = stored.get("prompts", {}) if args.replay_only else {}
    if not args.replay_only:
        from specpack.runtime.tokenizer import PackTokenizer

        tokenizer = PackTokenizer.load(args.pack / "tokenizer")
        chosen = {p.id: p for p in select_prompts(PROMPTS / "spec_bench_question.jsonl", PROMPTS / "HumanEval.jsonl.gz",
                                                  list(CATEGORIES), 80)}  # the runs' ids pick
        for pid, entry in results["runs"].items():
            p, out = chosen[pid], entry["configs"]["ar"]["tokens"]
            ids = tokenizer.encode_chat(p.text) if p.chat else tokenizer.encode(p.text)
            prompts[pid] = {"category": entry["category"], "matches": draft_matches(args.draft_graph, ids, out)}
            print(f"{pid}: {sum(prompts[pid]['matches'])}/{len(prompts[pid]['matches'])} positions match", file=sys.stderr)
    policies: dict[str, Any] = {f"k{k}": (lambda k=k: FixedK(k)) for k in range(K_MAX + 1)}
    policies["auto"] = None  # one AdaptiveK state per request, costs kept across requests (as Pack.policy)
    table: dict[str, dict[str, Any]] = {}
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        costs = MeasuredCosts(K_MAX, config.window, config.verify_slope)
        for pid, entry in prompts.items():
            for name, make in policies.items():
                policy = AdaptiveK(K_MAX, config, costs=costs) if make is None else make()
                row = replay(entry["matches"], policy, args.c, v, rng, args.noise, args.catch_up)
                table.setdefault(pid, {"category": entry["category"]}).setdefault(name, []).append(row)
    summary = {}
    print("| category | " + " | ".join(policies) + " | best fixed |")
    for pid, rows in table.items():
        speed = {name: statistics.median(r["speedup"] for r in rows[name]) for name in policies}
        best = max((n for n in policies if n != "auto"), key=lambda n: speed[n])
        summary[pid] = {"category": rows["category"], "speedup": speed, "best_fixed": best,
                        "auto_k_histogram": [sum(col) for col in zip(*(r["k_histogram"] for r in rows["auto"]),
                                                                      strict=True)]}
        print(f"| {rows['category']} | " + " | ".join(f"{speed[n]:.2f}" for n in policies) + f" | {best} |")
    auto = [row["speedup"]["auto"] for row in summary.values()]
    ratio = [row["speedup"]["auto"] / row["speedup"][row["best_fixed"]] for row in summary.values()]
    print(f"auto: worst vs AR {min(auto):.3f}, mean vs best fixed {statistics.fmean(ratio):.3f}, "
          f"worst vs best fixed {min(ratio):.3f}")
    (args.out or args.json).write_text(json.dumps({"c": args.c, "v": v, "catch_up": args.catch_up, "noise": args.noise,
                                                   "seeds": args.seeds, "config": config.__dict__, "summary": summary,
                                                   "prompts": prompts}, indent=1) + "\n")


if __name__ == "__main__":
    main()
