"""The runtime's own cost per generated token on a tiny pack, where ONNX Runtime's calls are cheap and the
loop's Python shows: a before/after check for changes to specpack/runtime (public API only, so any version runs it).

    python bench/loop_overhead.py PACK [--rounds 30] [--tokens 200] [--out FILE.json]

Each round runs every mode once (interleaved: a shared machine's slow moments hit all modes alike); the
median over rounds of the whole generate() call per new token is reported, with decoding (after the
first token) per token beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import specpack

PROMPT = "def add(a, b):"
MODES = {  # name -> generate() keywords
    "k0-greedy": {"k": 0},
    "k4-greedy": {"k": 4},
    "k4-sampled": {"k": 4, "temperature": 1.0, "top_p": 0.9, "seed": 0},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pack", type=Path)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    pack = specpack.load(args.pack, threads=args.threads)
    for kwargs in MODES.values():  # warm-up: ONNX Runtime's first runs allocate
        pack.generate(PROMPT, 16, **kwargs)
    call: dict[str, list[float]] = {name: [] for name in MODES}
    decode: dict[str, list[float]] = {name: [] for name in MODES}
    for _ in range(args.rounds):
        for name, kwargs in MODES.items():
            t0 = time.perf_counter()
            out = pack.generate(PROMPT, args.tokens, **kwargs)
            call[name].append((time.perf_counter() - t0) / len(out.tokens))
            decode[name].append(out.stats["decode_s"] / max(1, len(out.tokens) - 1))
    result = {"pack": str(args.pack), "tokens": args.tokens, "rounds": args.rounds, "threads": args.threads,
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average": os.getloadavg()},
              "us_per_token": {name: 1e6 * statistics.median(v) for name, v in call.items()},
              "decode_us_per_token": {name: 1e6 * statistics.median(v) for name, v in decode.items()}}
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
