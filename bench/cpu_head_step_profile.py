"""Where a head pack's draft step goes on the CPU: per-step draft and verify seconds at a fixed k, and ONNX Runtime's
own profile of the sessions (each node's median kernel time per run, the run's median), one pack, greedy.

    python bench/cpu_head_step_profile.py --pack HEAD_PACK --prompts HumanEval.jsonl.gz --json OUT [--k 1]
        [--prompts-per-file 2] [--max-new-tokens 48] [--top 16]

The first generate of each prompt is a warm-up and is not counted; the profile covers every run of the process (the
warm-ups' too), so its per-node figures are medians over runs, which the prefill's long runs do not move.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any


def profile_summary(path: Path, top: int) -> dict[str, Any]:
    """One session's profile: runs, the median run, the sum of per-node medians, and the `top` nodes by median."""
    events = json.loads(path.read_text())
    runs = sorted(e["dur"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    per_node: dict[str, list[int]] = collections.defaultdict(list)
    op_of: dict[str, str] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            name = e["name"].removesuffix("_kernel_time")
            per_node[name].append(e["dur"])
            op_of[name] = e["args"].get("op_name", "?")
    medians = sorted(((statistics.median(v), k) for k, v in per_node.items()), reverse=True)
    return {"runs": len(runs), "run_ms_median": statistics.median(runs) / 1e3 if runs else None,
            "nodes": len(medians), "kernel_ms_sum_of_medians": round(sum(m for m, _ in medians) / 1e3, 3),
            "top_nodes": [{"node": k, "op": op_of[k], "ms_median": round(m / 1e3, 3)} for m, k in medians[:top]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pack", required=True)
    parser.add_argument("--prompts", nargs="+", required=True)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--k", type=int, default=1)
    parser.add_argument("--prompts-per-file", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--top", type=int, default=16)
    args = parser.parse_args()

    import specpack.runtime.ort_session as ort_session
    from specpack.bench.report import cpu_model
    from specpack.prompts import read_prompts

    folder = Path(tempfile.mkdtemp(prefix="specpack-profile-"))
    plain = ort_session.session_options

    def profiled(threads: int | None, spin: bool = True) -> Any:
        opts = plain(threads, spin)
        opts.enable_profiling = True
        opts.profile_file_prefix = str(folder / "session")
        return opts

    ort_session.session_options = profiled  # every session this process opens writes its profile
    import onnxruntime as ort

    import specpack as sp

    pack = sp.load(args.pack)
    prompts = [p for path in args.prompts for p in read_prompts([path], None)[: args.prompts_per_file]]
    rows = []
    for prompt in prompts:
        ids = pack.encode(prompt.text, chat=prompt.chat)
        pack.generate(ids, args.max_new_tokens, k=args.k, tree="off")  # warm-up
        stats = pack.generate(ids, args.max_new_tokens, k=args.k, tree="off").stats
        steps = max(1, int(stats["steps"]))
        rows.append({"id": prompt.id, "steps": steps, "tau": stats["tau"], "alpha": stats["alpha"],
                     "draft_ms_per_step": 1e3 * stats["draft_s"] / steps,
                     "verify_ms_per_step": 1e3 * stats["verify_s"] / steps, "tokens_per_s": stats["tokens_per_s"]})
    written = [Path(obj.end_profiling()) for obj in gc.get_objects() if isinstance(obj, ort.InferenceSession)]
    pack.close()
    sessions = {p.name: profile_summary(p, args.top) for p in sorted(written)}
    result = {"machine": cpu_model(), "pack": args.pack, "k": args.k, "max_new_tokens": args.max_new_tokens,
              "rows": rows,
              "draft_ms_per_step_median": statistics.median(r["draft_ms_per_step"] for r in rows),
              "verify_ms_per_step_median": statistics.median(r["verify_ms_per_step"] for r in rows),
              "sessions": sessions}
    args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "sessions"}, indent=1))
    for name, summary in sessions.items():
        print(name, {k: v for k, v in summary.items() if k != "top_nodes"})
        for node in summary["top_nodes"][:8]:
            print("   ", node)


if __name__ == "__main__":
    main()
