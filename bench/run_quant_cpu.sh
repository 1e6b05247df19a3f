#!/usr/bin/env bash
# The committed CPU benchmark of quantized packs of the real Qwen2.5-Coder GGUF pair, beside llama.cpp (issue 9).
#   bench/run_quant_cpu.sh GGUF_INT4_PACK INT4_INT4_PACK FP32_PACK
#     GGUF_INT4_PACK: spec-export --draft D.gguf --target T.gguf --quantize-draft int4 (target: the GGUF's blocks)
#     INT4_INT4_PACK: ... --quantize-draft int4 --quantize-target int4
#     FP32_PACK:      ... --dequantize (the fp32 pack of the same files)
#   llama.cpp's tools: $SPECPACK_LLAMACPP (default ~/.cache/peers/llama.cpp/build/bin)
# Run it under the shared lock. Each part is one run: part 1 holds ours and llama.cpp's numbers that the
# targets compare, so they come from the same run. PARTS="1 2 3" (default) picks parts, so each can take
# the lock on its own (each under ~15 minutes on the shared 2 cores):
#   PARTS=1 flock /tmp/specpack-heavy.lock bench/run_quant_cpu.sh ...
# Writes bench/results/cpu_quant_*.json. HumanEval's first 8 prompts, 64 new tokens, greedy, 2 threads, k 2, 3, 4
# (llama.cpp drafts up to the largest).
set -euo pipefail
exact=${1:?usage: bench/run_quant_cpu.sh GGUF_INT4_PACK INT4_INT4_PACK FP32_PACK}
int4=${2:?}
fp32=${3:?}
here=$(cd "$(dirname "$0")" && pwd)
prompts=${PROMPTS_DIR:-$here/../../shared/data/prompts}/HumanEval.jsonl.gz
[[ -f $prompts ]] || { echo "no $prompts: set PROMPTS_DIR to the shared prompts folder" >&2; exit 2; }
out=$here/results
mkdir -p "$out"
specpack=${SPECPACK:-specpack}
python=${PYTHON:-python}
export SPECPACK_LLAMACPP=${SPECPACK_LLAMACPP:-$HOME/.cache/peers/llama.cpp/build/bin}
common=(--prompts "$prompts" --limit 8 --max-new-tokens 64 --threads 2)
parts=" ${PARTS:-1 2 3} "
# 1. The GGUF-exact target with an int4 draft, and llama.cpp on the same GGUF files (autoregressive, speculative).
if [[ $parts == *" 1 "* ]]; then
  $specpack bench "$exact" "${common[@]}" --k 2,3,4 --peer llamacpp --json "$out/cpu_quant_gguf_int4.json"
fi
# 2. Both models int4 (requantized from the GGUF's dequantized weights), and llama.cpp again in the same run.
if [[ $parts == *" 2 "* ]]; then
  $specpack bench "$int4" "${common[@]}" --k 2,3,4 --peer llamacpp --json "$out/cpu_quant_int4_int4.json"
fi
# 3. Greedy output of the GGUF-exact pack against the dequantized fp32 pack, with the fp32 top-2 gap at divergences.
if [[ $parts == *" 3 "* ]]; then
  $python "$here/gguf_exact_vs_fp32.py" "$exact" "$fp32" --prompts "$prompts" --limit 8 --max-new-tokens 64 \
    --json "$out/cpu_quant_exact_vs_fp32.json"
fi
