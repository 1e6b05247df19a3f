"""Drafters and k policies on the real pair, per Spec-Bench category and HumanEval (issue 10's benchmark).

    python bench/drafters.py PACK --out bench/results/drafters_cpu.json [--categories humaneval,rag]
        [--configs ar,model-k4] [--prompts-per-category 3] [--max-new-tokens 64] [--repeat 1] [--device cpu|cuda]
    python bench/drafters.py --summarize bench/results/drafters_cpu.json

Every prompt is decoded greedily by each config, one after another in one process (the same pack, machine
and run as its autoregressive baseline):

    ar            k = 0: the target alone, through the verify graph
    model-k2/k4   the draft model, a fixed k
    model-auto    the draft model, adaptive k (runtime/adaptive_k.py)
    ngram-k4      prompt lookup (runtime/ngram_drafter.py), a fixed k
    ngram-auto    prompt lookup, adaptive k

Categories: Spec-Bench's mt_bench (its 8 MT-bench categories, one prompt from each of the first N), translation,
summarization, qa, math_reasoning, rag (the first N of each), and HumanEval (the first N, plain completion).
Speedup = decode tokens/s (after the first token) of a config / of `ar` on the same prompt; a category's
speedup is the median over its prompts. Beside it, the predicted speedup from the steps actually taken
(k_histogram) and the step costs measured on a quiet run of this machine (bench/README.md: c = 0.35 for the
model drafter, 0 for prompt lookup; v(k)), which contention on a shared machine does not move:
    predicted = (new tokens - 1) / sum over steps of (k c + v(k))
With --measure-costs (the default on --device cuda), c and v(k) are measured by this run instead, at the
median prompt length of the run, before the prompts (bench/timing.py), and stored under "costs".
Each config's output is compared with `ar`'s (greedy: identical).
Adaptive k keeps the step costs it measured across the requests of one pack (as a server does), so the
configs run in a fixed order after one warm-up generation each. --repeat N decodes each prompt N times per
config and keeps the median time (for comparisons within noise). Results are merged into --out after every
prompt, so a long benchmark runs as several short locked runs (--categories):
    flock /tmp/specpack-heavy.lock python bench/drafters.py PACK --out OUT --categories humaneval,mt_bench
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

CONFIGS: dict[str, tuple[int | None, str | None]] = {  # name -> (k: None is adaptive, drafter)
    "ar": (0, None),
    "model-k1": (1, "model"),
    "model-k2": (2, "model"),
    "model-k3": (3, "model"),
    "model-k4": (4, "model"),
    "model-auto": (None, "model"),
    "ngram-k1": (1, "ngram"),
    "ngram-k2": (2, "ngram"),
    "ngram-k4": (4, "ngram"),
    "ngram-auto": (None, "ngram"),
}
DEFAULT_CONFIGS = ("ar", "model-k2", "model-k4", "model-auto", "ngram-k4", "ngram-auto")  # the earlier runs' six
SPEC_BENCH = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
CATEGORIES = (*SPEC_BENCH, "humaneval")
PROMPTS = Path(os.environ.get("PROMPTS_DIR", "../shared/data/prompts"))  # from the project root; never copied
WARMUP_TOKENS = 8
QUIET_C = {"model": 0.35, "ngram": 0.0}  # draft step / target step, bench/README.md ("The real pair on the CPU")
QUIET_V = [1.0, 1.07, 1.17, 1.195, 1.22, 1.2525, 1.285, 1.3175, 1.35]  # v(0..8): 1, 2, 4, 8 measured; linear between


def select_prompts(spec_bench: Path, humaneval: Path, categories: list[str], n: int) -> list[Any]:
    """Up to n prompts of each category, in file order (mt_bench: the first prompt of each of its first n
    categories); n may be larger than wanted: run() keeps the first ones that fit the pack."""
    from specpack.prompts import BenchPrompt, read_prompt_file

    chosen: list[BenchPrompt] = []
    spec = read_prompt_file(spec_bench)
    for category in categories:
        if category == "humaneval":
            picked = read_prompt_file(humaneval)[:n]
        elif category == "mt_bench":
            picked = [next(p for p in spec if p.category == sub) for sub in MT_BENCH[:n]]
        else:
            picked = [p for p in spec if p.category == category][:n]
        chosen += [BenchPrompt(p.id, category, p.text, p.chat) for p in picked]
    return chosen


def decode(pack: Any, ids: list[int], config: str, max_new_tokens: int) -> dict[str, Any]:
    k, drafter = CONFIGS[config]
    out = pack.generate(ids, max_new_tokens, k=k, drafter=drafter)
    s = out.stats
    return {"tokens": out.tokens, "decode_s": s["decode_s"], "ttft_s": s["ttft_s"], "new_tokens": s["new_tokens"],
            "tokens_per_s": s["tokens_per_s"], "alpha": s["alpha"], "tau": s["tau"], "steps": s["steps"],
            "k_asked_histogram": s["k_asked_histogram"], "k_histogram": s["k_histogram"],
            "draft_s": s["draft_s"], "verify_s": s["verify_s"]}


def run(args: argparse.Namespace) -> None:
    from specpack.runtime.pack import load

    results = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
    pack = load(args.pack, device=args.device, threads=args.threads)
    n = args.prompts_per_category
    candidates = select_prompts(args.spec_bench, args.humaneval, args.categories, 4 * n)
    encoded: list[tuple[Any, list[int]]] = []
    for category in args.categories:  # the first n of each category whose prompt and output fit max_len
        fitting = [(p, ids) for p in candidates if p.category == category
                   for ids in [pack.encode(p.text, chat=p.chat)]
                   if len(ids) + args.max_new_tokens <= pack.manifest.max_len]
        skipped = sum(p.category == category for p in candidates) - len(fitting)
        if skipped:
            print(f"{category}: {skipped} of the first {4 * n} prompts do not fit max_len {pack.manifest.max_len}",
                  file=sys.stderr)
        encoded += fitting[:n]
    for config in args.configs:  # ONNX Runtime's arenas (CUDA graphs), and adaptive k's first cost measurements
        decode(pack, encoded[0][1], config, WARMUP_TOKENS)
    if args.measure_costs:
        results["costs"] = measured_costs(pack, [ids for _, ids in encoded])
        print(f"costs: c {results['costs']['c']:.3f}, v {results['costs']['v']}", file=sys.stderr)
    started = time.time()
    session = {"categories": args.categories, "configs": args.configs, "repeat": args.repeat,
               "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)), "load_avg_start": os.getloadavg()}
    results.setdefault("sessions", []).append(session)
    for prompt, ids in encoded:
        entry = results["runs"].setdefault(prompt.id, {"category": prompt.category, "prompt_tokens": len(ids),
                                                       "configs": {}})
        for config in args.configs:
            reps = [decode(pack, ids, config, args.max_new_tokens) for _ in range(args.repeat)]
            best = sorted(reps, key=lambda r: r["decode_s"])[len(reps) // 2]  # the median time
            best["decode_s_reps"] = [r["decode_s"] for r in reps]
            entry["configs"][config] = best
            print(f"{prompt.id:32s} {config:11s} {best['tokens_per_s']:6.2f} tok/s  tau {best['tau']:.2f}  "
                  f"k asked {best['k_asked_histogram']}", file=sys.stderr, flush=True)
        results["machine"] = machine(args.threads, args.device)
        results["config"] = {"pack": str(args.pack), "max_new_tokens": args.max_new_tokens, "greedy": True,
                             "prompts_per_category": args.prompts_per_category}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summarize(results), indent=1) + "\n")
    session["seconds"], session["load_avg_end"] = round(time.time() - started), os.getloadavg()
    args.out.write_text(json.dumps(summarize(results), indent=1) + "\n")
    print(f"{len(encoded)} prompts in {session['seconds']} s", file=sys.stderr)
    pack.close()


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per category and config: median speedup over AR (per prompt, decode tokens/s), alpha, tau, identical."""
    by_category: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for entry in results["runs"].values():
        ar = entry["configs"].get("ar")
        if ar is None:
            continue
        for config, r in entry["configs"].items():
            by_category[entry["category"]][config].append({
                "speedup": r["tokens_per_s"] / ar["tokens_per_s"], "tokens_per_s": r["tokens_per_s"],
                "predicted": predicted_speedup(config, r, results.get("costs")),
                "tau": r["tau"], "alpha": r["alpha"], "identical": r["tokens"] == ar["tokens"],
                "k_asked": r["k_asked_histogram"]})
    summary: dict[str, Any] = {}
    for category in sorted(by_category, key=lambda c: CATEGORIES.index(c) if c in CATEGORIES else 99):
        summary[category] = {}
        for config, rows in by_category[category].items():
            ks = [sum(col) for col in zip(*(r["k_asked"] for r in rows), strict=True)]
            summary[category][config] = {
                "prompts": len(rows), "speedup_median": statistics.median(r["speedup"] for r in rows),
                "speedups": [round(r["speedup"], 3) for r in rows],
                "predicted_median": statistics.median(r["predicted"] for r in rows),
                "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rows),
                "tau_mean": statistics.fmean(r["tau"] for r in rows),
                "alpha_mean": statistics.fmean(r["alpha"] for r in rows),
                "identical_to_ar": all(r["identical"] for r in rows), "k_asked_histogram": ks}
    results["summary"] = summary
    return results


def measured_costs(pack: Any, prompts: list[list[int]]) -> dict[str, Any]:
    """c and v(1..k_max) on this machine, at the run's median prompt length (bench/timing.py)."""
    from specpack.bench.timing import measure_step_costs

    lengths = sorted(len(ids) for ids in prompts)
    context = min(lengths[len(lengths) // 2], pack.manifest.max_len - pack.manifest.k_max - 2)
    filler = max(prompts, key=len)
    ks = list(range(1, pack.manifest.k_max + 1))
    return measure_step_costs(pack, ks, context, filler, reps=20).to_dict()


def predicted_speedup(config: str, r: dict[str, Any], costs: dict[str, Any] | None = None) -> float:
    """Decoded tokens per target-step time, from the steps this decode took (k_histogram); the step costs are
    the run's own (`costs`, --measure-costs) or the quiet CPU machine's (QUIET_C, QUIET_V)."""
    drafter = CONFIGS[config][1] or ""
    if costs is None:
        c, v = QUIET_C.get(drafter, 0.0), QUIET_V
    else:
        c = costs["c"] if drafter == "model" else 0.0
        v = [1.0] + [costs["v"][str(k)] for k in range(1, len(costs["v"]) + 1)]
    cost = sum(steps * (k * c + v[k]) for k, steps in enumerate(r["k_histogram"]))
    return (r["new_tokens"] - 1) / cost if cost else 1.0


def table(results: dict[str, Any]) -> str:
    """A markdown table of the median speedups (and, for adaptive k, the k asked most often)."""
    configs = [c for c in CONFIGS if c != "ar" and any(c in row for row in results["summary"].values())]
    lines = ["| category | prompts | AR tok/s | " + " | ".join(configs) + " |",
             "|---|---|---|" + "---|" * len(configs)]
    for category, row in results["summary"].items():
        cells = []
        for c in configs:
            if c not in row:
                cells.append("")
                continue
            cell = f"{row[c]['speedup_median']:.2f}x ({row[c]['predicted_median']:.2f}x)"
            cells.append(cell if row[c]["identical_to_ar"] else cell + " (differs)")
        lines.append(f"| {category} | {row['ar']['prompts']} | {row['ar']['tokens_per_s_median']:.2f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine(threads: int | None, device: str) -> dict[str, Any]:
    from specpack.bench.report import machine_info

    info = machine_info(threads)
    info["device"] = device
    if device == "cuda":
        import subprocess

        info["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                     capture_output=True, text=True).stdout.strip()
    info["load_avg"] = os.getloadavg()
    info["host"] = platform.node()
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pack", type=Path, nargs="?")
    parser.add_argument("--out", type=Path, default=Path("bench/results/drafters_cpu.json"))
    parser.add_argument("--categories", default=",".join(CATEGORIES), type=lambda s: s.split(","))
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), type=lambda s: s.split(","))
    parser.add_argument("--prompts-per-category", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="the pack's backend: cpu (default) or cuda")
    parser.add_argument("--measure-costs", action=argparse.BooleanOptionalAction, default=None,
                        help="measure c and v(k) in this run for the predicted speedups (default: on cuda only)")
    parser.add_argument("--spec-bench", type=Path, default=PROMPTS / "spec_bench_question.jsonl")
    parser.add_argument("--humaneval", type=Path, default=PROMPTS / "HumanEval.jsonl.gz")
    parser.add_argument("--summarize", type=Path, default=None, help="Print the table of a results file, run nothing.")
    args = parser.parse_args()
    if args.summarize is not None:
        print(table(summarize(json.loads(args.summarize.read_text()))))
        return
    if args.pack is None:
        parser.error("PACK is required (or --summarize FILE)")
    unknown = [c for c in args.categories if c not in CATEGORIES] + [c for c in args.configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown {unknown}; categories {CATEGORIES}, configs {tuple(CONFIGS)}")
    if args.measure_costs is None:
        args.measure_costs = args.device != "cpu"
    if "ar" not in args.configs:
        args.configs.insert(0, "ar")
    run(args)


if __name__ == "__main__":
    main()
