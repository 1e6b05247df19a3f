"""What in-graph sampling adds to the heads on the CPU, against greedy and against a real verify step.

The verify head at k = 4 (5 positions) and the draft head (1 position) over V = 151,936 (Qwen2.5), alone
and built for that V as attach.py builds them, on ONNX Runtime's CPU EP: greedy, then temperature 0.7,
top-k 50, top-p 0.9 each alone and all three. Overheads are medians over rounds that run every case once,
in turn (shared machines drift). They are compared with the measured fp32 verify step of the 1.5B target
(196 ms) and draft step of the 0.5B draft (67 ms) on the 2-core CPU (measured for the project's design notes). "broad" and "flat"
logits (top-1024 mass below top_p) show the cost of top-p's fallback to a larger candidate set and to a
full sort.

    python bench/sampling_overhead.py [--rounds 40] [--threads 2] [--out bench/results/sampling_overhead.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from specpack.bench.report import cpu_model
from specpack.graphs import heads
from specpack.sampling import SamplingParams

VOCAB, K = 151_936, 4
VERIFY_MS, DRAFT_MS = 196.0, 67.0  # measured earlier: fp32, 2 cores, 64 tokens of context
CASES = {
    "greedy": SamplingParams(0.0),
    "temperature 0.7": SamplingParams(0.7),
    "top-k 50": SamplingParams(1.0, top_k=50),
    "top-p 0.9": SamplingParams(1.0, top_p=0.9),
    "T 0.7 + top-k 50 + top-p 0.9": SamplingParams(0.7, top_k=50, top_p=0.9),
    "top-p 0.9, broad logits": SamplingParams(1.0, top_p=0.9),
    "top-p 0.9, flat logits": SamplingParams(1.0, top_p=0.9),
}


def make_logits(rng: np.random.Generator, rows: int, kind: str = "typical") -> np.ndarray:
    """[1, rows, V] next-token logits.

    typical: a Gaussian bulk and a head of 30 strong candidates (~98% of the mass at T = 1), like an LM.
    broad:   Zipf-like, p(rank r) ~ r^-1.2: top-p 0.9 needs ~3,600 tokens (the second tier).
    flat:    near-uniform: top-p 0.9 needs ~137k tokens (the full sort).
    """
    if kind == "flat":
        return (rng.standard_normal((1, rows, VOCAB)) * 0.01).astype(np.float32)
    if kind == "broad":
        ranks = np.argsort(rng.random((rows, VOCAB)), axis=-1) + 1.0
        return (-1.2 * np.log(ranks)).astype(np.float32)[None]
    x = rng.standard_normal((rows, VOCAB)) * 2.0
    for row in x:
        row[rng.choice(VOCAB, 30, replace=False)] += rng.uniform(10.0, 18.0, 30)
    return x.astype(np.float32)[None]


def feeds(name: str, rows: int, rng: np.random.Generator, verify: bool) -> dict[str, np.ndarray]:
    params = CASES[name]
    logits = make_logits(rng, rows, next((kind for kind in ("broad", "flat") if kind in name), "typical"))
    out = {"logits": logits, "temperature": np.array([params.temperature], np.float32),
           "top_k": np.array([params.top_k], np.int64), "top_p": np.array([params.top_p], np.float32)}
    if not verify:
        return out | {"uniform": rng.random(1, dtype=np.float32)}
    probs = np.exp(make_logits(rng, K)[0] - 18.0)  # a q: the draft's (positive) distribution
    probs /= probs.sum(axis=-1, keepdims=True)
    return out | {"input_ids": rng.integers(0, VOCAB, (1, rows)), "draft_probs": probs[None].astype(np.float32),
                  "uniforms": rng.random((1, K + 1), dtype=np.float32)}


def measure(session: ort.InferenceSession, all_feeds: dict[str, dict[str, np.ndarray]], rounds: int
            ) -> dict[str, list[float]]:
    """Milliseconds per run of each case, the cases interleaved round by round."""
    times: dict[str, list[float]] = {name: [] for name in all_feeds}
    for _ in range(3):  # warm-up
        for f in all_feeds.values():
            session.run(None, f)
    for _ in range(rounds):
        for name, f in all_feeds.items():
            start = time.perf_counter()
            session.run(None, f)
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


def summarize(times: dict[str, list[float]], step_ms: float) -> dict[str, dict[str, float]]:
    greedy = statistics.median(times["greedy"])
    rows = {}
    for name, ts in times.items():
        median = statistics.median(ts)
        q = statistics.quantiles(ts, n=10)
        rows[name] = {"median_ms": median, "p10_ms": q[0], "p90_ms": q[-1], "over_greedy_ms": median - greedy,
                      "over_greedy_pct_of_step": 100 * (median - greedy) / step_ms}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (the 2-core CPU: 2)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sampling_overhead.json")
    args = parser.parse_args()

    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    rng = np.random.default_rng(0)
    result: dict[str, object] = {
        "vocab": VOCAB, "k": K, "threads": args.threads, "rounds": args.rounds, "onnxruntime": ort.__version__,
        "machine": cpu_model(), "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
        "reference_ms": {"verify_1.5b_fp32": VERIFY_MS, "draft_0.5b_fp32": DRAFT_MS},
    }
    for head, rows, step_ms, model in (("verify", K + 1, VERIFY_MS, heads.verify_head_model(vocab=VOCAB)),
                                        ("draft", 1, DRAFT_MS, heads.draft_head_model(vocab=VOCAB))):
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        all_feeds = {name: feeds(name, rows, rng, head == "verify") for name in CASES}
        table = summarize(measure(session, all_feeds, args.rounds), step_ms)
        result[head] = table
        print(f"\n{head} head, {rows} position(s) x V={VOCAB}, {args.threads} threads, {args.rounds} rounds "
              f"(vs the {step_ms:.0f} ms {head} step)")
        print(f"  {'case':32s} {'median':>9s} {'p10':>8s} {'p90':>8s} {'+greedy':>9s} {'% of step':>9s}")
        for name, r in table.items():
            print(f"  {name:32s} {r['median_ms']:7.2f}ms {r['p10_ms']:6.2f}ms {r['p90_ms']:6.2f}ms "
                  f"{r['over_greedy_ms']:7.2f}ms {r['over_greedy_pct_of_step']:8.1f}%")
    result["load_average_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
