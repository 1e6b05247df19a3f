#!/usr/bin/env bash
# On the device machine, after the last part is unpacked: copy this repository to /tmp/repo (later calls replace the
# working tree) and start, in the background, bench/gpu_head.py (log /tmp/gw/log, JSON /tmp/gw/out.json), then, once
# it has ended, the GPU tests (GPU_TESTS=1; log /tmp/gw/gputests.log): never beside the benchmark, whose timings the
# tests' runs would spoil (bench/README.md, "Run E"). Environment: PHASES, TRAIN_MINUTES, TRAIN_STEPS, DATA, GRAPHS, TREE_GRAPHS
# (gpu_head.py's options). The head staged by stage_head_run.sh's HEAD_DIR becomes WORK/head: the phases before a
# `train` run on it (train moves it to WORK/head-staged).
# GPU_BATCHED=1: after gpu_head.py (never beside it), bench/gpu_batched.py (the batched load benchmark in process: its
# fp16 --max-batch 64 pack of the 1.5B target and the 0.5B draft, staged with STAGE_DRAFT=1, exported under
# /tmp/gw/batched; log /tmp/gw/batched.log, JSON /tmp/gw/batched.json; BATCHED_ARGS: more of its options);
# GPU_SERVE_LOAD=1: then bench/device/serve_load_gpu.sh (serve_load.py over HTTP on that pack; wheels staged with
# STAGE_SERVE=1; log /tmp/gw/serve_load.log, JSON /tmp/gw/serve_load.json); GPU_HEAD=0: no gpu_head.py (the batched
# steps alone). Order: GPU_TESTS_FIRST (pytest arguments, e.g. one GPU test file: log /tmp/gw/gputests_first.log),
# gpu_head.py, gpu_batched.py, serve_load_gpu.sh, the GPU tests: one at a time.
# Then poll with bench/device/poll_head_run.sh.
set -euo pipefail
files=/tmp/stage/files
gguf=$(find "$files" -name 'qwen2.5-coder-1.5b-instruct-q4_k_m.gguf' | head -1)
prompts=$(dirname "$(find "$files" -name mt_bench_question.jsonl | head -1)")
rm -rf /tmp/repo && mkdir -p /tmp/repo /tmp/gw && cp -r . /tmp/repo/ && cd /tmp/repo
draft=$(find "$files" -name 'qwen2.5-coder-0.5b-instruct-q4_k_m.gguf' | head -1)  # staged with STAGE_DRAFT=1
staged_head=$(find "$files" -name head.safetensors | head -1)
if [[ -n "$staged_head" ]]; then
  mkdir -p /tmp/gw/head && cp "$(dirname "$staged_head")"/head.json "$staged_head" /tmp/gw/head/
  echo "the staged head: $(sha256sum /tmp/gw/head/head.safetensors)"
fi
export PYTHONPATH=/tmp/site:/tmp/repo
python3 -c 'import onnxruntime as o, torch; print(o.__version__, o.get_available_providers(), torch.cuda.get_device_name())'
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
head_run=(python3 bench/gpu_head.py --work /tmp/gw --target-gguf "$gguf"
  --prompts "$prompts/HumanEval.jsonl.gz" "$prompts/mt_bench_question.jsonl" "$prompts/spec_bench_question.jsonl"
  --json /tmp/gw/out.json --train-minutes "${TRAIN_MINUTES:-6}" --train-steps "${TRAIN_STEPS:-0}" --graphs "${GRAPHS:-builder}"
  --tree-graphs "${TREE_GRAPHS:-builder}" --phases "${PHASES:-card,train,export,decode,genai}" ${DATA:+--data "$DATA"}
  ${draft:+--draft-gguf "$draft"})
head=true
[ "${GPU_HEAD:-1}" = 1 ] && head="$(printf '%q ' "${head_run[@]}") > /tmp/gw/log 2>&1"
batched=true
if [ "${GPU_BATCHED:-0}" = 1 ]; then
  [[ -n "$draft" ]] || { echo "GPU_BATCHED=1 needs the 0.5B draft's GGUF: stage with STAGE_DRAFT=1" >&2; exit 2; }
  batched_run=(python3 bench/gpu_batched.py --work /tmp/gw/batched --target "$gguf" --draft "$draft"
    --prompts "$prompts/HumanEval.jsonl.gz" "$prompts/mt_bench_question.jsonl" "$prompts/spec_bench_question.jsonl"
    --json /tmp/gw/batched.json)
  batched="$(printf '%q ' "${batched_run[@]}") ${BATCHED_ARGS:-} > /tmp/gw/batched.log 2>&1"
fi
serve=true
[ "${GPU_SERVE_LOAD:-0}" = 1 ] && serve="bash bench/device/serve_load_gpu.sh > /tmp/gw/serve_load.log 2>&1"
tests=true
[ "${GPU_TESTS:-0}" = 1 ] && tests="python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -s > /tmp/gw/gputests.log 2>&1"
first=true
[ -n "${GPU_TESTS_FIRST:-}" ] && first="python3 -m pytest -q -m gpu ${GPU_TESTS_FIRST} -p no:cacheprovider -s > /tmp/gw/gputests_first.log 2>&1"
# setsid: a device call kills its own session's processes when it returns
setsid nohup bash -c "$first; $head; $batched; $serve; $tests" < /dev/null > /dev/null 2>&1 &
sleep 5; tail -5 /tmp/gw/log /tmp/gw/batched.log 2>/dev/null || true
