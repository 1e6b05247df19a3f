"""Quantization modes of a pack's graphs: names, and what each means (the names themselves: limits.QuantizationMode,
which the manifest's Quantization.method is).

    none   the plain graph as exported (fp32 or fp16)
    int8   weight-only: every MatMul weight, the lm_head and the token embedding as 8-bit blocks
    int4   the same with 4-bit blocks (asymmetric: uint8 zero points), each block's scale and zero point chosen
           by ONNX Runtime's k-quant search (llama.cpp's make_qkx2), not round to nearest: on the real 0.5B draft
           it keeps greedy alpha within 0.006 of the unquantized draft's at k 1-4 where round to nearest loses
           up to 0.013 (32 HumanEval prompts; bench/README.md, "Which weights cost the int4 draft its alpha"),
           at the same size and speed; the search costs 17x round to nearest's time with ONNX Runtime's own
           code (2 minutes for the 0.5B on 2 cores), 1.8x less CPU than that with kquant.py's (the same numbers);
           from a GGUF source, its Q4_K tensors are not searched: their blocks are fit from Q4_K's own 4-bit
           integers (q4k_fit.py), at a lower error than the search's, the same layout
    gguf   a GGUF source's own blocks, carried over where they map exactly (gguf_blocks.py), else
           dequantized + quantized; the default for a .gguf source

Weight-only modes run as ONNX Runtime's MatMulNBits / GatherBlockQuantized with accuracy level 4: the
activations are quantized to int8 per block inside the kernel, which runs ONNX Runtime's integer
(AVX2 / AVX-512 VNNI) kernels on the CPU. The calibrated Q/DQ modes quantize weights and activations, as
TensorRT-LLM's `int8_sq` and `fp8`, in the QuantizeLinear / DequantizeLinear form TensorRT consumes:

    int8-sq  SmoothQuant-smoothed MatMuls, INT8 Q/DQ on activations and weights (max calibration)
    fp8      FLOAT8E4M3FN Q/DQ on activations and weights (max calibration)

Their stage is calibration/qdq.py (nvidia-modelopt's ONNX PTQ, a calibration set from a prompt file).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from specpack.limits import QuantizationMode

ALL: tuple[str, ...] = get_args(QuantizationMode)  # none, int8, int4, gguf, int8-sq, fp8
NONE, INT8, INT4, GGUF, INT8_SQ, FP8 = ALL       # int8-sq, fp8: calibrated Q/DQ, weights and activations (calibration/qdq.py)
WEIGHT_ONLY = (NONE, INT8, INT4)  # the --quantize-draft / --quantize-target choices
CALIBRATED = (INT8_SQ, FP8)       # need a calibration set (--calib-prompts)
ACCURACY_INT8 = 4  # MatMulNBits accuracy_level: int8 activations, the integer kernels


@dataclass(frozen=True)
class WeightOnlySpec:
    """How a weight-only mode quantizes: bits, block size along K, zero points, the kernels' accuracy level."""

    method: str
    bits: int
    block_size: int = 32
    symmetric: bool = False
    accuracy_level: int = ACCURACY_INT8
    algorithm: str = "rtn"              # "rtn" (round to nearest) | "k_quant" (ONNX Runtime's k-quant search)
    lm_head_bits: int | None = None     # the lm_head (and a table tied to it) at other bits; None: `bits`

    def to_dict(self) -> dict[str, object]:
        return {"method": self.method, "bits": self.bits, "block_size": self.block_size, "symmetric": self.symmetric,
                "accuracy_level": self.accuracy_level, "algorithm": self.algorithm,
                "lm_head_bits": self.lm_head_bits or self.bits}


SPECS: dict[str, WeightOnlySpec] = {
    INT8: WeightOnlySpec(INT8, bits=8, symmetric=True),
    INT4: WeightOnlySpec(INT4, bits=4, algorithm="k_quant"),
    # GGUF: exact blocks keep their own bits and block size; these apply to the tensors that are requantized
    GGUF: WeightOnlySpec(GGUF, bits=4),
}


def fallback_bits(gguf_bits_per_weight: float) -> int:
    """Bits for a GGUF tensor that has no exact form: 4 for formats of up to 5 bits a weight, else 8."""
    return 4 if gguf_bits_per_weight <= 5.0 else 8
