"""spec-export --quantize-* int4 of a GGUF source: its Q4_K tensors fit from their own blocks (q4k_fit.py), the other
formats searched; the pack stores exactly the fit's blocks and decodes."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from specpack import names
from specpack.export.pipeline import ExportConfig, export_pack
from specpack.quantize.nbits import from_values
from specpack.quantize.q4k_fit import q4k_int4_blocks
from tests.quantize.gguf_fixture import write_kquant_gguf
from tests.quantize.weights import dequantized, initializers

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def int4_pack(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("q4k")
    path = root / "tiny-kquant.gguf"
    tensors = write_kquant_gguf(path)
    config = ExportConfig(k=4, isolate=False, quantize_draft="int4", quantize_target="int4", fidelity=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECPACK_CACHE", str(root / "cache"))
        export_pack(str(path), str(path), root / "pack", config)
    manifest = json.loads((root / "pack" / "manifest.json").read_text())
    return {"pack": root / "pack", "tensors": tensors, "manifest": manifest, "gguf": path}


def test_q4k_tensors_are_fit_and_the_rest_searched(int4_pack: dict[str, Any]) -> None:
    q = int4_pack["manifest"]["target"]["quantization"]
    assert q["method"] == "int4" and q["gguf"] == str(int4_pack["gguf"])
    by_name = {r["gguf_tensor"]: r for r in q["tensors"] if "gguf_tensor" in r}
    for name, (fmt, _) in int4_pack["tensors"].items():
        if fmt == "F16":
            continue
        assert by_name[name]["path"] == ("q4k-fit" if fmt == "Q4_K" else "k_quant"), name
        assert (by_name[name]["bits"], by_name[name]["block_size"]) == (4, 32)
    assert q["summary"]["q4k-fit Q4_K -> int4"] == sum(f == "Q4_K" for f, _ in int4_pack["tensors"].values())


def test_the_pack_holds_the_fit_blocks(int4_pack: dict[str, Any]) -> None:
    inits = initializers(int4_pack["pack"] / names.VERIFY_FILE)
    records = [r for r in int4_pack["manifest"]["target"]["quantization"]["tensors"] if r["path"] == "q4k-fit"]
    assert records
    for r in records:
        raw = int4_pack["tensors"][r["gguf_tensor"]][1]
        values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K).reshape(r["n"], r["k"])
        fitted = q4k_int4_blocks(raw.reshape(r["n"], -1), values)
        assert fitted is not None and r["searched_blocks"] == fitted[3]
        q, scale, zero, _ = fitted
        want = from_values(q.reshape(r["n"], r["k"]), scale.reshape(r["n"], -1), 4, 32, zero.reshape(r["n"], -1))
        assert np.array_equal(dequantized(r, inits), want.dequantize()), r["gguf_tensor"]


def test_pack_decodes(int4_pack: dict[str, Any]) -> None:
    import specpack

    pack = specpack.load(int4_pack["pack"])
    prompt = [5, 17, 33, 101, 7]
    alone = pack.generate(prompt, 16, k=0)
    spec = pack.generate(prompt, 16, k=4)
    assert spec.tokens == alone.tokens and spec.stats["alpha"] == 1.0  # the same model drafts
    pack.close()
