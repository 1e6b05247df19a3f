"""The quantize stage on exported tiny graphs: every weight becomes MatMulNBits / GatherBlockQuantized, the graph
runs on ONNX Runtime's CPU EP and computes exactly what its dequantized weights say."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from specpack import names
from specpack.quantize.stage import quantize_plain_graph
from tests.quantize.weights import dequantized, initializers, with_accuracy_level, with_weights

HEAD_DIM = 16  # target 64 wide, draft 32: multiples of MatMulNBits' blocks


def _logits(path: Path, ids: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {names.INPUT_IDS: ids, names.POSITION_IDS: np.arange(ids.shape[1])[None],
             names.ATTENTION_MASK: np.ones_like(ids)}
    for i in session.get_inputs():
        if i.name.startswith("past_key_values"):
            feeds[i.name] = np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
    return session.run([names.LOGITS], feeds)[0]


def _ops(path: Path) -> list[tuple[str, dict[str, int]]]:
    graph = onnx.load(str(path), load_external_data=False).graph
    return [(n.op_type, {a.name: a.i for a in n.attribute if a.type == onnx.AttributeProto.INT}) for n in graph.node]


def _constant_matmuls(path: Path) -> int:
    """Default-domain MatMuls whose second input is a 2-D initializer: what a weight-only mode must leave none of."""
    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {t.name for t in graph.initializer if len(t.dims) == 2}
    return sum(n.op_type == "MatMul" and n.domain == "" and n.input[1] in weights for n in graph.node)


@pytest.fixture(scope="module")
def plain(tiny_plain_graph: Callable[..., Path]) -> Path:
    return Path(tiny_plain_graph("qwen2", role="target", head_dim=HEAD_DIM))


@pytest.mark.parametrize(("method", "bits"), [("int4", 4), ("int8", 8)])
def test_every_weight_becomes_nbits(plain: Path, tmp_path: Path, method: str, bits: int) -> None:
    out = tmp_path / f"target.{method}.onnx"
    record = quantize_plain_graph(plain, out, method)
    onnx.checker.check_model(str(out))
    assert _constant_matmuls(plain) > 0 and _constant_matmuls(out) == 0
    ops = _ops(out)
    nbits = [attrs for op, attrs in ops if op == "MatMulNBits"]
    assert len(nbits) == _constant_matmuls(plain)
    assert all(a["bits"] == bits and a["accuracy_level"] == 4 and a["block_size"] == 32 for a in nbits)
    assert [op for op, _ in ops].count("GatherBlockQuantized") == 1  # the token embedding
    assert {r["path"] for r in record["tensors"]} == {"k_quant" if bits == 4 else "rtn"} and record["method"] == method
    assert record["bytes_after"] < record["bytes_before"] / (3 if bits == 8 else 5)
    assert {out.name, f"{out.name}.data"} <= {p.name for p in tmp_path.iterdir()}


def test_graph_computes_its_dequantized_weights(plain: Path, tmp_path: Path) -> None:
    """With fp32 arithmetic (accuracy level 0), the int4 graph equals the plain graph holding the dequantized weights."""
    out = tmp_path / "target.int4.onnx"
    record = quantize_plain_graph(plain, out, "int4")
    inits = initializers(out)
    weights = {r["tensor"]: dequantized(r, inits) for r in record["tensors"]}
    reference = with_weights(plain, tmp_path / "dequantized.onnx", weights)
    exact = with_accuracy_level(out, tmp_path / "acc0.onnx", 0)
    ids = np.array([[5, 17, 33, 101, 7, 250, 3]], np.int64)
    want = _logits(reference, ids)
    np.testing.assert_allclose(_logits(exact, ids), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    fast = _logits(out, ids)  # int8 activations: close to it, not equal
    assert np.abs(fast - want).max() < 0.1 * np.abs(want).max()


def test_tied_embedding_is_stored_once(tiny_pairs: Callable[..., tuple[Path, Path]], tmp_path: Path) -> None:
    """A tied lm_head and the embedding Gather read one packed table; the graph keeps no float copy of it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specpack.export.torch_export import export_plain_graph

    _, target = tiny_pairs("qwen2", head_dim=HEAD_DIM)
    model = AutoModelForCausalLM.from_pretrained(target)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    model.save_pretrained(tmp_path / "tied")
    AutoTokenizer.from_pretrained(target).save_pretrained(tmp_path / "tied")
    tied = tmp_path / "tied.onnx"
    export_plain_graph(tmp_path / "tied", tied)
    out = tmp_path / "tied.int4.onnx"
    record = quantize_plain_graph(tied, out, "int4")
    kinds = {r["kind"]: r for r in record["tensors"]}
    assert kinds["tied"]["path"] == "shared" and kinds["tied"]["with"] == kinds["embedding"]["tensor"]
    graph = onnx.load(str(out), load_external_data=False).graph
    table = f"{kinds['embedding']['tensor']}.nbits4"
    readers = sorted(n.op_type for n in graph.node if table in n.input)
    assert readers == ["GatherBlockQuantized", "MatMulNBits"]
    vocab, hidden = kinds["embedding"]["n"], kinds["embedding"]["k"]
    assert not [t.name for t in graph.initializer if sorted(t.dims) == sorted([vocab, hidden])]  # no float table
    inits = initializers(out)
    weights = {r["tensor"]: dequantized(r, inits) for r in record["tensors"] if r["path"] != "shared"}
    reference = with_weights(tied, tmp_path / "tied.dequantized.onnx", weights)
    ids = np.array([[5, 17, 33, 101]], np.int64)
    want = _logits(reference, ids)
    got = _logits(with_accuracy_level(out, tmp_path / "tied.acc0.onnx", 0), ids)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    with torch.no_grad():  # and the tied export itself is right: the fp32 graph gives transformers' logits
        hf = AutoModelForCausalLM.from_pretrained(tmp_path / "tied")(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(_logits(tied, ids), hf, rtol=1e-4, atol=1e-4)


def test_gguf_mode_needs_a_gguf(plain: Path, tmp_path: Path) -> None:
    from specpack.errors import SpecpackError

    with pytest.raises(SpecpackError, match="needs a GGUF source"):
        quantize_plain_graph(plain, tmp_path / "x.onnx", "gguf")
