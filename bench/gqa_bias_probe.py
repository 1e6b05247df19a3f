"""Does ONNX Runtime's GroupQueryAttention take a tree mask (`attention_bias`) on this device? (docs/design/heads_and_trees.md)

One GroupQueryAttention node (4 query heads, 2 KV heads, head size 16; a past of 8 positions and 5 new rows whose
parents form a tree) runs with causal masking plus an additive bias that hides the non-ancestors, and is compared
with numpy attention under the tree mask. On CUDA it also runs captured in a CUDA graph (IOBinding, fixed buffers).

    python bench/gqa_bias_probe.py [--device cpu|cuda] [--dtype fp16|fp32] [--json OUT]

Prints one JSON record: whether the session was created and ran, the largest difference from numpy, whether the
capture worked, and the error text when something was refused.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

HEADS, KV_HEADS, HEAD, PAST = 4, 2, 16, 8
PARENTS = [-1, 0, 0, 1, 2]  # the new rows' tree: row i attends to the past, its ancestors and itself
ROWS = len(PARENTS)
TOTAL = PAST + ROWS


def tree_mask() -> np.ndarray:
    """[ROWS, TOTAL] bool: which positions each new row may attend to."""
    mask = np.zeros((ROWS, TOTAL), bool)
    mask[:, :PAST] = True
    for row in range(ROWS):
        node = row
        while node >= 0:
            mask[row, PAST + node] = True
            node = PARENTS[node]
    return mask


def model(dtype: int) -> onnx.ModelProto:
    f = dtype
    inputs = [helper.make_tensor_value_info("query", f, [1, ROWS, HEADS * HEAD]),
              helper.make_tensor_value_info("key", f, [1, ROWS, KV_HEADS * HEAD]),
              helper.make_tensor_value_info("value", f, [1, ROWS, KV_HEADS * HEAD]),
              helper.make_tensor_value_info("past_key", f, [1, KV_HEADS, PAST, HEAD]),
              helper.make_tensor_value_info("past_value", f, [1, KV_HEADS, PAST, HEAD]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
              helper.make_tensor_value_info("attention_bias", f, [1, 1, ROWS, TOTAL])]
    node = helper.make_node("GroupQueryAttention", ["query", "key", "value", "past_key", "past_value", "seqlens_k",
                                                    "total_sequence_length", "", "", "", "attention_bias"],
                            ["output", "present_key", "present_value"], domain="com.microsoft",
                            num_heads=HEADS, kv_num_heads=KV_HEADS)
    outputs = [helper.make_tensor_value_info("output", f, [1, ROWS, HEADS * HEAD]),
               helper.make_tensor_value_info("present_key", f, [1, KV_HEADS, TOTAL, HEAD]),
               helper.make_tensor_value_info("present_value", f, [1, KV_HEADS, TOTAL, HEAD])]
    graph = helper.make_graph([node], "gqa_bias", inputs, outputs)
    return helper.make_model(graph, ir_version=10,
                             opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])


def reference(feeds: dict[str, np.ndarray]) -> np.ndarray:
    """numpy attention under the tree mask: [1, ROWS, HEADS * HEAD] in fp32."""
    q = feeds["query"].astype(np.float32).reshape(ROWS, HEADS, HEAD).transpose(1, 0, 2)  # [H, R, D]
    k_new = feeds["key"].astype(np.float32).reshape(ROWS, KV_HEADS, HEAD).transpose(1, 0, 2)  # [Hkv, R, D]
    v_new = feeds["value"].astype(np.float32).reshape(ROWS, KV_HEADS, HEAD).transpose(1, 0, 2)
    k = np.concatenate([feeds["past_key"][0].astype(np.float32), k_new], axis=1)  # [Hkv, T, D]
    v = np.concatenate([feeds["past_value"][0].astype(np.float32), v_new], axis=1)
    group = HEADS // KV_HEADS
    k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)  # [H, T, D]
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(HEAD)  # [H, R, T]
    scores = np.where(tree_mask()[None], scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return (weights @ v).transpose(1, 0, 2).reshape(1, ROWS, HEADS * HEAD)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["fp16", "fp32"], default="fp16")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    np_type = np.float16 if args.dtype == "fp16" else np.float32
    rng = np.random.default_rng(0)
    feeds = {"query": rng.standard_normal((1, ROWS, HEADS * HEAD)).astype(np_type),
             "key": rng.standard_normal((1, ROWS, KV_HEADS * HEAD)).astype(np_type),
             "value": rng.standard_normal((1, ROWS, KV_HEADS * HEAD)).astype(np_type),
             "past_key": rng.standard_normal((1, KV_HEADS, PAST, HEAD)).astype(np_type),
             "past_value": rng.standard_normal((1, KV_HEADS, PAST, HEAD)).astype(np_type),
             "seqlens_k": np.array([TOTAL - 1], np.int32), "total_sequence_length": np.array(TOTAL, np.int32),
             "attention_bias": np.where(tree_mask(), 0.0, -10000.0)[None, None].astype(np_type)}
    record: dict[str, object] = {"onnxruntime": ort.__version__, "device": args.device, "dtype": args.dtype,
                                 "providers": ort.get_available_providers()}
    proto = model(TensorProto.FLOAT16 if args.dtype == "fp16" else TensorProto.FLOAT).SerializeToString()
    provider = "CUDAExecutionProvider" if args.device == "cuda" else "CPUExecutionProvider"
    try:
        session = ort.InferenceSession(proto, providers=[provider])
        out = session.run(["output"], feeds)[0]
        record["ran"] = True
        record["max_abs_diff"] = float(np.abs(out.astype(np.float32) - reference(feeds)).max())
        unmasked = np.abs(out.astype(np.float32) - _causal_reference(feeds)).max()
        record["max_abs_diff_if_bias_ignored"] = float(unmasked)  # large: the bias was applied
    except Exception as err:  # onnxruntime raises its own types; the text is the finding
        record.update(ran=False, error=str(err).splitlines()[0][:400])
    if args.device == "cuda" and record.get("ran"):
        record.update(_captured(proto, feeds))
    text = json.dumps(record, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    return 0


def _causal_reference(feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The same attention with a plain causal mask (no tree): what a bias that was ignored would give."""
    global PARENTS
    saved, PARENTS = PARENTS, list(range(-1, ROWS - 1))  # a chain: causal
    try:
        return reference(feeds)
    finally:
        PARENTS = saved


def _captured(proto: bytes, feeds: dict[str, np.ndarray]) -> dict[str, object]:
    """Run twice under CUDA-graph capture with fixed device buffers; the replay must equal the first run."""
    try:
        session = ort.InferenceSession(proto, providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"})])
        binding = session.io_binding()
        device = {name: ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0) for name, value in feeds.items()}
        for name, value in device.items():
            binding.bind_ortvalue_input(name, value)
        out = ort.OrtValue.ortvalue_from_numpy(np.zeros((1, ROWS, HEADS * HEAD), feeds["query"].dtype), "cuda", 0)
        binding.bind_ortvalue_output("output", out)
        for name, shape in (("present_key", (1, KV_HEADS, TOTAL, HEAD)), ("present_value", (1, KV_HEADS, TOTAL, HEAD))):
            binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, feeds["query"].dtype),
                                                                                "cuda", 0))
        session.run_with_iobinding(binding)  # captures
        first = out.numpy().copy()
        session.run_with_iobinding(binding)  # replays
        return {"captured": True, "replay_equal": bool(np.array_equal(first, out.numpy())),
                "captured_max_abs_diff": float(np.abs(first.astype(np.float32) - reference(feeds)).max())}
    except Exception as err:
        return {"captured": False, "capture_error": str(err).splitlines()[0][:400]}


if __name__ == "__main__":
    sys.exit(main())
