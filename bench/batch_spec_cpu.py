"""Speculative decoding of N requests together through the batched engines (docs/batching.md) against the same
requests one at a time through the same engines, on one machine and run: tokens/s, time to first token, outputs.

    python bench/batch_spec_cpu.py PACK --target-graph T.onnx --draft-graph D.onnx --prompts HumanEval.jsonl.gz \
        [--clients 4] [--max-new-tokens 32] [--k 0 4] [--threads 2] [--rounds 2] [--json OUT]

T.onnx and D.onnx: the pack's target and draft in the batched static form with the greedy head
(export/batched_export.py: export_batched_graph, then graphs/attach.py's build_batched_greedy_graph; or a pack's
draft_batched.onnx from spec-export --max-batch). PACK gives the tokenizer, the limits and
the models' shapes (its own graphs are not run). Greedy, fixed k (no cap: runtime/batch_k.py's NoCap). "one at a
time" submits each request after the previous one finished (every run at batch 1: what the per-slot engines do);
"batched" submits all N at once.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import specpack
from specpack.prompts import read_prompts
from specpack.runtime.backend import BackendOptions
from specpack.runtime.batch_k import NoCap
from specpack.runtime.batched_draft import BatchedGreedyDrafter
from specpack.runtime.batched_target import BatchedGreedyTarget
from specpack.runtime.pack import Generation, Pack
from specpack.runtime.request import GenerateRequest


def _one_at_a_time(pack: Pack, requests: list[GenerateRequest]) -> tuple[list[Generation], float, list[float]]:
    t0, ttft, outs = time.perf_counter(), [], []
    for request in requests:  # all arrived at t0: each waits for those before it
        out = pack.submit(request).result()
        outs.append(out)
        ttft.append(time.perf_counter() - t0 - out.stats.decode_s)
    return outs, time.perf_counter() - t0, ttft


def _together(pack: Pack, requests: list[GenerateRequest]) -> tuple[list[Generation], float, list[float]]:
    t0 = time.perf_counter()
    outs = [h.result() for h in [pack.submit(r) for r in requests]]
    return outs, time.perf_counter() - t0, [o.stats.ttft_s for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pack", type=Path)
    ap.add_argument("--target-graph", type=Path, required=True)
    ap.add_argument("--draft-graph", type=Path, required=True)
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--k", type=int, nargs="+", default=[0, 4])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    pack = specpack.load(args.pack, threads=args.threads, options=BackendOptions(slots=args.clients))
    m = pack.manifest
    if m.draft is None:
        raise SystemExit("the pack has no draft model")

    def engine(path: Path, model: object) -> BatchedGreedyTarget:
        return BatchedGreedyTarget(path, num_layers=model.num_layers, kv_heads=model.kv_heads,  # type: ignore[attr-defined]
                                   head_dim=model.head_dim, width=m.max_len + m.k_max + 1,  # type: ignore[attr-defined]
                                   slots=args.clients, k_max=m.k_max, threads=args.threads)

    target, draft = engine(args.target_graph, m.target), engine(args.draft_graph, m.draft)
    pack.start_batching(batched=target, batched_draft=BatchedGreedyDrafter(draft), batch_policy=NoCap(),
                        max_waiting=args.clients)
    prompts = read_prompts([args.prompts], limit=args.clients)[: args.clients]
    results = []
    for k in args.k:
        requests = [GenerateRequest.of(p.text, args.max_new_tokens, k=k, chat=p.chat, drafter="model",
                                       limits=pack.limits) for p in prompts]
        pack.submit(requests[0]).result()  # warm-up
        for _ in range(args.rounds):  # alternated, so that load from other processes falls on both alike
            for mode, run in (("one_at_a_time", _one_at_a_time), ("batched", _together)):
                runs_before = len(target.runs)
                outs, elapsed, ttft = run(pack, requests)
                rows = target.runs[runs_before:]
                results.append({"k": k, "mode": mode, "tok_s": sum(len(o.tokens) for o in outs) / elapsed,
                                "ttft_p50_s": statistics.median(ttft), "alpha": statistics.mean(o.stats.alpha for o in outs),
                                "tokens": [o.tokens for o in outs], "mean_rows": statistics.mean(rows)})
                print(json.dumps({key: v for key, v in results[-1].items() if key != "tokens"}))
    same = all(r["tokens"] == results[0]["tokens"] for r in results)  # greedy: the same text for every k and mode
    summary = {"clients": args.clients, "max_new_tokens": args.max_new_tokens, "threads": args.threads,
               "identical_outputs": same, "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in results]}
    pack.close()
    print(json.dumps({"identical_outputs": same}))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
