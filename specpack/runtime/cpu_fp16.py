"""Whether ONNX Runtime's CPU execution provider has fast fp16 kernels here (light: no onnx, no torch).

ONNX Runtime registers its fp16 MatMul / Gemm CPU kernels (MLAS half-precision GEMM) only on ARM64 with
fp16 vector arithmetic (Linux `asimdhp`, every Apple silicon Mac). Elsewhere its graph optimizer wraps each
fp16 MatMul in Cast -> fp32 MatMul -> Cast and converts the weight to fp32 at load (measured on x86-64 with
AVX-512 FP16, ONNX Runtime 1.32: the optimized graph holds an fp32 copy of the weight), so an fp16 pack
costs fp32 memory plus casts and gains nothing: it is refused there, with this reason.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path


def cpu_fp16_refusal() -> str | None:
    """None when fp16 graphs run on fast kernels on this CPU, else the reason they do not."""
    machine = platform.machine().lower()
    if machine in ("arm64", "aarch64"):
        if sys.platform == "darwin" or _cpu_flag("asimdhp"):
            return None
        return "this ARM64 CPU has no fp16 vector arithmetic (asimdhp), which ONNX Runtime's fp16 kernels need"
    return (f"ONNX Runtime's CPU execution provider has no fp16 MatMul kernels on {machine or 'this CPU'}: it converts "
            "fp16 weights to fp32 at load and casts around every MatMul, so an fp16 pack is slower than fp32 and "
            "as large in memory")


def _cpu_flag(flag: str) -> bool:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(flag in line.split(":", 1)[1].split() for line in text.splitlines()
               if line.lower().startswith(("features", "flags")) and ":" in line)
