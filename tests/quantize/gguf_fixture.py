"""A tiny Qwen2 GGUF with K-quant tensors, written with the `gguf` package: Q4_K, Q6_K, Q8_0, Q5_0, Q5_K, F16.

K-quants have 256-value super-blocks, so the model is 256 wide. Their blocks are random bytes (every byte
pattern is a valid block) with fp16 scales set to sizes that keep activations finite; gguf's own quantizer
writes the Q8_0 and Q5_0 tensors. transformers reads the file like any GGUF (export/gguf.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.tiny import qwen2_gguf_writer

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN = 2, 256, 4, 2, 512
HEAD_DIM = HIDDEN // HEADS
QK_K = 256
# tensor (under its GGUF name, "{}" = the layer) -> format; which formats map exactly is gguf_blocks.py's business
FORMATS = {
    "token_embd.weight": "Q4_K", "output.weight": "Q6_K",
    "blk.{}.attn_q.weight": "Q4_K", "blk.{}.attn_k.weight": "Q8_0", "blk.{}.attn_v.weight": "Q6_K",
    "blk.{}.attn_output.weight": "Q4_K", "blk.{}.ffn_gate.weight": "Q4_K", "blk.{}.ffn_up.weight": "Q5_0",
    "blk.{}.ffn_down.weight": "Q6_K",
}
OVERRIDES = {"blk.1.ffn_up.weight": "Q5_K", "blk.1.attn_output.weight": "F16"}  # no exact form / a float tensor


def _fp16(rng: np.random.Generator, n: int, scale: float) -> np.ndarray:
    return (rng.uniform(0.5, 1.0, (n, 1)) * scale).astype(np.float16).view(np.uint8)  # [n, 2]


def k_quant_blocks(rng: np.random.Generator, fmt: str, n_blocks: int, scale: float) -> np.ndarray:
    """Random valid blocks of a K-quant format, uint8 [n_blocks, type size]; w has magnitude ~ `scale`."""
    raw = lambda width: rng.integers(0, 256, (n_blocks, width), dtype=np.uint8)  # noqa: E731
    if fmt == "Q4_K":  # d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles; w = d*sc*q - dmin*m
        return np.concatenate([_fp16(rng, n_blocks, scale / 63 / 15), _fp16(rng, n_blocks, scale / 63 / 2),
                               raw(12), raw(128)], axis=1)
    if fmt == "Q5_K":  # d, dmin, scales, 32 bytes of high bits, 128 of nibbles
        return np.concatenate([_fp16(rng, n_blocks, scale / 63 / 31), _fp16(rng, n_blocks, scale / 63 / 2),
                               raw(12), raw(32), raw(128)], axis=1)
    if fmt == "Q6_K":  # 128 bytes low nibbles, 64 high 2-bit pairs, 16 int8 scales, d; w = d*sc*(q - 32)
        return np.concatenate([raw(128), raw(64), raw(16), _fp16(rng, n_blocks, scale / 128 / 32)], axis=1)
    raise ValueError(fmt)


def _weights(vocab: int) -> dict[str, tuple[str, np.ndarray]]:
    """GGUF name -> (format, data): float data for F32 / F16 / gguf-quantized formats, raw blocks for K-quants."""
    import gguf

    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (vocab, HIDDEN), "output.weight": (vocab, HIDDEN),
              "blk.{}.attn_q.weight": (HIDDEN, HIDDEN), "blk.{}.attn_k.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
              "blk.{}.attn_v.weight": (KV_HEADS * HEAD_DIM, HIDDEN), "blk.{}.attn_output.weight": (HIDDEN, HIDDEN),
              "blk.{}.ffn_gate.weight": (FFN, HIDDEN), "blk.{}.ffn_up.weight": (FFN, HIDDEN),
              "blk.{}.ffn_down.weight": (HIDDEN, FFN)}
    out: dict[str, tuple[str, np.ndarray]] = {"output_norm.weight": ("F32", np.ones(HIDDEN, np.float32))}
    for i in range(LAYERS):
        b = f"blk.{i}."
        out |= {b + "attn_norm.weight": ("F32", np.ones(HIDDEN, np.float32)),
                b + "ffn_norm.weight": ("F32", np.ones(HIDDEN, np.float32))}
        for name, dims in (("attn_q.bias", HIDDEN), ("attn_k.bias", KV_HEADS * HEAD_DIM), ("attn_v.bias", KV_HEADS * HEAD_DIM)):
            out[b + name] = ("F32", (rng.standard_normal(dims) * 0.02).astype(np.float32))
    for pattern, (n, k) in shapes.items():
        for name in sorted({pattern.format(i) for i in range(LAYERS)}):
            fmt = OVERRIDES.get(name, FORMATS[pattern])
            scale = 1.0 if "embd" in name else 1.5 / np.sqrt(k)
            if fmt in ("Q4_K", "Q5_K", "Q6_K"):
                out[name] = (fmt, k_quant_blocks(rng, fmt, n * k // QK_K, scale).reshape(n, -1))
                continue
            values = (rng.standard_normal((n, k)) * scale / 2).astype(np.float32)
            if fmt == "F16":
                out[name] = (fmt, values.astype(np.float16))
            else:
                out[name] = (fmt, gguf.quants.quantize(values, gguf.GGMLQuantizationType[fmt]))
    return out


def write_kquant_gguf(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """A loadable Qwen2 GGUF at `path`; returns its 2-D tensors: GGUF name -> (format, stored data)."""
    import gguf

    w, n_tokens = qwen2_gguf_writer(path, "tiny k-quant qwen2", layers=LAYERS, hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS,
                                   ffn=FFN)
    tensors = _weights(n_tokens)
    for name, (fmt, data) in tensors.items():
        if fmt in ("F32", "F16"):
            w.add_tensor(name, data)
        else:
            qtype = gguf.GGMLQuantizationType[fmt]
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {name: value for name, value in tensors.items() if value[1].ndim == 2}
