"""Greedy alpha of weight-only quantized drafts against the unquantized draft, drafting for one pack's target.

    python bench/draft_quant_alpha.py PLAIN_DRAFT.onnx PACK --prompts FILE [--limit 8] [--max-new-tokens 64]
        [--variants int4,int4-b16,int4-kquant,int4-lm8,int8] [--ks 1,2,4] [--json OUT]

PLAIN_DRAFT.onnx is the draft's unquantized plain graph (export/'s contract, e.g. spec-export's work/draft.onnx).
The pack's target (k = 0, greedy) continues each prompt; each draft variant is quantized from the plain graph
(quantize/stage.py, with the variant's WeightOnlySpec) into a temporary directory, and quantize/fidelity.py
replays greedy speculative decoding from its teacher-forced argmaxes: alpha and tau for each k, the same
counts the decode loop makes. One model in memory at a time.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from specpack.quantize.modes import WeightOnlySpec

VARIANTS: dict[str, WeightOnlySpec] = {
    "int4": WeightOnlySpec("int4", bits=4),                                   # spec-export's int4
    "int4-b16": WeightOnlySpec("int4", bits=4, block_size=16),
    "int4-kquant": WeightOnlySpec("int4", bits=4, algorithm="k_quant"),
    "int4-lm8": WeightOnlySpec("int4", bits=4, lm_head_bits=8),              # lm_head (and tied table) at 8 bits
    "int4-kquant-lm8": WeightOnlySpec("int4", bits=4, algorithm="k_quant", lm_head_bits=8),
    "int8": WeightOnlySpec("int8", bits=8, symmetric=True),                   # spec-export's int8
}


def _sequences(pack_dir: Path, prompts: list[Any], max_new_tokens: int, threads: int) -> tuple[list[list[int]], list[int]]:
    """Prompt + the pack target's greedy continuation, and the prompt lengths."""
    import specpack

    pack = specpack.load(pack_dir, threads=threads)
    try:
        ids = [pack.encode(p.text, chat=p.chat) for p in prompts]
        return [x + pack.generate(x, max_new_tokens, k=0).tokens for x in ids], [len(x) for x in ids]
    finally:
        pack.close()


def _alphas(graph: Path, sequences: list[list[int]], prompt_lens: list[int], ks: list[int],
            threads: int) -> dict[str, dict[str, Any]]:
    from specpack.quantize.fidelity import Acceptance, PlainSession, greedy_acceptance

    draft = PlainSession(graph, threads)
    nexts = [draft.logits(s).argmax(-1).tolist() for s in sequences]  # [S] each
    del draft
    out = {}
    for k in ks:
        acc = Acceptance()
        for seq, n, nxt in zip(sequences, prompt_lens, nexts, strict=True):
            greedy_acceptance(nxt, seq, n, k, acc)
        out[str(k)] = acc.to_dict()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("plain_draft", type=Path)
    parser.add_argument("pack", type=Path)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--ks", default="1,2,4")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from specpack.prompts import read_prompts
    from specpack.quantize.stage import quantize_plain_graph

    ks = [int(k) for k in args.ks.split(",")]
    prompts = read_prompts([args.prompts], args.limit)
    sequences, prompt_lens = _sequences(args.pack, prompts, args.max_new_tokens, args.threads)
    rows: dict[str, Any] = {"none": {"by_k": _alphas(args.plain_draft, sequences, prompt_lens, ks, args.threads)}}
    for name in args.variants.split(","):
        spec = VARIANTS[name]
        with tempfile.TemporaryDirectory(prefix="specpack-draft-") as tmp:
            start = time.perf_counter()
            graph = Path(tmp) / f"draft.{name}.onnx"
            record = quantize_plain_graph(args.plain_draft, graph, spec.method, spec=spec)
            seconds = time.perf_counter() - start
            by_k = _alphas(graph, sequences, prompt_lens, ks, args.threads)
        rows[name] = {"spec": spec.to_dict(), "weight_bytes": record["bytes_after"], "quantize_s": round(seconds, 1),
                      "by_k": by_k, "alpha_delta": {k: by_k[k]["alpha"] - rows["none"]["by_k"][k]["alpha"] for k in by_k}}
    for name, row in rows.items():
        cells = ", ".join(f"k={k}: alpha {v['alpha']:.3f}" for k, v in row["by_k"].items())
        size = f"{row['weight_bytes'] / 2**20:.0f} MiB" if "weight_bytes" in row else "unquantized"
        print(f"{name:12s} {size:>12s}  {cells}")
    if args.json is not None:
        args.json.write_text(json.dumps({"plain_draft": str(args.plain_draft), "pack": str(args.pack),
                                         "prompts": str(args.prompts), "limit": args.limit,
                                         "max_new_tokens": args.max_new_tokens, "variants": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
