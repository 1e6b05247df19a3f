"""spec-export of a GGUF with Q4_K / Q6_K / Q8_0 / Q5_0 (exact), Q5_K (no exact form) and F16 tensors, built here.

By default a .gguf source keeps its blocks: the pack's dequantized weights equal the GGUF's dequantized weights,
bit for bit, for every tensor that maps exactly; the rest are dequantized + quantized, and the manifest (and
`inspect`) says which tensor took which path.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from specpack import names
from specpack.cli.main import cli
from specpack.export.pipeline import ExportConfig, export_pack
from tests.quantize.gguf_fixture import OVERRIDES, write_kquant_gguf
from tests.quantize.weights import dequantized, initializers

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def gguf_pack(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("kquant")
    path = root / "tiny-kquant.gguf"
    tensors = write_kquant_gguf(path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECPACK_CACHE", str(root / "cache"))  # the fp32 conversion is cached here, not in ~
        export_pack(str(path), str(path), root / "pack", ExportConfig(k=4, isolate=False))
    manifest = json.loads((root / "pack" / "manifest.json").read_text())
    return {"pack": root / "pack", "tensors": tensors, "manifest": manifest}


def test_manifest_says_which_tensor_took_which_path(gguf_pack: dict[str, Any]) -> None:
    q = gguf_pack["manifest"]["target"]["quantization"]
    assert q["method"] == "gguf" and gguf_pack["manifest"]["draft"]["quantization"]["method"] == "gguf"
    paths = {r["gguf_tensor"]: (r["path"], r["format"]) for r in q["tensors"]}
    for name, (fmt, _) in gguf_pack["tensors"].items():
        want = {"Q5_K": "gguf-requantized", "F16": "gguf-float"}.get(fmt, "gguf-exact")
        assert paths[name] == (want, fmt), name
    assert q["summary"]["gguf-requantized Q5_K -> int8"] == 1 and q["summary"]["gguf-float F16"] == 1
    fidelity = q["fidelity"]
    assert fidelity["positions"] > 0 and fidelity["mean_kl"] >= 0.0 and 0.0 <= fidelity["top1_agreement"] <= 1.0


def test_dequantized_weights_equal_the_ggufs(gguf_pack: dict[str, Any]) -> None:
    """Every exactly mapped tensor of verify.onnx dequantizes to gguf's own dequantized values, bit for bit."""
    inits = initializers(gguf_pack["pack"] / names.VERIFY_FILE)
    records = gguf_pack["manifest"]["target"]["quantization"]["tensors"]
    exact = [r for r in records if r["path"] == "gguf-exact"]
    assert {r["format"] for r in exact} == {"Q4_K", "Q6_K", "Q8_0", "Q5_0"}
    assert len(exact) == len(gguf_pack["tensors"]) - len(OVERRIDES)
    for r in exact:
        fmt, data = gguf_pack["tensors"][r["gguf_tensor"]]
        want = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[fmt]).reshape(r["n"], r["k"])  # [N, K]
        assert np.array_equal(dequantized(r, inits), want.T), r["gguf_tensor"]


def test_pack_decodes_losslessly(gguf_pack: dict[str, Any]) -> None:
    import specpack

    pack = specpack.load(gguf_pack["pack"])
    prompt = [5, 17, 33, 101, 7]
    alone = pack.generate(prompt, 24, k=0)
    spec = pack.generate(prompt, 24, k=4)
    assert spec.tokens == alone.tokens and spec.stats["alpha"] == 1.0  # the same model drafts: all accepted
    pack.close()


def test_inspect_shows_the_paths_and_that_the_target_is_another_model(gguf_pack: dict[str, Any]) -> None:
    result = CliRunner().invoke(cli, ["inspect", str(gguf_pack["pack"])], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "gguf-exact Q4_K" in text and "gguf-requantized Q5_K -> int8" in text and "gguf-float F16" in text
    assert "blk.1.ffn_up.weight: gguf-requantized, Q5_K has no exact MatMulNBits form here" in text
    assert "a quantized target is a different model" in text and "top-1 agreement" in text
