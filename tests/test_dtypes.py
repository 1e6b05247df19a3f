"""The dtype table (specpack/dtypes.py) against the libraries whose names it writes down."""

from __future__ import annotations

from typing import get_args

import numpy as np
import onnx
import pytest

from specpack.contract.manifest import ModelEntry
from specpack.dtypes import DTYPES, GRAPH_DTYPES, graph_dtype, numpy_dtype
from specpack.errors import SpecpackError


def test_one_row_per_dtype_the_manifest_allows() -> None:
    assert tuple(GRAPH_DTYPES) == DTYPES == get_args(ModelEntry.model_fields["dtype"].annotation)


@pytest.mark.parametrize("name", DTYPES)
def test_each_row_names_what_the_libraries_call_it(name: str) -> None:
    d = graph_dtype(name)
    onnx_name = {"fp32": "FLOAT", "fp16": "FLOAT16", "bf16": "BFLOAT16"}[name]
    assert d.onnx == getattr(onnx.TensorProto, onnx_name)
    assert onnx.helper.tensor_dtype_to_np_dtype(d.onnx).itemsize == np.dtype(d.storage).itemsize
    assert d.ort == f"tensor({onnx_name.lower()})" and d.element == {"FLOAT": "float32"}.get(onnx_name, onnx_name.lower())
    if d.host is not None:
        assert np.dtype(d.host).name == d.element == str(numpy_dtype(name))


def test_torch_names_resolve() -> None:
    torch = pytest.importorskip("torch")
    for d in GRAPH_DTYPES.values():
        assert str(getattr(torch, d.torch)) == f"torch.{d.element}"


def test_unknown_dtypes_are_refused() -> None:
    with pytest.raises(SpecpackError, match="fp32 \\| fp16 \\| bf16"):
        graph_dtype("fp64")
    with pytest.raises(SpecpackError, match="fp32 \\| fp16"):
        numpy_dtype("bf16")
