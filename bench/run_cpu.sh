#!/usr/bin/env bash
# The committed CPU benchmark of the real Qwen2.5-Coder pair (45 minutes measured on 2 shared cores).
#   bench/run_cpu.sh PACK     (PACK: the fp32 pack `make pack-fp32` writes; PROMPTS_DIR: the prompt sets, docs/prompts.md)
# Writes bench/results/cpu_*.json and .png. Prompt sets are read from ../shared/data/prompts by path.
set -euo pipefail
pack=${1:?usage: bench/run_cpu.sh PACK}
here=$(cd "$(dirname "$0")" && pwd)
prompts=${PROMPTS_DIR:-$here/../../shared/data/prompts}
for f in HumanEval.jsonl.gz mt_bench_question.jsonl gsm8k_test.jsonl; do
  [[ -f $prompts/$f ]] || { echo "error: no $f in $prompts; docs/prompts.md says where to get the prompt sets," \
    "then set PROMPTS_DIR to their folder" >&2; exit 2; }
done
out=$here/results
mkdir -p "$out"
specpack=${SPECPACK:-specpack}
# 1. HumanEval (plain completion): the k sweep, with transformers' assisted generation beside it.
$specpack bench "$pack" --prompts "$prompts/HumanEval.jsonl.gz" --limit 8 --k 1,2,4,8 --max-new-tokens 64 \
  --peer hf --json "$out/cpu_humaneval.json" --plot "$out/cpu_humaneval.png"
# 2. MT-bench (one prompt per category) and GSM8K (8), chat template, at k = 4.
$specpack bench "$pack" --prompts "$prompts/mt_bench_question.jsonl" --limit 1 --k 4 --max-new-tokens 64 \
  --peer hf --json "$out/cpu_mtbench.json" --plot "$out/cpu_mtbench.png"
$specpack bench "$pack" --prompts "$prompts/gsm8k_test.jsonl" --limit 8 --k 4 --max-new-tokens 64 \
  --peer hf --json "$out/cpu_gsm8k.json" --plot "$out/cpu_gsm8k.png"
