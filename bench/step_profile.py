"""Where a pack's step time goes: ONNX Runtime's profiler over a draft step and a verify of k+1 tokens.

    python bench/step_profile.py PACK [--context 128] [--k 4] [--reps 20] [--threads 2] [--json OUT]

Each graph runs `reps` times on a cache of `context` positions (random values: time does not depend on them),
greedy; per node kind the median time a run is summed, and the lm_head (the MatMul / MatMulNBits making the
logits) is reported on its own, so its share of a step is visible.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np


def step_feeds(session: Any, context: int, new: int, k: int, vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {
        "input_ids": rng.integers(0, min(vocab, 1000), (1, new)), "position_ids": np.arange(context, context + new)[None],
        "attention_mask": np.ones((1, context + new), np.int64), "temperature": np.zeros(1, np.float32),
        "top_k": np.zeros(1, np.int64), "top_p": np.ones(1, np.float32)}
    for i in session.get_inputs():
        if i.name.startswith("past_key_values"):
            feeds[i.name] = rng.standard_normal((1, i.shape[1], context, i.shape[3])).astype(np.float32)
    names = {i.name for i in session.get_inputs()}
    if "uniform" in names:
        feeds["uniform"] = np.zeros(1, np.float32)
    if "draft_probs" in names:
        feeds["draft_probs"] = np.full((1, k, vocab), 1.0 / vocab, np.float32)
        feeds["uniforms"] = np.zeros((1, k + 1), np.float32)
    return feeds


def _lm_head_name(path: Path) -> str | None:
    import onnx

    from specpack.graphs.prune_logits import LmHead, find_lm_head

    graph = onnx.load(str(path), load_external_data=False).graph
    head = find_lm_head(graph) if any(o.name == "logits" for o in graph.output) else None
    if isinstance(head, LmHead):
        return head.node
    producers = {o: n for n in graph.node for o in n.output}  # a pack graph: `logits` is internal
    node = producers.get("logits")
    while node is not None and node.op_type not in ("MatMul", "MatMulNBits"):
        node = producers.get(node.input[0])
    return node.name if node is not None else None


def profile(path: Path, new: int, k: int, context: int, reps: int, threads: int, vocab: int,
            spin: bool = False) -> dict[str, Any]:
    import onnxruntime as ort

    from specpack.runtime.ort_session import session_options

    with tempfile.TemporaryDirectory() as tmp:
        opts = session_options(threads)
        if spin:  # the runtime turns spinning off (two sessions share the cores); this shows what it costs
            opts.add_session_config_entry("session.intra_op.allow_spinning", "1")
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tmp) / "profile")
        session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        feeds = step_feeds(session, context, new, k, vocab)
        for _ in range(3):
            session.run(None, feeds)
        for _ in range(reps):
            session.run(None, feeds)
        trace = json.loads(Path(session.end_profiling()).read_text())
    head = _lm_head_name(path)
    per_run: dict[str, list[float]] = defaultdict(list)  # op kind -> microseconds, one entry per run
    run_total, head_us = [], []
    events = [e for e in trace if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    starts = [e for e in trace if e.get("cat") == "Session" and e["name"] == "model_run"]
    for run in starts[3:]:
        t0, t1 = run["ts"], run["ts"] + run["dur"]
        kinds: dict[str, float] = defaultdict(float)
        head_time = 0.0
        for e in events:
            if t0 <= e["ts"] <= t1:
                kinds[e["args"].get("op_name", "?")] += e["dur"]
                if head and e["name"] == f"{head}_kernel_time":
                    head_time += e["dur"]
        for kind, us in kinds.items():
            per_run[kind].append(us)
        run_total.append(run["dur"])
        head_us.append(head_time)
    total = statistics.median(run_total) / 1e3
    by_op = {kind: statistics.median(v) / 1e3 for kind, v in per_run.items()}
    return {"graph": path.name, "new_tokens": new, "k": k, "context": context, "run_ms": total,
            "lm_head_ms": statistics.median(head_us) / 1e3, "lm_head_node": head,
            "by_op_ms": dict(sorted(by_op.items(), key=lambda kv: -kv[1]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pack", type=Path)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--spin", action="store_true", help="intra-op threads spin (the runtime does not)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from specpack.contract.manifest import Manifest

    manifest = Manifest.read(args.pack)
    vocab = manifest.vocab_size
    common = (args.context, args.reps, args.threads, vocab, args.spin)
    results = [profile(args.pack / manifest.draft.graph.path, 1, 0, *common),
               profile(args.pack / manifest.target.graph.path, 1, 0, *common),
               profile(args.pack / manifest.target.graph.path, args.k + 1, args.k, *common)]
    for r in results:
        top = ", ".join(f"{kind} {ms:.1f}" for kind, ms in list(r["by_op_ms"].items())[:6])
        print(f"{r['graph']} ({r['new_tokens']} new tokens, context {r['context']}): {r['run_ms']:.1f} ms a run; "
              f"lm_head {r['lm_head_ms']:.1f} ms ({100 * r['lm_head_ms'] / r['run_ms']:.0f} %); by op (ms): {top}")
    if args.json is not None:
        args.json.write_text(json.dumps({"pack": str(args.pack), "threads": args.threads, "spin": args.spin,
                                         "runs": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
