"""Which values of an ONNX graph ONNX Runtime's CUDA EP holds on the host, and whether one of them enters the data.

Modelled on onnxruntime/core/framework/fallback_cpu_capability.cc (GetCpuPreferredNodes): a Shape's output is a
host (CPU) tensor; a node that reads one is placed on the CPU, its outputs then host tensors too, when every one of
its inputs is a constant, a graph input or a host tensor read at a slot its CUDA kernel does not declare a CPU input
(shape arithmetic); a node that reads host tensors only at declared CPU inputs (a Range's bounds, a Reshape's or
Expand's shape, a ConstantOfShape's shape, axes) stays on the device and writes device tensors. A
device node that reads a host tensor anywhere else gets a Memcpy node, as does a CPU input that reads a tensor computed
on the device (a shape that follows the data: the batched draft's K = max k_b on an H200, 2026-12-07), and a session
with Memcpy nodes refuses CUDA-graph capture ("all compute graph nodes have not been partitioned to the
CUDAExecutionProvider": kv_compact.onnx on an H200, 2026-11-28, bench/README.md; the batched graphs there, 2026-12-07).
fp16 inputs and the aggressive fallback are not modelled.
"""

from __future__ import annotations

import onnx

# op -> input slots the CUDA EP reads from host memory
CPU_INPUTS: dict[str, frozenset[int]] = {
    "Range": frozenset({0, 1, 2}), "Reshape": frozenset({1}), "Expand": frozenset({1}), "Squeeze": frozenset({1}),
    "Unsqueeze": frozenset({1}), "Slice": frozenset({1, 2, 3, 4}), "ConstantOfShape": frozenset({0}),
    "Tile": frozenset({1}), "ReduceSum": frozenset({1}), "ReduceMax": frozenset({1}), "ReduceMin": frozenset({1}),
    "Pad": frozenset({1, 2, 3}), "TopK": frozenset({1}), "Split": frozenset({1}), "Resize": frozenset({1, 2, 3}),
    "GroupQueryAttention": frozenset({6}),  # total_sequence_length (contrib_ops/cuda/bert/group_query_attention.cc)
}


def host_values_in_data(model: onnx.ModelProto) -> list[str]:
    """'node (op) input i: value' for every host tensor a device node would have to copy in, and every device tensor
    (computed on the device: a graph input is bound where the runtime binds it) read at a CPU input, which the EP copies
    out (a shape that follows data: MemcpyToHost); empty: none."""
    graph = model.graph
    constant = {init.name for init in graph.initializer}
    neutral = constant | {i.name for i in graph.input}
    host: set[str] = set()
    problems = []
    for node in graph.node:  # topological order
        if node.op_type == "Constant" or all(name in constant for name in node.input if name):
            neutral.update(node.output)  # folded at load: an initializer of the EP's choosing
            constant.update(node.output)
            continue
        cpu_slots = CPU_INPUTS.get(node.op_type, frozenset())
        problems += [f"{node.name or node.output[0]} ({node.op_type}) input {slot}: {name} (a device value)"
                     for slot, name in enumerate(node.input)
                     if slot in cpu_slots and name and name not in neutral and name not in host]
        if node.op_type in ("Shape", "Size"):
            host.update(node.output)
            continue
        reads_host = [slot for slot, name in enumerate(node.input) if name in host]
        on_cpu = bool(reads_host) and all(
            name in neutral or (name in host and slot not in cpu_slots)
            for slot, name in enumerate(node.input) if name)
        if on_cpu:
            host.update(node.output)  # shape arithmetic: the CPU computes it
            continue
        problems += [f"{node.name or node.output[0]} ({node.op_type}) input {slot}: {node.input[slot]}"
                     for slot in reads_host if slot not in cpu_slots]
    return problems
