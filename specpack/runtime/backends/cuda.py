"""The `cuda` backend: ONNX Runtime's CUDA EP with device-resident buffers (issue 8). Registered, not built yet.

What it will own (docs/architecture.md, "Backends"): every input, output, q and KV cache buffer on the device
(IOBinding to device OrtValues), the draft step writing q straight into the buffer the verify reads, CUDA
graphs per step kind, and a KV cache implementing runtime/kv_cache.py's KVCache with device values. Until
then loading it fails with a SpecpackError that says what is missing.
"""

from __future__ import annotations

from pathlib import Path

from specpack.deploy.manifest import Manifest
from specpack.errors import SpecpackError
from specpack.runtime.backend import Backend, BackendOptions

PROVIDER = "CUDAExecutionProvider"


def load(path: Path, manifest: Manifest, options: BackendOptions) -> Backend:
    import onnxruntime as ort

    available = ort.get_available_providers()
    if PROVIDER not in available:
        raise SpecpackError("the cuda device needs ONNX Runtime's CUDA execution provider",
                            expected=f"{PROVIDER} in onnxruntime.get_available_providers()",
                            found=f"onnxruntime {ort.__version__} with {', '.join(available)}",
                            hint="install onnxruntime-gpu (instead of onnxruntime) on a machine with an NVIDIA GPU, "
                                 "or use --device cpu")
    raise SpecpackError("the cuda backend is not implemented in this version of specpack",
                        expected="device cpu or reference", found=f"device cuda ({PROVIDER} is available)",
                        hint="use --device cpu")
