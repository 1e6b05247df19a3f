"""Does the target compute a position's logits the same whether that row runs alone or with drafts after it?
Greedy speculative decoding gives the target alone's tokens exactly when it does (docs/architecture.md, "One row
is never run alone").

    python bench/row_invariance.py PACK [--device cpu|cuda] --prompts FILE [--limit 8] [--max-new-tokens 64]
        [--ks 1,2,3,4] [--time REPS] [--json OUT]

Per prompt, greedy: the target alone (k = 0) with its single steps padded to two rows (the backends' default,
`BackendOptions.pad_single_steps`) and with one row alone; then each fixed k with a lookup drafter proposing the
padded run's own continuation with every third draft made wrong, so that verifies accept, reject and run all
k + 1 rows. Every run emits the target's argmaxes, so it equals the padded target alone exactly when a row's
logits do not depend on how many rows run with it. Prints, and saves, the first token at which each run differs.
`--time REPS` also times the target alone both ways (decode tokens/s, the median of REPS decodes): what padding
costs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from specpack.runtime.state import DecodeState, Proposal


class CorruptedLookup:
    """Drafts the reference continuation, every third draft (counted over the whole decode) replaced by a wrong token."""

    def __init__(self, prompt_length: int, reference: list[int], vocab_size: int) -> None:
        self.prompt_length, self.reference, self.vocab_size = prompt_length, reference, vocab_size
        self.drafted = 0

    def begin(self, state: DecodeState) -> None:
        pass

    def propose(self, state: DecodeState, k: int) -> Proposal:
        done = state.length - self.prompt_length
        tokens = list(self.reference[done : done + k])
        for i in range(len(tokens)):
            self.drafted += 1
            if self.drafted % 3 == 0:
                tokens[i] = (tokens[i] + 1) % self.vocab_size
        state.ids[state.length : state.length + len(tokens)] = tokens
        return Proposal(tokens=state.ids[state.length : state.length + len(tokens)], q=None)

    def commit(self, state: DecodeState) -> None:
        pass


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where a and b differ (a length difference counts), or None."""
    shorter = None if len(a) == len(b) else min(len(a), len(b))
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), shorter)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pack", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--ks", default="1,2,3,4")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--time", type=int, default=0, metavar="REPS")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import specpack
    from specpack.prompts import read_prompt_file
    from specpack.runtime.backend import BackendOptions
    from specpack.runtime.k_policy import FixedK
    from specpack.runtime.loop import decode
    from specpack.runtime.pack import Pack
    from specpack.runtime.stats import DecodeStats
    from specpack.sampling import SamplingParams, Uniforms

    packs = {pad: specpack.load(args.pack, device=args.device, threads=args.threads,
                                options=BackendOptions(pad_single_steps=pad)) for pad in (True, False)}
    manifest = packs[True].manifest
    ks = [int(k) for k in args.ks.split(",")]
    params = SamplingParams()

    def run(pack: Pack, ids: list[int], k: int, drafter: Any, stats: list[float] | None = None) -> list[int]:
        state = DecodeState.start(ids, args.max_new_tokens, params, Uniforms(params, manifest.k_max),
                                  eos_ids=frozenset(manifest.eos_token_ids), max_len=manifest.max_len,
                                  k_max=manifest.k_max, stats=DecodeStats(k=k))
        with pack.exclusive() as backend:
            decode(state, backend.target(), drafter, FixedK(k))
        if stats is not None:
            stats.append(state.stats.tokens_per_s)
        return state.out

    rows = []
    start = time.perf_counter()
    for prompt in read_prompt_file(args.prompts)[: args.limit]:
        ids = packs[True].encode(prompt.text, chat=prompt.chat)
        none = CorruptedLookup(len(ids), [], manifest.vocab_size)  # k = 0 never asks it
        padded = run(packs[True], ids, 0, none)
        row: dict[str, Any] = {"prompt": prompt.id, "tokens": len(padded),
                               "one_row_alone": first_difference(padded, run(packs[False], ids, 0, none))}
        for k in ks:
            drafter = CorruptedLookup(len(ids), padded, manifest.vocab_size)
            row[f"k{k}"] = first_difference(padded, run(packs[True], ids, k, drafter))
        if args.time:
            speeds: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.time):
                for pad in (True, False):  # interleaved: a slow moment hits both
                    run(packs[pad], ids, 0, none, speeds[pad])
            row["tok_s_padded"], row["tok_s_one_row"] = (statistics.median(speeds[p]) for p in (True, False))
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary: dict[str, Any] = {name: sum(r[name] is None for r in rows) for name in ("one_row_alone", *(f"k{k}" for k in ks))}
    if args.time:
        summary["padded_over_one_row_tok_s"] = statistics.median(r["tok_s_padded"] / r["tok_s_one_row"] for r in rows)
    print(f"identical to the padded target alone, of {len(rows)} prompts: " +
          ", ".join(f"{name} {n}" for name, n in summary.items()))
    if args.json is not None:
        from specpack.bench.report import machine_info

        args.json.write_text(json.dumps({"pack": str(args.pack), "device": args.device, "machine": machine_info(
                                         args.threads), "max_new_tokens": args.max_new_tokens,
                                         "seconds": round(time.perf_counter() - start, 1), "summary": summary,
                                         "prompts": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
