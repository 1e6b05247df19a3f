#!/usr/bin/env bash
# On the device machine, once the CUDA wheels are in /tmp/site (any unpack.sh of ../shared/device/stage ort-gpu or
# bench/device/stage_head_run.sh): tests/gpu/test_cuda_batched_gpu.py (the batched graphs captured as CUDA graphs, each
# request's lone tokens) from this working tree; when it fails, the test again with ONNX Runtime's verbose log, and the
# copies between host and device it added (each one a reason it refuses capture: docs/batching.md, "On the GPU").
# Its log comes back as $OUT/capture_test.log.txt.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 170 python3 -m pytest -q -m gpu tests/gpu/test_cuda_batched_gpu.py -p no:cacheprovider -s > /tmp/capture_test.log 2>&1
rc=$?
grep -E "batched fp16 on GPU|passed|failed" /tmp/capture_test.log | cut -c1-600
cp /tmp/capture_test.log "${OUT:-/tmp}/capture_test.log.txt"
[ $rc = 0 ] && exit 0
timeout 150 python3 - <<'PY' > /tmp/capture_verbose.log 2>&1
import sys

import onnxruntime as ort
import pytest

opened = ort.InferenceSession.__init__


def verbose(self, path_or_bytes, sess_options=None, *args, **kwargs):  # every session at log level 0 (placements)
    sess_options = sess_options or ort.SessionOptions()
    sess_options.log_severity_level = 0
    opened(self, path_or_bytes, sess_options, *args, **kwargs)


ort.InferenceSession.__init__ = verbose
sys.exit(pytest.main(["-q", "-m", "gpu", "tests/gpu/test_cuda_batched_gpu.py", "-p", "no:cacheprovider", "-s"]))
PY
sed 's/\x1b\[[0-9;]*m//g' /tmp/capture_verbose.log | grep -E "AddCopyNode|Memcpy nodes are added to the graph main_graph|cannot use the graph capture" \
  | sed 's/^[0-9-]* [0-9:.]* //' | cut -c1-200 | uniq
exit $rc
