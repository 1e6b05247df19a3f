"""Is TensorRT here, and is libcudart: the reasons given when they are not (no GPU or TensorRT needed)."""

from __future__ import annotations

import ctypes.util
import sys
import types

import pytest

from specpack.errors import SpecpackError
from specpack.runtime import cuda_rt
from specpack.runtime.trt_env import require_tensorrt, tensorrt_missing


def test_stubs_alone_are_not_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))  # what tensorrt-stubs makes importable
    assert tensorrt_missing() == "import tensorrt gave a package without TensorRT's API (only tensorrt-stubs is installed)"
    with pytest.raises(SpecpackError, match="TensorRT is not available") as err:
        require_tensorrt()
    assert "tensorrt-cu12" in str(err.value) and "JetPack" in str(err.value)


def test_a_failed_import_is_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import raises ModuleNotFoundError
    assert (tensorrt_missing() or "").startswith("import tensorrt failed: ModuleNotFoundError")


def test_a_module_with_the_api_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("tensorrt")
    fake.Builder = object  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    assert tensorrt_missing() is None
    require_tensorrt()


def test_missing_libcudart_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    monkeypatch.setattr(cuda_rt.glob, "glob", lambda pattern: [])
    with pytest.raises(SpecpackError, match="libcudart") as err:
        cuda_rt.Cuda.load()
    assert "LD_LIBRARY_PATH" in str(err.value)
