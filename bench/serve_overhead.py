"""What the HTTP server adds to a decode: the same greedy requests through Pack.generate and through the server.

One loaded pack; the server (build_app + uvicorn, as `specpack serve` runs it) in a thread of this process on
loopback, one client (http.client: it sleeps in recv while the server decodes). Prompt by prompt, the two paths
alternate which goes first; the server's requests send the same token ids to /v1/completions, streamed in
odd rounds. Reported: medians per path of wall time, prefill (time to first token) and decoding tokens/s, and
the median of per-prompt wall-time ratios; the outputs must be identical.

    python bench/serve_overhead.py PACK --prompts FILE LIMIT [--prompts FILE LIMIT ...] [--max-tokens 16]
        [--rounds 2] [--json bench/results/serve_overhead_cpu.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import specpack
from specpack.bench.report import machine_info
from specpack.prompts import read_prompts
from specpack.serve.app import build_app
from specpack.serve.config import ServeConfig
from specpack.serve.server import serve_in_thread


def direct(pack: Any, ids: list[int], max_tokens: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    out = pack.generate(ids, max_tokens, temperature=0)
    return {"wall_s": time.perf_counter() - t0, "text": out.text, "stats": out.stats}


def served(url: str, ids: list[int], max_tokens: int, stream: bool) -> dict[str, Any]:
    where = urlparse(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=600)
    body = {"model": "pack", "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    raw = resp.read().decode()
    wall = time.perf_counter() - t0
    conn.close()
    if resp.status != 200:
        raise SystemExit(f"the server answered {resp.status}: {raw[:300]}")
    if not stream:
        answer = json.loads(raw)
        return {"wall_s": wall, "text": answer["choices"][0]["text"], "stats": answer["speculation"]}
    chunks = [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: {")]
    last = next(c for c in reversed(chunks) if c["choices"] and c["choices"][0]["finish_reason"])
    return {"wall_s": wall, "text": "".join(c["choices"][0]["text"] for c in chunks if c["choices"]),
            "stats": last["speculation"]}


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {"wall_s": statistics.median(r["wall_s"] for r in rows),
            "prefill_s": statistics.median(r["stats"]["ttft_s"] for r in rows),
            "decode_tokens_per_s": statistics.median(r["stats"]["tokens_per_s"] for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pack", type=Path)
    parser.add_argument("--prompts", nargs=2, metavar=("FILE", "LIMIT"), action="append", required=True)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "serve_overhead_cpu.json")
    args = parser.parse_args()

    pack = specpack.load(args.pack)
    prompts = [p for path, limit in args.prompts for p in read_prompts([path], limit=int(limit))]
    ids = [pack.tokenizer.encode_chat(p.text) if p.chat else pack.encode(p.text) for p in prompts]
    pairs: list[dict[str, Any]] = []
    with serve_in_thread(build_app(pack, ServeConfig(args.pack, model_name="pack"))) as url:
        for r in range(args.rounds):
            for j, prompt_ids in enumerate(ids):
                got = {}
                for path in ("direct", "served") if (r + j) % 2 == 0 else ("served", "direct"):
                    got[path] = (direct(pack, prompt_ids, args.max_tokens) if path == "direct"
                                 else served(url, prompt_ids, args.max_tokens, stream=r % 2 == 1))
                d, s = got["direct"], got["served"]
                pairs.append({"round": r, "prompt": prompts[j].id, "stream": r % 2 == 1, "direct": d, "served": s,
                              "identical": d["text"] == s["text"], "ratio": s["wall_s"] / d["wall_s"]})
    pack.close()
    result = {
        "machine": {**machine_info(None), "shared": True}, "date": time.strftime("%Y-%m-%d"),
        "pack": str(args.pack), "max_tokens": args.max_tokens, "rounds": args.rounds, "requests": len(pairs),
        "direct": summary([p["direct"] for p in pairs]), "served": summary([p["served"] for p in pairs]),
        "served_over_direct_wall": statistics.median(p["ratio"] for p in pairs),
        "identical": sum(p["identical"] for p in pairs),
        "pairs": [{**p, "direct": {k: v for k, v in p["direct"].items() if k != "text"},
                   "served": {k: v for k, v in p["served"].items() if k != "text"}} for p in pairs],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("pairs", "machine")}, indent=1))


if __name__ == "__main__":
    main()
