"""Intra-op threads that spin within a run (the runtime's sessions) against threads that never spin, on a pack's
two graphs run in turn as the decode loop runs them.

    python bench/thread_spin.py PACK [--context 128] [--k 4] [--rounds 3] [--steps 12] [--threads 2] [--json OUT]

Each round starts one process per setting, alternating which goes first: both sessions opened with
runtime/ort_session.py's options (spin True: spinning while a run is in progress, stopped when it returns;
spin False: never), then `steps` speculative steps timed as the loop makes them (k draft steps over one token,
a verify over k + 1) and as many single-token target steps, one row alone and as the cpu backend runs a greedy
one (two rows: the token and a pad draft; docs/architecture.md, "One row is never run alone"), on a cache of
`context` random positions (time does not depend on the values). Medians per round; the JSON keeps every round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from specpack.bench.report import cpu_model

SETTINGS = {"spin_within_run": True, "never_spin": False}


def measure(pack: Path, spin: bool, context: int, k: int, steps: int, threads: int) -> dict[str, float]:
    """Median milliseconds of a draft step, a verify over k + 1 tokens, a speculative step and a target step."""
    import onnxruntime as ort

    sys.path.insert(0, str(Path(__file__).parent))
    from step_profile import step_feeds

    from specpack.contract.manifest import Manifest
    from specpack.runtime.ort_session import session_options

    manifest = Manifest.read(pack)
    vocab = manifest.vocab_size

    def session(entry: Any) -> Any:
        return ort.InferenceSession(str(pack / entry.graph.path), sess_options=session_options(threads, spin=spin),
                                    providers=["CPUExecutionProvider"])

    draft, target = session(manifest.draft), session(manifest.target)
    one, verify = step_feeds(draft, context, 1, 0, vocab), step_feeds(target, context, k + 1, k, vocab)
    single, padded = step_feeds(target, context, 1, 0, vocab), step_feeds(target, context, 2, 1, vocab)
    times: dict[str, list[float]] = {"draft_ms": [], "verify_ms": [], "spec_step_ms": [], "target_step_ms": [],
                                     "padded_step_ms": []}
    for i in range(steps + 2):  # two warm-up steps
        t0 = time.perf_counter()
        draft_times = []
        for _ in range(k):
            t = time.perf_counter()
            draft.run(None, one)
            draft_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        target.run(None, verify)
        t1 = time.perf_counter()
        target.run(None, single)
        t2 = time.perf_counter()
        target.run(None, padded)
        t3 = time.perf_counter()
        if i >= 2:
            times["draft_ms"].append(1e3 * statistics.median(draft_times))
            times["verify_ms"].append(1e3 * (t1 - t))
            times["spec_step_ms"].append(1e3 * (t1 - t0))
            times["target_step_ms"].append(1e3 * (t2 - t1))
            times["padded_step_ms"].append(1e3 * (t3 - t2))
    return {name: statistics.median(v) for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pack", type=Path)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", choices=sorted(SETTINGS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.pack, SETTINGS[args.child], args.context, args.k, args.steps, args.threads)))
        return
    rounds: list[dict[str, dict[str, float]]] = []
    for r in range(args.rounds):
        order = list(SETTINGS) if r % 2 == 0 else list(reversed(SETTINGS))
        row = {}
        for name in order:  # a fresh process each: nothing of one setting's pools survives into the other
            out = subprocess.run([sys.executable, __file__, str(args.pack), "--child", name, "--context",
                                  str(args.context), "--k", str(args.k), "--steps", str(args.steps), "--threads",
                                  str(args.threads)], check=True, capture_output=True, text=True).stdout
            row[name] = json.loads(out.strip().splitlines()[-1])
        rounds.append(row)
        print(f"round {r + 1}: " + "; ".join(f"{n}: " + ", ".join(f"{m} {v:.1f}" for m, v in row[n].items())
                                             for n in SETTINGS), flush=True)
    summary = {n: {m: statistics.median(r[n][m] for r in rounds) for m in rounds[0][n]} for n in SETTINGS}
    ratio = {m: summary["spin_within_run"][m] / summary["never_spin"][m] for m in summary["never_spin"]}
    print("median over rounds:", json.dumps(summary), "\nspin within run / never spin:",
          ", ".join(f"{m} {v:.3f}" for m, v in ratio.items()))
    if args.json is not None:
        args.json.write_text(json.dumps({"pack": str(args.pack), "cpu": cpu_model(), "threads": args.threads,
                                         "context": args.context, "k": args.k, "steps": args.steps,
                                         "rounds": rounds, "median": summary, "ratio": ratio}, indent=2) + "\n")


if __name__ == "__main__":
    main()
