"""How fast the target writes distill's training data (bench/README.md, "Data generation's attention"):

    python bench/generation_speed.py --target T.gguf [--batches 512 1024 2048] [--new-tokens 64] --json OUT.json

distill's own `generate` (left-padded batches, bf16 on the GPU, torch's deterministic algorithms on, as the trainer
sets them) on prompts from the seed templates, with transformers' sdpa attention and with the grouped decode
attention (specpack/distill/grouped_attention.py), greedy and sampled at the answers' temperature: wall seconds, new
tokens per second, and how many rows' tokens the two attentions share.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specpack.distill.data import SAMPLED_TEMPERATURE, encode_prompt, generate
    from specpack.distill.grouped_attention import IMPLEMENTATION, use_grouped_decode
    from specpack.distill.seed_prompts import seed_prompts
    from specpack.export.sources import resolve_source

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--batches", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--json", required=True)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run (tiny models)")
    args = parser.parse_args()

    torch.use_deterministic_algorithms(True, warn_only=True)
    target_dir = resolve_source(args.target)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16).to(args.device).eval()
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    eos = int(tokenizer.eos_token_id)
    prompts = [encode_prompt(tokenizer, text, True) for text in seed_prompts(max(args.batches), 0)]
    result: dict[str, Any] = {"card": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                              "new_tokens": args.new_tokens, "runs": []}
    import transformers

    result["transformers"] = transformers.__version__
    tokens: dict[tuple[str, int, str], list[list[int]]] = {}
    for implementation in ("sdpa", IMPLEMENTATION):
        if implementation == IMPLEMENTATION:
            use_grouped_decode(model)
        else:
            model.set_attn_implementation("sdpa")
        generate(model, prompts[:8], 4, None, eos)  # warm-up
        for batch in args.batches:
            for mode, temperature in (("greedy", None), ("sampled", SAMPLED_TEMPERATURE)):
                torch.manual_seed(0)
                sync()
                t0 = time.perf_counter()
                out = generate(model, prompts[:batch], args.new_tokens, temperature, eos)
                sync()
                wall = time.perf_counter() - t0
                new = sum(len(a) for a in out)
                tokens[(implementation, batch, mode)] = out
                run = {"attention": implementation, "batch": batch, "mode": mode, "wall_s": round(wall, 3),
                       "new_tokens": new, "tokens_per_s": round(new / wall, 1),
                       "ms_per_step": round(1e3 * wall / args.new_tokens, 2),
                       "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None}
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                result["runs"].append(run)
                print(json.dumps(run), flush=True)
    result["same_rows"] = {f"{batch} {mode}": sum(a == b for a, b in zip(tokens[("sdpa", batch, mode)],
                                                                         tokens[(IMPLEMENTATION, batch, mode)],
                                                                         strict=True))
                           for batch in args.batches for mode in ("greedy", "sampled")}
    print(json.dumps(result["same_rows"]), flush=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
