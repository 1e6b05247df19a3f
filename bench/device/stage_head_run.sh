#!/usr/bin/env bash
# Stage what bench/gpu_head.py needs on the device machine (bench/README.md, "The draft head on the GPU"): the CUDA
# wheels (../shared/device/stage ort-gpu first), the 1.5B target's GGUF and the prompt files, as .device/partNN of
# 45 MiB (PART_SIZE; each part and the ~15 MiB repository stay under a call's 64 MiB), with ../shared/device/stage's unpack.sh.
# HEAD_DIR (optional): an earlier run's head folder (head.json, head.safetensors), staged too: launch_head_run.sh puts it
# in place of a training (phases without `train`).
#   bash bench/device/stage_head_run.sh            then, per part:  run(carry=[.device/partNN, .device/unpack.sh],
#                                                                        command="bash .device/unpack.sh N")
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
wheels=${SPEC_DEVICE_CACHE:-$HOME/.cache/device-stage}/wheels-cp312
gguf=${TARGET_GGUF:-$HOME/.cache/specpack/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
prompts=${PROMPTS_DIR:-$(cd .. && pwd)/shared/data/prompts}
[ -f .device/unpack.sh ] || { echo "run ../shared/device/stage ort-gpu first (it writes .device/unpack.sh)" >&2; exit 2; }
files=("$wheels"/*.whl "$gguf" "$prompts"/HumanEval.jsonl.gz "$prompts"/mt_bench_question.jsonl
       "$prompts"/spec_bench_question.jsonl)
[ -n "${HEAD_DIR:-}" ] && files+=("$HEAD_DIR"/head.json "$HEAD_DIR"/head.safetensors)
# STAGE_CORPUS=1: that head's corpus too (HEAD_DIR/ckpt/corpus.*), for distill's --data corpus:DIR on the device
# (/tmp/stage/files/<HEAD_DIR without its leading />/ckpt): new data adds to it instead of replacing it
[ -n "${HEAD_DIR:-}" ] && [ "${STAGE_CORPUS:-0}" = 1 ] && files+=("$HEAD_DIR"/ckpt/corpus.npz "$HEAD_DIR"/ckpt/corpus.json
                                                                 "$HEAD_DIR"/ckpt/corpus.key.json)
# STAGE_DRAFT=1: the 0.5B draft model's GGUF too (gpu_head.py's `model` phase: the model drafter beside the head)
draft=${DRAFT_GGUF:-$HOME/.cache/specpack/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
[ "${STAGE_DRAFT:-0}" = 1 ] && files+=("$draft")
rm -f .device/part*
tar -cf - -C / $(for f in "${files[@]}"; do readlink -f "$f" | sed 's|^/||'; done) | split -b "${PART_SIZE:-45M}" -d -a 2 - .device/part
echo "$(ls .device/part* | wc -l) parts in .device/"
