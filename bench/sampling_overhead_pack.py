"""What in-graph sampling adds to a whole verify step (k = 4) and draft step of a real pack, on this CPU.

Complements bench/sampling_overhead.py (the heads alone): here the full verify.onnx / draft_step.onnx of
a pack run through the runtime's own backend (the calls the loop makes), greedy against each sampling setting, the
settings interleaved round by round (shared machines drift), medians reported.

    python bench/sampling_overhead_pack.py PACK [--rounds 15] [--context 64] [--out bench/results/sampling_overhead_pack.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import time
from pathlib import Path

from sampling_overhead import CASES as HEAD_CASES  # bench/ is on sys.path when run as a script

import specpack
from specpack.runtime.state import NO_DRAFTS, DecodeState, Proposal
from specpack.runtime.stats import DecodeStats
from specpack.sampling import SamplingParams, Uniforms

K = 4
CODE = 'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n'
# the head benchmark's settings, less its synthetic "broad" / "flat" logits (here the context is real text)
CASES = {name: params for name, params in HEAD_CASES.items() if "logits" not in name}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pack", type=Path)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--context", type=int, default=64, help="tokens already in the caches")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sampling_overhead_pack.json")
    args = parser.parse_args()

    pack = specpack.load(args.pack)
    m, n = pack.manifest, args.context
    text = pack.tokenizer.encode(CODE * 8)  # real text: random ids give flat distributions (top-p's worst case)
    drawing = SamplingParams(1.0)  # draws the uniforms once; each case then binds its own sampling inputs
    state = DecodeState.start(text[: n + K + 1], 1, drawing, Uniforms(drawing, m.k_max, seed=0), eos_ids=frozenset(),
                              max_len=m.max_len, k_max=m.k_max, stats=DecodeStats(k=K))
    state.uniforms.draw(K)
    cases = {name: dataclasses.replace(state, params=params, sampling_inputs=params.graph_inputs())
             for name, params in CASES.items()}  # same ids and uniforms, each case's sampling inputs
    times: dict[str, dict[str, list[float]]] = {name: {"verify": [], "draft": []} for name in CASES}
    with pack.exclusive() as backend:
        target, draft = backend.target(), backend.draft()
        target.reset(state)
        state.length = n
        target.verify(state, NO_DRAFTS)  # fill both caches with n tokens of context
        draft.reset(state)
        draft.step(state, n, 0)
        for row in range(K):  # a real q for every draft row
            draft.step(state, n + row + 1, row)
        draft.rollback(state, n)
        state.length = n + 1
        proposal = Proposal(tokens=state.ids[n + 1 : n + 1 + K], q=draft.q(state, K))  # the last committed token + K
        for _ in range(args.rounds):
            for name, case in cases.items():
                case.length = state.length
                t = time.perf_counter()
                target.verify(case, proposal)
                times[name]["verify"].append(time.perf_counter() - t)
                target.rollback(case, n)
                t = time.perf_counter()
                draft.step(case, n + 1, K - 1)  # the last q row is scratch here
                times[name]["draft"].append(time.perf_counter() - t)
                draft.rollback(case, n)

    result: dict[str, object] = {"pack": str(args.pack), "k": K, "context": n, "rounds": args.rounds,
                                 "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                             "load_average_before": os.getloadavg()}}
    greedy = {step: statistics.median(times["greedy"][step]) for step in ("verify", "draft")}
    for name in CASES:
        row = {}
        for step in ("verify", "draft"):
            med = statistics.median(times[name][step])
            row[f"{step}_ms"] = med * 1e3
            row[f"{step}_over_greedy_pct"] = 100 * (med / greedy[step] - 1)
        result[name] = row
        print(f"{name:30s} verify {row['verify_ms']:7.1f} ms ({row['verify_over_greedy_pct']:+5.1f} %)   "
              f"draft {row['draft_ms']:6.1f} ms ({row['draft_over_greedy_pct']:+5.1f} %)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
