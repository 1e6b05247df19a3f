"""BatchKCap's decisions on a real batched pack, step by step: what it estimated (the cap, d_B, V(T), E[accepted])
beside what each step then cost, for N requests decoded together, against the same requests at k 0 and one at a time
(docs/batching.md, "What remains"; bench/README.md, "After BatchKCap's padded-width pricing").

    python bench/batch_k_trace.py PACK --prompts HumanEval.jsonl.gz [--clients 4] [--requests 8]
        [--max-new-tokens 64] [--threads 2] [--max-prompt-chars N] [--json OUT.json]

PACK: exported with --max-batch N (the cpu backend opens its batched graphs). Greedy, in-process (pack.submit, no
HTTP). Configurations, each on a fresh load: `auto` (k auto: BatchKCap, traced), `k0` (k 0 for every request), and
`alone` (k auto, one request at a time, --max-batch 1: what the server does without batching). Per configuration:
aggregate decode tokens/s (new tokens over the wall time from the first submit to the last result), time to first
token p50, tau; for `auto`, every step's cap decision (rows, cap, E[accepted | kappa], d_B, V(T) at the rows it priced)
and what the step then measured (the ks the rows verified, the draft phase and the verify); the scheduler's time per
phase (join: each drafter's begin, the draft model's prefill; prefill: the target's; decode).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import specpack
from specpack.prompts import read_prompts
from specpack.runtime.adaptive_k import _interpolate
from specpack.runtime.backend import BackendOptions
from specpack.runtime.batch_k import BatchKCap, padded_rows
from specpack.runtime.request import GenerateRequest


class TracedCap(BatchKCap):
    """BatchKCap recording each decision and each observation."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trace: list[dict[str, Any]] = []

    def cap(self, rows: int) -> int:
        chosen = super().cap(rows)
        known = [(t, statistics.median(s)) for t, s in enumerate(self.verify) if s]
        entry: dict[str, Any] = {"rows": rows, "cap": chosen}
        if known and rows:
            d = statistics.median(self.per_draft) if self.per_draft else 0.0
            entry |= {"E": [round(x, 3) for x in self._tokens], "d_ms": d * 1e3,
                      "V_ms": {t: _interpolate(known, t, self.config.verify_slope) * 1e3
                               for t in sorted({padded_rows([kappa] * rows) for kappa in range(self.k_max + 1)})}}
        self.trace.append(entry)
        return chosen

    def observe(self, ks: list[int], accepted: list[int], draft_s: float | None, verify_s: float) -> None:
        super().observe(ks, accepted, draft_s, verify_s)
        if self.trace:  # draft_ms None: a draft's catch-up was in the phase (no d_B sample)
            self.trace[-1] |= {"ks": list(ks), "accepted": list(accepted),
                               "draft_ms": None if draft_s is None else draft_s * 1e3,
                               "verify_ms": verify_s * 1e3}


PHASES = ("_join", "_prefill", "_decode")  # Scheduler's phases: the drafter's begin (the draft's prefill), prefill, decode


def timed_phases(totals: dict[str, float]) -> Any:
    """Patch the Scheduler's phases to add their wall time into `totals`; returns the undo."""
    from specpack.runtime.scheduler import Scheduler

    originals = {name: getattr(Scheduler, name) for name in PHASES}

    def wrap(name: str) -> Any:
        def timed(self: Any) -> None:
            t0 = time.perf_counter()
            originals[name](self)
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - t0
        return timed

    for name in PHASES:
        setattr(Scheduler, name, wrap(name))
    return lambda: [setattr(Scheduler, name, fn) for name, fn in originals.items()]


def run(pack_dir: Path, requests: list[GenerateRequest], clients: int, k: int | None, threads: int,
        traced: bool) -> dict[str, Any]:
    options = BackendOptions(slots=max(clients, 1), threads=threads)
    phases: dict[str, float] = {}
    undo = timed_phases(phases)
    with specpack.load(pack_dir, options=options) as pack:
        policy = TracedCap(pack.manifest.k_max, clients) if traced else None
        pack.start_batching(max_batch=clients, batch_policy=policy)
        pack.generate(requests[0].prompt, 8, k=k)  # warm-up (sessions, first runs)
        if policy is not None:
            policy.trace.clear()
        phases.clear()
        asked = [GenerateRequest(r.prompt, r.max_new_tokens, k=k) for r in requests]
        t0 = time.perf_counter()
        handles, outs, ttft = [], [], []
        pending = list(asked)
        while pending or handles:  # keep `clients` requests in flight, as closed-loop clients do
            while pending and len(handles) < clients:
                handles.append((pack.submit(pending.pop(0)), time.perf_counter()))
            handle, started = handles.pop(0)
            out = handle.result()
            outs.append(out)
            ttft.append(time.perf_counter() - started - out.stats.decode_s)
        wall = time.perf_counter() - t0
    undo()
    tokens = sum(len(o.tokens) for o in outs)
    steps = sum(o.stats.steps for o in outs)
    result: dict[str, Any] = {"clients": clients, "k": k, "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
                              "ttft_p50_s": statistics.median(ttft), "tau": tokens / max(steps, 1),
                              "phase_s": {name.strip("_"): phases.get(name, 0.0) for name in PHASES},
                              "outputs": [o.tokens for o in outs]}
    if policy is not None:
        result["trace"] = policy.trace
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pack", type=Path)
    parser.add_argument("--prompts", nargs="+", required=True)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-prompt-chars", type=int, help="cut each prompt to this many characters (serve_load.py's)")
    parser.add_argument("--only", nargs="*", default=["auto", "k0", "alone"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    requests = [GenerateRequest(p.text[: args.max_prompt_chars], args.max_new_tokens, chat=p.chat)
                for p in read_prompts(args.prompts, args.requests)]
    requests = requests[: args.requests]
    configs = {"auto": (args.clients, None, True), "k0": (args.clients, 0, False), "alone": (1, None, False)}
    results: dict[str, Any] = {"machine": f"{os.cpu_count()} cores", "requests": len(requests),
                               "max_new_tokens": args.max_new_tokens, "max_prompt_chars": args.max_prompt_chars}
    for name in args.only:
        clients, k, traced = configs[name]
        results[name] = run(args.pack, requests, clients, k, args.threads, traced)
        r = results[name]
        print(f"{name}: {r['tokens_per_s']:.1f} tok/s, TTFT p50 {r['ttft_p50_s']:.2f} s, tau {r['tau']:.2f}, "
              f"phases {' / '.join(f'{k} {v:.1f} s' for k, v in r['phase_s'].items())} of {r['wall_s']:.1f} s", flush=True)
    if "alone" in results:
        for name in ("auto", "k0"):
            if name in results:
                print(f"{name} / alone: {results[name]['tokens_per_s'] / results['alone']['tokens_per_s']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
