"""A valid manifest as plain JSON data, built from names.py (no export needed): the base that tests mutate."""

from __future__ import annotations

import hashlib
from typing import Any

from specpack import names

LAYERS, KV_HEADS, HEAD_DIM, VOCAB = 2, 2, 8, 64


def _spec(name: str, dtype: str, shape: list[Any]) -> dict[str, Any]:
    return {"name": name, "dtype": dtype, "shape": shape}


def _graph(role: str, path: str) -> dict[str, Any]:
    kv = ["batch_size", KV_HEADS, "past_sequence_length", HEAD_DIM]
    inputs = [_spec(names.INPUT_IDS, "int64", ["batch_size", "sequence_length"]),
              _spec(names.POSITION_IDS, "int64", ["batch_size", "sequence_length"]),
              _spec(names.ATTENTION_MASK, "int64", ["batch_size", "total_sequence_length"]),
              *(_spec(n, "float32", kv) for n in names.kv_names(LAYERS, "past")),
              _spec(names.TEMPERATURE, "float32", [1]), _spec(names.TOP_K, "int64", [1]),
              _spec(names.TOP_P, "float32", [1])]
    present = [_spec(n, "float32", kv) for n in names.kv_names(LAYERS, "present")]
    if role == "draft":
        inputs.append(_spec(names.UNIFORM, "float32", [1]))
        outputs = [_spec(names.TOKEN, "int64", [1]), _spec(names.PROBS, "float32", [1, VOCAB]), *present]
    else:
        inputs += [_spec(names.DRAFT_PROBS, "float32", [1, "k", VOCAB]), _spec(names.UNIFORMS, "float32", [1, "k1"])]
        outputs = [_spec(names.N_ACCEPTED, "int64", [1]), _spec(names.NEXT_TOKEN, "int64", [1]), *present]
    return {"path": path, "data_files": [path + ".data"], "inputs": inputs, "outputs": outputs}


def _model(role: str, path: str) -> dict[str, Any]:
    return {"source": {"source": f"models/{role}", "resolved": f"/abs/models/{role}", "model_type": "qwen2",
                       "files": {"config.json": "0" * 64}},
            "model_type": "qwen2", "num_layers": LAYERS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
            "vocab_rows": VOCAB, "max_positions": 256, "dtype": "fp32", "graph": _graph(role, path)}


def valid_manifest() -> dict[str, Any]:
    files = ["draft_step.onnx", "draft_step.onnx.data", "verify.onnx", "verify.onnx.data",
             "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"]
    return {
        "schema_version": 1, "specpack_version": "0.1.0",
        "draft": _model("draft", "draft_step.onnx"), "target": _model("target", "verify.onnx"),
        "vocab_size": VOCAB, "eos_token_ids": [2, 3], "k_max": 4, "max_len": 256,
        "tokenizer_files": ["tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"],
        "has_chat_template": True,
        "files": [{"path": p, "sha256": hashlib.sha256(p.encode()).hexdigest(), "size": 10} for p in files],
        "backends": ["onnxruntime"], "engines": [],
    }
