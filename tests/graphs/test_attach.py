"""Heads attached onto plain graphs: I/O contract, the moved weights, and the same results as the oracle."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from specpack import names
from specpack.errors import SpecpackError
from specpack.graphs import oracle
from specpack.graphs.attach import build_draft_step_graph, build_verify_graph
from specpack.sampling import SamplingParams

from .cases import sampling_feeds
from .plain import copy_plain, make_plain, plain_feeds

F32 = np.float32
PARAMS = [SamplingParams(0.0), SamplingParams(0.8), SamplingParams(1.2, top_k=20, top_p=0.9),
          SamplingParams(0.5, top_p=0.3)]


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _external_locations(path: Path) -> set[str]:
    model = onnx.load(str(path), load_external_data=False)
    return {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}


def _verify_feeds(rng: np.random.Generator, vocab: int, model_vocab: int, k: int, params: SamplingParams,
                  dtype: type) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Plain feeds whose input_ids end with k draft tokens drawn by the draft oracle; plus their q [1, k, V]."""
    feeds = plain_feeds(rng, k + 1 + int(rng.integers(0, 3)), int(rng.integers(0, 5)), model_vocab, dtype=dtype)
    q = np.zeros((1, k, vocab), F32)
    for i in range(k):
        token, q[0, i] = oracle.draft_step(rng.standard_normal(vocab).astype(F32), float(rng.random()), params)
        feeds[names.INPUT_IDS][0, -k + i] = token
    return feeds, q


@pytest.mark.parametrize(("dtype", "pad_rows", "symbolic"), [(np.float32, 0, False), (np.float32, 27, False),
                                                           (np.float16, 5, True)])
def test_verify_graph(tmp_path: Path, dtype: type, pad_rows: int, symbolic: bool) -> None:
    vocab = 1500
    plain = make_plain(tmp_path / "target.onnx", vocab + pad_rows, dtype=dtype, symbolic_vocab=symbolic)
    plain_session = _session(plain)
    rng = np.random.default_rng(0)
    runs = []
    for i in range(24):
        params, k = PARAMS[i % len(PARAMS)], int(rng.integers(0, 6))
        feeds, q = _verify_feeds(rng, vocab, vocab + pad_rows, k, params, dtype)
        logits, *presents = plain_session.run(None, feeds)
        runs.append((params, k, feeds, q, logits, presents))
    data_size = (tmp_path / "target.onnx.data").stat().st_size
    del plain_session

    out = tmp_path / "pack" / names.VERIFY_FILE
    build_verify_graph(plain, out, vocab)

    assert not (tmp_path / "target.onnx.data").exists()  # moved, not copied
    assert (tmp_path / "pack" / "verify.onnx.data").stat().st_size == data_size
    assert _external_locations(out) == {"verify.onnx.data"}
    session = _session(out)
    output_names = [o.name for o in session.get_outputs()]
    assert names.LOGITS not in output_names
    assert output_names[:2] == [names.N_ACCEPTED, names.NEXT_TOKEN]
    assert {names.DRAFT_PROBS, names.UNIFORMS, names.TOP_K} <= {i.name for i in session.get_inputs()}
    for params, k, feeds, q, logits, presents in runs:
        uniforms = rng.random((1, k + 1), dtype=F32)
        n, next_token, *got_presents = session.run(None, {**feeds, names.DRAFT_PROBS: q, names.UNIFORMS: uniforms,
                                                          **sampling_feeds(params)})
        drafts = feeds[names.INPUT_IDS][0, -k:] if k else np.zeros(0, np.int64)
        target = logits[0, -(k + 1) :, :vocab].astype(F32)
        assert (int(n[0]), int(next_token[0])) == oracle.verify(target, drafts, q[0], uniforms[0], params)
        for got, want in zip(got_presents, presents, strict=True):
            np.testing.assert_array_equal(got, want)


def test_draft_step_graph(tmp_path: Path) -> None:
    vocab = 700
    plain = make_plain(tmp_path / "draft.onnx", vocab + 3)
    plain_session = _session(plain)
    rng = np.random.default_rng(1)
    runs = []
    for i in range(12):
        feeds = plain_feeds(rng, int(rng.integers(1, 5)), int(rng.integers(0, 5)), vocab)
        runs.append((PARAMS[i % len(PARAMS)], feeds, plain_session.run([names.LOGITS], feeds)[0]))
    del plain_session

    out = tmp_path / names.DRAFT_STEP_FILE
    build_draft_step_graph(plain, out, vocab)

    assert _external_locations(out) == {"draft_step.onnx.data"}
    session = _session(out)
    assert [o.name for o in session.get_outputs()][:2] == [names.TOKEN, names.PROBS]
    assert session.get_outputs()[1].shape == [1, vocab]
    for params, feeds, logits in runs:
        u = rng.random(1, dtype=F32)
        token, probs = session.run([names.TOKEN, names.PROBS], {**feeds, names.UNIFORM: u, **sampling_feeds(params)})
        want_token, want_q = oracle.draft_step(logits[0, -1, :vocab], float(u[0]), params)
        assert int(token[0]) == want_token
        np.testing.assert_array_equal(probs[0], want_q)


def test_rejects_old_opset(tmp_path: Path) -> None:
    plain = make_plain(tmp_path / "old.onnx", 50, opset=17)
    with pytest.raises(SpecpackError, match="opset too old"):
        build_verify_graph(plain, tmp_path / "verify.onnx", 50)
    assert (tmp_path / "old.onnx.data").exists()  # nothing moved on failure


def test_rejects_narrow_logits(tmp_path: Path) -> None:
    plain = make_plain(tmp_path / "plain.onnx", 50)
    with pytest.raises(SpecpackError, match="narrower than the vocabulary"):
        build_draft_step_graph(plain, tmp_path / "draft_step.onnx", 51)


def test_rejects_graph_without_logits(tmp_path: Path) -> None:
    plain = make_plain(tmp_path / "plain.onnx", 50)
    model = onnx.load(str(plain), load_external_data=False)
    model.graph.output[0].name = "scores"
    model.graph.node[3].output[0] = "scores"
    onnx.save_model(model, str(plain))
    with pytest.raises(SpecpackError, match="not a plain forward graph"):
        build_verify_graph(plain, tmp_path / "verify.onnx", 50)


def test_rejects_graph_that_already_has_head_io(tmp_path: Path) -> None:
    plain = make_plain(tmp_path / "plain.onnx", 50)
    model = onnx.load(str(plain), load_external_data=False)
    model.graph.input.append(onnx.helper.make_tensor_value_info(names.TEMPERATURE, onnx.TensorProto.FLOAT, [1]))
    onnx.save_model(model, str(plain))
    with pytest.raises(SpecpackError, match="already has the head's inputs or outputs"):
        build_draft_step_graph(plain, tmp_path / "draft_step.onnx", 50)


def test_exported_tiny_model(tiny_plain_graph: Callable[..., Path], tmp_path: Path) -> None:
    """A torch.onnx.export(dynamo=True) graph of a tiny Qwen2: attach both heads, run them beside the plain graph."""
    source = Path(tiny_plain_graph("qwen2"))  # shared by other tests: attach copies
    plain_session = _session(source)
    vocab = plain_session.get_outputs()[0].shape[2]
    rng = np.random.default_rng(2)
    params, k, seq = SamplingParams(0.9, top_k=30, top_p=0.95), 3, 6
    feeds = {names.INPUT_IDS: rng.integers(0, vocab, (1, seq)), names.POSITION_IDS: np.arange(seq)[None],
             names.ATTENTION_MASK: np.ones((1, seq), np.int64)}
    feeds |= {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), F32) for i in plain_session.get_inputs()
              if i.name.startswith("past_key_values")}
    logits = plain_session.run([names.LOGITS], feeds)[0]  # [1, S, V]
    del plain_session

    build_verify_graph(copy_plain(source, tmp_path / "target.onnx"), tmp_path / names.VERIFY_FILE, vocab)
    build_draft_step_graph(copy_plain(source, tmp_path / "draft.onnx"), tmp_path / names.DRAFT_STEP_FILE, vocab)

    # q with full support: the random draft tokens in input_ids have q(x) > 0, as if drawn from q
    q = oracle.transform(logits[0, seq - k - 1 : seq - 1] * F32(0.5), SamplingParams(1.0))[None]  # [1, k, V]
    uniforms = rng.random((1, k + 1), dtype=F32)
    n, next_token = _session(tmp_path / names.VERIFY_FILE).run(
        [names.N_ACCEPTED, names.NEXT_TOKEN],
        {**feeds, names.DRAFT_PROBS: q, names.UNIFORMS: uniforms, **sampling_feeds(params)})
    drafts = feeds[names.INPUT_IDS][0, -k:]
    assert (int(n[0]), int(next_token[0])) == oracle.verify(logits[0, -(k + 1) :], drafts, q[0], uniforms[0], params)
    token, probs = _session(tmp_path / names.DRAFT_STEP_FILE).run(
        [names.TOKEN, names.PROBS], {**feeds, names.UNIFORM: uniforms[0, :1], **sampling_feeds(params)})
    want_token, want_q = oracle.draft_step(logits[0, -1], float(uniforms[0, 0]), params)
    assert int(token[0]) == want_token
    np.testing.assert_array_equal(probs[0], want_q)
