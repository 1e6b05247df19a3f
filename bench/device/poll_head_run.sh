#!/usr/bin/env bash
# On the device machine: wait $1 seconds (or until the launched steps end: gpu_head.py, gpu_batched.py,
# serve_load_gpu.sh, the GPU tests), then show the logs' tails and copy the JSON and the logs to $OUT (files back from
# a call: bench/device/launch_head_run.sh's outputs), and the keep pieces named in KEEP (at most 8 files come back a
# call: past that a file is not copied, and said so; with GPU_BATCHED's four files, KEEP takes at most 2 pieces).
# Here, once every piece is back: python bench/device/reassemble_keep.py DEST FOLDER... (the pieces joined, each file
# checked against keep.json's sha256).
wait_s=${1:-300}
running="bench/gpu_head.py|bench/gpu_batched.py|serve_load_gpu.sh|m pytest -q -m gpu"
for _ in $(seq "$wait_s"); do pgrep -f "$running" > /dev/null || break; sleep 1; done
[ -f /tmp/gw/log ] && tail -n "${LINES_SHOWN:-25}" /tmp/gw/log
[ -f /tmp/gw/batched.log ] && tail -n "${LINES_SHOWN:-25}" /tmp/gw/batched.log
[ -f /tmp/gw/serve_load.log ] && grep -E "serve_load_gpu|merged|throughput_tokens_per_s|\"errors\"" /tmp/gw/serve_load.log | tail -n 20
[ -f /tmp/gw/gputests_first.log ] && tail -n 6 /tmp/gw/gputests_first.log
[ -f /tmp/gw/gputests.log ] && tail -n 4 /tmp/gw/gputests.log
if pgrep -f "$running" > /dev/null; then pgrep -fa "$running" | cut -c1-160; else echo "all launched steps ended"; fi
take() {  # copy $1 to $OUT as $2 while fewer than 8 files are there
  [ -f "$1" ] || return 0
  if [ "$(ls "$OUT" | wc -l)" -lt 8 ]; then cp "$1" "$OUT/$2"; else echo "not copied (8 files back a call): $1"; fi
}
take /tmp/gw/gputests_first.log gputests_first.log.txt; take /tmp/gw/out.json out.json.txt; take /tmp/gw/log log.txt; take /tmp/gw/gputests.log gputests.log.txt
take /tmp/gw/batched.json batched.json; take /tmp/gw/batched.log batched.log.txt
take /tmp/gw/serve_load.json serve_load.json; take /tmp/gw/serve_load.log serve_load.log.txt
take /tmp/gw/keep/keep.json keep.json
# KEEP="corpus.npz.00 head.safetensors.00 ...": the keep phase's pieces (15 MiB each; 64 MiB back a call)
for piece in ${KEEP:-}; do [ -f "/tmp/gw/keep/$piece" ] && take "/tmp/gw/keep/$piece" "$piece" || echo "no piece $piece"; done
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
