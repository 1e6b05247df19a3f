"""N requests at once through the runtime's scheduler (Pack.submit, docs/batching.md) against the same requests one
at a time (Pack.generate), on one pack, machine and run: aggregate tokens/s, time to first token, identical outputs.

    python bench/batch_cpu.py PACK --prompts HumanEval.jsonl.gz --clients 4 [--max-new-tokens 32] [--k auto]
        [--threads 2] [--rounds 2] [--json bench/results/batch_cpu.json]

The batch's rows verify one after the other on their own cache slots (SerialVerifier): this measures what the
scheduler costs and what it buys in time to first token before the batched verify graph exists.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import specpack
from specpack.limits import parse_k
from specpack.prompts import read_prompts
from specpack.runtime.backend import BackendOptions
from specpack.runtime.pack import Pack
from specpack.runtime.request import GenerateRequest


def _alone(pack: Pack, requests: list[GenerateRequest]) -> tuple[list[list[int]], dict[str, float]]:
    """One at a time, all arrived at t0: each waits for those before it."""
    t0 = time.perf_counter()
    tokens, ttft = [], []
    for request in requests:
        out = pack.generate_request(request)
        tokens.append(out.tokens)
        ttft.append(time.perf_counter() - t0 - out.stats.decode_s)
    elapsed = time.perf_counter() - t0
    return tokens, {"alone_tok_s": sum(map(len, tokens)) / elapsed, "alone_ttft_p50_s": statistics.median(ttft)}


def _batched(pack: Pack, requests: list[GenerateRequest]) -> tuple[list[list[int]], dict[str, float]]:
    """All submitted at t0, all admitted at once (slots = clients)."""
    t0 = time.perf_counter()
    handles = [pack.submit(r) for r in requests]
    outs = [h.result() for h in handles]
    elapsed = time.perf_counter() - t0
    tokens = [o.tokens for o in outs]
    return tokens, {"batched_tok_s": sum(map(len, tokens)) / elapsed,
                    "batched_ttft_p50_s": statistics.median(o.stats.ttft_s for o in outs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pack", type=Path)
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--k", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    prompts = read_prompts([args.prompts], limit=args.clients)[: args.clients]
    k = parse_k(args.k)

    alone_pack = specpack.load(args.pack, threads=args.threads)
    batch_pack = specpack.load(args.pack, threads=args.threads, options=BackendOptions(slots=args.clients))
    requests = [GenerateRequest.of(p.text, args.max_new_tokens, k=k, chat=p.chat, limits=alone_pack.limits)
                for p in prompts]
    alone_pack.generate_request(requests[0])  # warm-up: sessions, the draft opened
    batcher = batch_pack.start_batching(max_waiting=0)
    batch_pack.generate_request(requests[0])
    runs: list[dict[str, float]] = []
    for _ in range(args.rounds):  # alternated, so that load from other processes falls on both alike
        alone, alone_run = _alone(alone_pack, requests)
        batched, batched_run = _batched(batch_pack, requests)
        runs.append({**alone_run, **batched_run, "identical": sum(a == b for a, b in zip(alone, batched, strict=True))})
    result = {"clients": args.clients, "max_new_tokens": args.max_new_tokens, "k": args.k, "rounds": runs,
              **{f"median_{key}": statistics.median(r[key] for r in runs) for key in runs[0]},
              "mean_rows": statistics.mean(batcher.batch_sizes)}
    result["median_speedup"] = result["median_batched_tok_s"] / result["median_alone_tok_s"]
    for pack in (alone_pack, batch_pack):
        pack.close()
    print(json.dumps(result, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
