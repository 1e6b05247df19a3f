"""Is TensorRT here, and what platform is this machine (for engines: contract/engines.py's Platform)?

    require_tensorrt()  returns when TensorRT can be used, else a SpecpackError saying why not (callers then
                        `import tensorrt as trt`, so mypy checks their calls against tensorrt-stubs)
    tensorrt_missing() -> None when TensorRT can be used, else the reason (tests skip with it)
    current_platform(cuda) -> Platform(gpu name, compute capability, tensorrt.__version__)

`tensorrt-stubs` installs a `tensorrt/` folder of .pyi files only: `import tensorrt` then succeeds as an empty
namespace package. TensorRT counts as present only when the module has its `Builder`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from specpack.errors import SpecpackError

if TYPE_CHECKING:
    from specpack.contract.engines import Platform
    from specpack.runtime.cuda_rt import Cuda

INSTALL_HINT = ("install TensorRT 10 for your CUDA version (NVIDIA's pip index: `pip install tensorrt-cu12`, or JetPack "
                "on a Jetson, whose python3-libnvinfer provides it)")


def tensorrt_missing() -> str | None:
    """None when TensorRT's Python API is importable, else why not (one line)."""
    try:
        trt = importlib.import_module("tensorrt")
    except Exception as err:  # ImportError, or a broken install's OSError (libnvinfer missing)
        return f"import tensorrt failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".strip()
    if not hasattr(trt, "Builder"):
        return "import tensorrt gave a package without TensorRT's API (only tensorrt-stubs is installed)"
    return None


def require_tensorrt() -> None:
    why = tensorrt_missing()
    if why is not None:
        raise SpecpackError("TensorRT is not available", expected="TensorRT 10's Python API (import tensorrt)",
                            found=why, hint=INSTALL_HINT)


def current_platform(cuda: Cuda) -> Platform:
    """This machine's GPU (device 0 of this process), its compute capability and the TensorRT version."""
    from specpack.contract.engines import Platform

    require_tensorrt()
    import tensorrt as trt

    return Platform(gpu=cuda.device_name(), compute_capability=cuda.compute_capability(), tensorrt_version=trt.__version__)
