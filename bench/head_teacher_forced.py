"""A head's teacher-forced top-1 agreement with its target on the 8-prompt set's greedy continuations (CPU, fp32):

    python bench/head_teacher_forced.py HEAD_DIR TARGET_HF_DIR PROMPTS_DIR OUT.json

The target (transformers) writes 128 greedy tokens after each of gpu.real_prompts' 4 HumanEval + 4 MT-bench prompts;
the head's training-time-test forward (DraftHead.ttt_forward, 5 steps) on that sequence gives, per step, how often its
argmax over the generated rows is the target's. Step 1 is what a runtime accepting at position 1 should see
(bench/README.md, "The head trained on the target's own requests").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu

from specpack.distill.data import encode_prompt
from specpack.heads.head_file import build_head, read_head


def main() -> None:
    head_dir, target_dir, prompts_dir, out = (Path(a) for a in sys.argv[1:5])
    torch.set_num_threads(2)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    head = build_head(read_head(head_dir), target)
    prompts = gpu.real_prompts(SimpleNamespace(prompts=[str(prompts_dir / "HumanEval.jsonl.gz"),
                                                        str(prompts_dir / "mt_bench_question.jsonl")]))
    rows = []
    for prompt in prompts:
        ids = encode_prompt(tokenizer, prompt.text, prompt.chat)
        with torch.no_grad():
            seq = target.generate(input_ids=torch.tensor([ids]), max_new_tokens=128, do_sample=False)[0]
            o = target(input_ids=seq[None], output_hidden_states=True)
            features = torch.cat([o.hidden_states[t] for t in head.config.taps], -1)  # [1, N, F]
            best = o.logits[0, 1:].argmax(-1)  # [N - 1]: row t's label, the target's token after t + 1
            steps = head.ttt_forward(features, seq[None], 5)
        n = seq.shape[0] - 1
        top1 = []
        for i, logits in enumerate(steps):
            pred = head.subset[logits[0].argmax(-1)]  # [n]
            generated = range(max(i, len(ids) - 1), n - 1)  # rows whose label is a generated token
            top1.append(round(float(np.mean([int(pred[t] == best[t]) for t in generated])), 3))
        rows.append({"id": str(prompt.id), "prompt_tokens": len(ids), "generated": int(seq.shape[0] - len(ids)),
                     "top1": top1})
        print(rows[-1], flush=True)
    out.write_text(json.dumps({"head": str(head_dir), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
