"""A distill training step's time at a target's shape (random weights): the trainer's step against an earlier
trainer.py, A/B in one process, rounds interleaved (bench/README.md, "Distill's step without host reads").

    python bench/distill_step_speed.py --baseline OLD_TRAINER.py [--shape qwen2.5-1.5b|tiny] [--steps 30]
        [--rounds 2] [--device cuda] --json OUT

Each variant trains its own head (the same seeded start) on the same random windows: `_train_step`, backward, clip,
AdamW, and the host reads each version's loop makes (the earlier one: its metrics as Python floats every step; this
one: the metrics kept on the device, read back every `log_every` steps). Reported per variant: the median step time
over rounds, peak GPU memory, and the first step's metrics of both (they must agree: the same quantities).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

SHAPES: dict[str, dict[str, Any]] = {  # Qwen2.5-Coder-1.5B's config, and a tiny one for a dry run on the CPU
    "qwen2.5-1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
                     "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 4096, "tie_word_embeddings": True},
}


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("trainer_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from specpack.distill import trainer
    from specpack.distill.config import DistillConfig
    from specpack.distill.data import Corpus

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="an earlier specpack/distill/trainer.py")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per variant and round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    baseline = load_module(args.baseline)
    torch.use_deterministic_algorithms(True, warn_only=True)  # as distill() runs
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    with torch.device(args.device):  # built where it runs: no 6 GB initialised on the host first
        target = Qwen2ForCausalLM(Qwen2Config(**SHAPES[args.shape])).to(dtype).eval()
    target.requires_grad_(False)
    layers = int(target.config.num_hidden_layers)
    given = {} if args.device == "cuda" else {"batch": 2, "seq_len": 64, "subset_size": 1024}
    config = DistillConfig.for_device(args.device, **given)
    rng = np.random.default_rng(0)
    size = config.batch * config.seq_len * 64
    corpus = Corpus(rng.integers(0, target.config.vocab_size, size).astype(np.int32), np.ones(size, np.uint8), [])
    windows = trainer._windows(corpus, config.seq_len)

    def fresh() -> tuple[Any, Any]:
        torch.manual_seed(1)
        head = trainer._new_head(target, config, corpus, layers).to(args.device)
        optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=config.lr,
                                      betas=(0.9, 0.95), weight_decay=0.0)
        return head, optimizer

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    def run(variant: str, steps: int) -> tuple[float, list[float], int]:
        head, optimizer = fresh()
        pending: list[Any] = []
        first: list[float] = []
        first_row: Any = None
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        began = 0.0
        for step in range(args.warmup + steps):
            if step == args.warmup:
                sync()
                began = time.perf_counter()
            if variant == "before":
                total, per_step, top1 = baseline._train_step(head, target, corpus, windows, config, step, layers)
            else:
                total, metrics = trainer._train_step(head, target, corpus, windows, config, step, layers)
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), config.grad_clip)
            optimizer.step()
            if variant == "before":  # its loop: the window's row and the progress bar's loss, every step
                row = [float(total.detach()), *per_step, *top1]
                float(total.detach())
                first = first or row
            else:  # this one's: the metrics on the device, read back once every log_every steps
                pending.append(metrics)
                first_row = metrics if step == 0 else first_row
                if (step + 1) % config.log_every == 0:
                    torch.stack(pending).tolist()
                    pending.clear()
        sync()
        seconds = (time.perf_counter() - began) / steps
        if variant == "after":
            first = first_row.tolist()
        peak = int(torch.cuda.max_memory_allocated()) if args.device == "cuda" else 0
        return seconds, first, peak

    result: dict[str, Any] = {"shape": args.shape, "device": args.device, "steps": args.steps, "rounds": args.rounds,
                              "batch": config.batch, "seq_len": config.seq_len, "ttt_steps": config.ttt_steps,
                              "card": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                              "torch": torch.__version__, "variants": {}}
    times: dict[str, list[float]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for variant in ("before", "after"):
            seconds, first, peak = run(variant, args.steps)
            times[variant].append(seconds)
            result["variants"].setdefault(variant, {})["first_step_metrics"] = [round(v, 6) for v in first]
            result["variants"][variant]["peak_gpu_bytes"] = peak
            print(f"{variant}: {seconds * 1e3:.1f} ms a step", file=sys.stderr, flush=True)
    for variant, samples in times.items():
        result["variants"][variant]["step_ms"] = [round(s * 1e3, 2) for s in samples]
        result["variants"][variant]["step_ms_median"] = round(statistics.median(samples) * 1e3, 2)
    result["after_over_before"] = round(statistics.median(times["before"]) / statistics.median(times["after"]), 4)
    args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
