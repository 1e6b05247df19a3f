"""What keeps ONNX Runtime from capturing a graph as a CUDA graph: the Memcpy nodes it inserts between the CPU and
the device (CPU-placed shape nodes alone are allowed), with the nodes on either side; and the nodes it placed on the
CPU. `python bench/cpu_nodes.py GRAPH.onnx` (the greedy form where the graph has a head If: graphs/greedy_form.py)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import onnx
import onnxruntime as ort

from specpack.graphs.greedy_form import greedy_form
from specpack.runtime.ort_session import EXTERNAL_DATA_FOLDER

graph = Path(sys.argv[1])
with tempfile.TemporaryDirectory() as tmp:
    optimized = Path(tmp) / "optimized.onnx"
    opts = ort.SessionOptions()
    opts.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(graph.parent))
    opts.optimized_model_filepath = str(optimized)
    opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.data")
    try:
        model: bytes | str = greedy_form(graph)
    except ValueError:
        model = str(graph)
    ort.InferenceSession(model, opts, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    placed = onnx.load(str(optimized), load_external_data=False)
producers = {out: node for node in placed.graph.node for out in node.output}
consumers: dict[str, list[onnx.NodeProto]] = {}
for node in placed.graph.node:
    for name in node.input:
        consumers.setdefault(name, []).append(node)
for node in placed.graph.node:
    if node.op_type.startswith("Memcpy"):
        source = producers.get(node.input[0])
        print(node.op_type, node.input[0], "<-", f"{source.op_type} {source.name}" if source else "(graph input)",
              "->", [f"{c.op_type} {c.name}" for c in consumers.get(node.output[0], [])][:4])
