#!/usr/bin/env bash
# On the device machine, after bench/gpu_batched.py (launch_head_run.sh with GPU_SERVE_LOAD=1 runs it so): the HTTP
# load test, bench/serve_load.py with the official openai client against `specpack serve PACK --device cuda
# --max-batch N` on loopback, at N = SERVE_CLIENTS clients (default 1 4 16 64; the server's --max-batch = N), each
# SERVE_KS (default "auto"; "auto 0" adds speculation's share over HTTP), on gpu_batched.py's pack. Needs the server's
# and the client's wheels in /tmp/site (staged with STAGE_SERVE=1 bash bench/device/stage_head_run.sh). Per run:
# max(SERVE_MIN_REQUESTS, 3 N) requests of 128 tokens (every third streams; N / 4 of the streams cancelled; every
# fifth seeded sampling, serve_load.py's plan; SERVE_SAMPLED_EVERY=0: every request greedy, SERVE_SAMPLED_EVERY=N:
# every Nth samples), stopped at SERVE_TIME_LIMIT s, the GPU's memory sampled every second
# by nvidia-smi. All runs merged into /tmp/gw/serve_load.json (one file back); this script's output: the caller's log.
set -uo pipefail
files=/tmp/stage/files
prompts=$(dirname "$(find "$files" -name mt_bench_question.jsonl | head -1)")
pack=${SERVE_PACK:-/tmp/gw/batched/pack-batched}
out=/tmp/gw/serve
mkdir -p "$out"
python3 -c 'import openai, starlette, uvicorn, prometheus_client; print("openai", openai.__version__, "starlette",
starlette.__version__, "uvicorn", uvicorn.__version__)' || { echo "the serve wheels are missing: STAGE_SERVE=1"; exit 2; }
[ -f "$pack/manifest.json" ] || { echo "no pack at $pack (run bench/gpu_batched.py first)"; exit 2; }
for n in ${SERVE_CLIENTS:-1 4 16 64}; do
  for k in ${SERVE_KS:-auto}; do
    name="c${n}-k${k}${SERVE_SAMPLED_EVERY:+-s$SERVE_SAMPLED_EVERY}"
    requests=$(( 3 * n > ${SERVE_MIN_REQUESTS:-24} ? 3 * n : ${SERVE_MIN_REQUESTS:-24} ))
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 1000 > "$out/$name.mem" 2>/dev/null &
    smi=$!
    echo "[serve_load_gpu $(date +%T)] $name: $requests requests"
    python3 bench/serve_load.py "$pack" --device cuda --max-batch "$n" --clients "$n" --k "$k" \
      --prompts "$prompts/HumanEval.jsonl.gz" 64 --prompts "$prompts/mt_bench_question.jsonl" 10 \
      --requests "$requests" --cancel $(( n / 4 )) --max-tokens 128 --cancel-max-tokens 128 \
      --time-limit "${SERVE_TIME_LIMIT:-150}" --sampled-every "${SERVE_SAMPLED_EVERY:-5}" --json "$out/$name.json" \
      | tail -n 40
    echo "[serve_load_gpu $(date +%T)] $name: exit $?"
    kill "$smi" 2>/dev/null
    tail -n 5 "${TMPDIR:-/tmp}/specpack-serve-load.log"
  done
done
python3 - "$out" <<'MERGE'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = {}
for path in sorted(out.glob("*.json")):
    run = json.loads(path.read_text())
    mem = [int(x) for x in (out / f"{path.stem}.mem").read_text().split() if x.isdigit()] if (out / f"{path.stem}.mem").exists() else []
    run["gpu_used_mib"] = {"first": mem[0] if mem else None, "peak": max(mem) if mem else None}
    runs[path.stem] = run
Path("/tmp/gw/serve_load.json").write_text(json.dumps(runs, separators=(",", ":")))
print("merged", sorted(runs), "into /tmp/gw/serve_load.json")
MERGE
