"""Held-out top-1 of several heads of one target on the same windows, none of which any of them trained on (issue 22).

    python bench/heldout_eval.py --target T.gguf --corpus HEAD/ckpt --heads HEAD_A HEAD_B [--windows 16]
        [--skip-parts stdlib] --json OUT

The windows: the corpus's held-out ones (distill's own split: every HOLDOUT_EVERY-th window, never trained on),
outside the parts named by --skip-parts (at any depth of an accumulated corpus), `--windows` of them spread evenly.
Why: Run H's recorded held-out top-1 counted windows of stdlib text that its duplicated stdlib part had trained on
(bench/README.md, "Run H"); a head trained on an earlier corpus (`--data corpus:`) shares its held-out windows, since
the earlier corpus comes first. Each head is evaluated as distill evaluates it (trainer._evaluate: the target's
features and distribution, training-time-test steps 0-4, the head's own vocabulary subset), on the CPU in fp32.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np


def part_spans(parts: list[dict[str, Any]], start: int = 0) -> list[tuple[str, int, int]]:
    """(name, first token, end) of every leaf part of a corpus record, an earlier corpus's parts expanded."""
    spans = []
    for part in parts:
        if part.get("parts"):
            spans += part_spans(part["parts"], start)
        else:
            spans.append((str(part["name"]), start, start + int(part["tokens"])))
        start += int(part["tokens"])
    return spans


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from specpack.distill.config import DistillConfig
    from specpack.distill.data import Corpus
    from specpack.distill.trainer import _evaluate, _split, _windows
    from specpack.export.sources import resolve_source
    from specpack.heads.head_file import build_head, check_target, read_head
    from specpack.heads.target_hash import target_weights_sha256

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--corpus", type=Path, required=True, help="a distill run's HEAD/ckpt folder")
    parser.add_argument("--heads", type=Path, nargs="+", required=True)
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--skip-parts", nargs="*", default=["stdlib"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = DistillConfig(batch=4, threads=args.threads)
    corpus = Corpus.load(args.corpus)
    if corpus is None:
        raise SystemExit(f"no corpus in {args.corpus}")
    spans = part_spans(corpus.parts)
    skipped = [(a, b) for name, a, b in spans if name in args.skip_parts]
    heldout = _split(_windows(corpus, config.seq_len))[1]
    clean = np.array([w for w in heldout if not any(a < w + config.seq_len and w < b for a, b in skipped)], np.int64)
    chosen = clean[np.linspace(0, clean.size - 1, min(args.windows, clean.size)).round().astype(int)]
    target_dir = resolve_source(args.target)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    sha = target_weights_sha256(target)
    result: dict[str, Any] = {"corpus": str(args.corpus), "windows": [int(w) for w in chosen], "skipped": args.skip_parts,
                              "parts": spans, "heldout_windows": int(heldout.size), "clean": int(clean.size), "heads": {}}
    for head_dir in args.heads:
        record = read_head(head_dir)
        check_target(record, sha, args.target)
        head = build_head(record, target)
        t0 = time.perf_counter()
        metrics = _evaluate(head, target, corpus, chosen, config)
        result["heads"][str(head_dir)] = {"weights_sha256": record.data["weights_sha256"], **metrics,
                                          "seconds": round(time.perf_counter() - t0, 1)}
        print(head_dir, metrics, flush=True)
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
