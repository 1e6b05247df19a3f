"""Which nodes of a graph ONNX Runtime places on the CPU under the CUDA EP (what keeps it from capturing a CUDA
graph): `python bench/cpu_nodes.py GRAPH.onnx 2>&1 | grep -A30 "placed on \\[CPUExecutionProvider\\]"`; the greedy form
is loaded where the graph has a head If (graphs/greedy_form.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import onnxruntime as ort

from specpack.graphs.greedy_form import greedy_form
from specpack.runtime.ort_session import EXTERNAL_DATA_FOLDER

graph = Path(sys.argv[1])
ort.set_default_logger_severity(0)  # verbose: the session logs its node placements
opts = ort.SessionOptions()
opts.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(graph.parent))
try:
    model: bytes | str = greedy_form(graph)
except ValueError:
    model = str(graph)
session = ort.InferenceSession(model, opts, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
print("providers", session.get_providers())
