#!/usr/bin/env bash
# Stage what bench/gpu_head.py needs on the device machine (bench/README.md, "The draft head on the GPU"): the CUDA
# wheels (../shared/device/stage ort-gpu first), the 1.5B target's GGUF and the prompt files, as .device/partNN of
# PART_SIZE (default: 62 MiB less the tracked working tree, which travels with every part: a call carries 64 MiB in all;
# 45 MiB parts stopped fitting once the tree passed 18.6 MiB, 2026-12-07), with ../shared/device/stage's unpack.sh.
# STAGE_DRAFT=1 / STAGE_SERVE=1 (below): the 0.5B draft's GGUF / the HTTP server's and openai client's wheels, for
# launch_head_run.sh's GPU_BATCHED=1 / GPU_SERVE_LOAD=1 (bench/gpu_batched.py, bench/device/serve_load_gpu.sh).
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
# STAGE_SERVE=1: what `specpack serve` and bench/serve_load.py need that the device image lacks (starlette, uvicorn,
# openai and its httpx2 / httpcore2 / truststore / jiter / sniffio; anyio, h11, idna, prometheus-client at the pins
# they were checked with), at the dev venv's versions, py3 wheels but jiter's cp312 manylinux one, 3.4 MB; pip
# downloads them once into SERVE_WHEELS. The image has click and psutil; pydantic comes with `stage ort-gpu`.
# unpack.sh installs every staged wheel into /tmp/site (--no-deps: this list is the whole closure)
serve_wheels=${SERVE_WHEELS:-${SPEC_DEVICE_CACHE:-$HOME/.cache/device-stage}/wheels-serve-cp312}
if [ "${STAGE_SERVE:-0}" = 1 ]; then
  mkdir -p "$serve_wheels"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$serve_wheels" \
    starlette==1.10.0 uvicorn==0.54.0 prometheus-client==0.26.0 openai==3.57.0 httpx2==2.17.0 httpcore2==2.17.0 \
    truststore==0.10.5 jiter==0.19.0 sniffio==1.3.1 anyio==4.16.0 h11==0.16.0 idna==3.21
  files+=("$serve_wheels"/*.whl)
fi
tree_mib=$(( $(git ls-files -z | xargs -0 du -cb | tail -n 1 | cut -f1) / 1048576 + 1 ))
part_size=${PART_SIZE:-$(( 62 - tree_mib ))M}
rm -f .device/part*
tar -cf - -C / $(for f in "${files[@]}"; do readlink -f "$f" | sed 's|^/||'; done) | split -b "$part_size" -d -a 2 - .device/part
echo "$(ls .device/part* | wc -l) parts of $part_size in .device/ (the working tree: $tree_mib MiB)"
