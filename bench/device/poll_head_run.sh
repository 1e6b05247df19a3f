#!/usr/bin/env bash
# On the device machine: wait $1 seconds (or until gpu_head.py ends), then show the logs' tails and copy the JSON
# and the logs to $OUT (files back from a call: bench/device/launch_head_run.sh's outputs), and the keep pieces named in
# KEEP (at most 4 a call).
wait_s=${1:-300}
for _ in $(seq "$wait_s"); do pgrep -f "bench/gpu_head.py|m pytest -q -m gpu" > /dev/null || break; sleep 1; done
tail -n "${LINES_SHOWN:-25}" /tmp/gw/log
[ -f /tmp/gw/gputests.log ] && tail -n 4 /tmp/gw/gputests.log
pgrep -f bench/gpu_head.py > /dev/null && echo "gpu_head.py still running" || echo "gpu_head.py ended"
for f in /tmp/gw/out.json /tmp/gw/log /tmp/gw/gputests.log; do [ -f "$f" ] && cp "$f" "$OUT/$(basename "$f").txt"; done
if [ -d /tmp/gw/keep ]; then cp /tmp/gw/keep/keep.json "$OUT/" 2>/dev/null; fi
# KEEP="corpus.npz.00 head.safetensors.00 ...": up to 4 of the keep phase's pieces (15 MiB each; 64 MiB back a call)
for piece in ${KEEP:-}; do [ -f "/tmp/gw/keep/$piece" ] && cp "/tmp/gw/keep/$piece" "$OUT/" || echo "no piece $piece"; done
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
