"""The lm_head computes logits only for the rows a head reads (prune_logits.py): same outputs, fewer rows.

Each exported tiny model (Llama, Qwen2, GPT-2, and Qwen2 with int4 weights: an lm_head in ONNX Runtime's
MatMulNBits) gets its heads twice: pruned (the hidden states sliced before
the lm_head, the default) and unpruned (find_lm_head patched to fail, so attach.py slices the logits after
the full lm_head, as before pruning existed). Both must give the same tokens, counts, q and presents.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from specpack import names
from specpack.graphs import attach, oracle
from specpack.graphs.attach import LogitsNotPrunedWarning, build_draft_step_graph, build_verify_graph
from specpack.graphs.prune_logits import LmHead, find_lm_head
from specpack.sampling import SamplingParams

from .cases import sampling_feeds
from .plain import copy_plain, make_plain, plain_feeds

F32 = np.float32
FAMILIES = ("llama", "qwen2", "gpt2", "qwen2-int4")
PARAMS = (SamplingParams(0.0), SamplingParams(0.9, top_k=30, top_p=0.95))
PREFILL = 7


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@contextlib.contextmanager
def _not_pruned_warning(expected: bool) -> Iterator[None]:
    """Expect a LogitsNotPrunedWarning, or fail on one."""
    if expected:
        with pytest.warns(LogitsNotPrunedWarning):
            yield
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error", LogitsNotPrunedWarning)
            yield


def _build(source: Path, out_dir: Path, vocab: int, pruned: bool) -> tuple[Path, Path]:
    """(verify.onnx, draft_step.onnx) from copies of `source`; unpruned: the lm_head left whole."""
    out_dir.mkdir()
    with pytest.MonkeyPatch.context() as patch, _not_pruned_warning(not pruned):
        if not pruned:
            patch.setattr(attach, "find_lm_head", lambda graph: "disabled by the test")
        build_verify_graph(copy_plain(source, out_dir / "t1.onnx"), out_dir / names.VERIFY_FILE, vocab)
        build_draft_step_graph(copy_plain(source, out_dir / "t2.onnx"), out_dir / names.DRAFT_STEP_FILE, vocab)
    return out_dir / names.VERIFY_FILE, out_dir / names.DRAFT_STEP_FILE


def _lm_head_input_is_slice(path: Path) -> bool:
    """In the built graph, the MatMul that makes `logits` reads a Slice (axis 1) of the hidden states."""
    graph = onnx.load(str(path), load_external_data=False).graph
    producers = {o: n for n in graph.node for o in n.output}
    value = names.LOGITS
    while producers[value].op_type not in ("MatMul", "MatMulNBits"):  # back through per-position ops
        value = next(i for i in producers[value].input if i in producers and producers[i].op_type != "Constant")
    hidden = producers.get(producers[value].input[0])
    if hidden is None or hidden.op_type != "Slice":
        return False
    axes = producers[hidden.input[3]]
    return axes.op_type == "Constant" and numpy_helper.to_array(axes.attribute[0].t).tolist() == [1]


def _with_logits_output(path: Path) -> Path:
    """A copy of a built graph that also outputs its internal `logits` (same external data file)."""
    model = onnx.load(str(path), load_external_data=False)
    model.graph.output.append(helper.make_tensor_value_info(names.LOGITS, onnx.TensorProto.FLOAT, None))
    out = path.with_name(f"logits-{path.name}")
    onnx.save_model(model, str(out))
    return out


@pytest.fixture(scope="module", params=FAMILIES)
def built(request: pytest.FixtureRequest, tiny_plain_graph: Callable[..., Path],
          tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Pruned and unpruned heads on one family's exported tiny target, and the plain graph beside them."""
    family, _, quantized = str(request.param).partition("-")
    source = Path(tiny_plain_graph(family))  # shared by other tests: build from copies
    if quantized:
        from specpack.quantize.stage import quantize_plain_graph

        out = tmp_path_factory.mktemp(f"plain-{request.param}") / "target.onnx"
        quantize_plain_graph(source, out, quantized)
        source = out
    vocab = int(onnx.load(str(source), load_external_data=False).graph.output[0].type.tensor_type.shape.dim[2].dim_value)
    root = tmp_path_factory.mktemp(f"prune-{request.param}")
    pruned, whole = _build(source, root / "pruned", vocab, True), _build(source, root / "whole", vocab, False)
    return {"family": request.param, "source": source, "vocab": vocab, "pruned": pruned, "whole": whole}


def _kv_inputs(session: ort.InferenceSession) -> list[ort.NodeArg]:
    return [i for i in session.get_inputs() if i.name.startswith("past_key_values")]


def _forward_feeds(rng: np.random.Generator, vocab: int, seq: int, past: list[np.ndarray] | None,
                   kv: list[ort.NodeArg]) -> dict[str, np.ndarray]:
    length = 0 if past is None else past[0].shape[2]
    feeds = {names.INPUT_IDS: rng.integers(0, vocab, (1, seq)), names.POSITION_IDS: np.arange(length, length + seq)[None],
             names.ATTENTION_MASK: np.ones((1, length + seq), np.int64)}
    for i, info in enumerate(kv):
        feeds[info.name] = np.zeros((1, info.shape[1], 0, info.shape[3]), F32) if past is None else past[i]
    return feeds


def _full_support_q(rng: np.random.Generator, k: int, vocab: int) -> np.ndarray:
    """q [1, k, V] with every token possible, so random draft tokens have q(x) > 0."""
    if k == 0:
        return np.zeros((1, 0, vocab), F32)
    return oracle.transform(rng.standard_normal((k, vocab)).astype(F32), SamplingParams(1.0))[None]


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "sampled"])
def test_same_outputs_as_unpruned(built: dict[str, object], params: SamplingParams) -> None:
    vocab = int(built["vocab"])  # type: ignore[call-overload]
    (verify, draft), (verify_whole, draft_whole) = built["pruned"], built["whole"]  # type: ignore[misc]
    sessions = {"pruned": (_session(verify), _session(draft)), "whole": (_session(verify_whole), _session(draft_whole))}
    kv = _kv_inputs(sessions["pruned"][0])
    rng = np.random.default_rng(len(str(built["family"])) + int(params.greedy))

    def both(index: int, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        got, want = (sessions[name][index].run(None, feeds) for name in ("pruned", "whole"))
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
        return got

    # prefill: verify with k = 0 over PREFILL tokens and an empty cache
    feeds = _forward_feeds(rng, vocab, PREFILL, None, kv)
    prefill = both(0, {**feeds, names.DRAFT_PROBS: _full_support_q(rng, 0, vocab),
                       names.UNIFORMS: rng.random((1, 1), dtype=F32), **sampling_feeds(params)})
    past = prefill[2:]
    assert past[0].shape[2] == PREFILL
    for k in (1, 3):  # verify steps on that cache: last committed token + k drafts
        feeds = _forward_feeds(rng, vocab, k + 1, past, kv)
        both(0, {**feeds, names.DRAFT_PROBS: _full_support_q(rng, k, vocab),
                 names.UNIFORMS: rng.random((1, k + 1), dtype=F32), **sampling_feeds(params)})
    for seq in (1, 2):  # draft steps: one token, and the catch-up of two
        feeds = _forward_feeds(rng, vocab, seq, past, kv)
        both(1, {**feeds, names.UNIFORM: rng.random(1, dtype=F32), **sampling_feeds(params)})
    # and a draft prefill
    both(1, {**_forward_feeds(rng, vocab, PREFILL, None, kv), names.UNIFORM: rng.random(1, dtype=F32),
             **sampling_feeds(params)})


def test_lm_head_reads_the_slice(built: dict[str, object]) -> None:
    for path in built["pruned"]:  # type: ignore[attr-defined]
        assert _lm_head_input_is_slice(path)
    for path in built["whole"]:  # type: ignore[attr-defined]
        assert not _lm_head_input_is_slice(path)


def test_logits_have_only_the_rows_read(built: dict[str, object]) -> None:
    """The internal logits are [1, k+1, V] (verify) / [1, 1, V] (draft) and match the plain graph's last rows."""
    vocab = int(built["vocab"])  # type: ignore[call-overload]
    verify, draft = (_session(_with_logits_output(p)) for p in built["pruned"])  # type: ignore[attr-defined]
    plain = _session(Path(built["source"]))  # type: ignore[arg-type]
    kv = _kv_inputs(plain)
    rng = np.random.default_rng(5)
    for seq, k in ((PREFILL, 0), (PREFILL, 3), (4, 3), (4, 1)):
        feeds = _forward_feeds(rng, vocab, seq, None, kv)
        want = plain.run([names.LOGITS], feeds)[0]
        got = verify.run([names.LOGITS], {**feeds, names.DRAFT_PROBS: _full_support_q(rng, k, vocab),
                                          names.UNIFORMS: rng.random((1, k + 1), dtype=F32),
                                          **sampling_feeds(PARAMS[0])})[0]
        assert got.shape == (1, k + 1, vocab)
        np.testing.assert_allclose(got, want[:, -(k + 1) :], rtol=1e-5, atol=1e-5)
        got = draft.run([names.LOGITS], {**feeds, names.UNIFORM: np.zeros(1, F32), **sampling_feeds(PARAMS[0])})[0]
        assert got.shape == (1, 1, vocab)
        np.testing.assert_allclose(got, want[:, -1:], rtol=1e-5, atol=1e-5)


# Hand-built plain graphs (tests/graphs/plain.py): per-position ops after the lm_head, and forms left whole.


def _edit_tail(path: Path, tail: Callable[[onnx.GraphProto], None]) -> Path:
    """Rename the lm_head MatMul's output to `lm_out`, then let `tail` make `logits` from it."""
    model = onnx.load(str(path), load_external_data=False)
    matmul = next(n for n in model.graph.node if n.output[0] == names.LOGITS)
    matmul.output[0] = "lm_out"
    tail(model.graph)
    onnx.save_model(model, str(path))
    return path


def _bias_and_scale(graph: onnx.GraphProto) -> None:
    vocab = graph.output[0].type.tensor_type.shape.dim[2].dim_value
    graph.initializer.extend([numpy_helper.from_array(np.linspace(-1, 1, vocab).astype(F32), "bias"),
                              numpy_helper.from_array(np.array(0.5, F32), "scale")])
    graph.node.extend([helper.make_node("Add", ["lm_out", "bias"], ["biased"]),
                       helper.make_node("Mul", ["scale", "biased"], ["scaled"]),
                       helper.make_node("Identity", ["scaled"], [names.LOGITS])])


def _softmax(graph: onnx.GraphProto) -> None:  # not per-position-elementwise in find_lm_head's sense
    graph.node.append(helper.make_node("LogSoftmax", ["lm_out"], [names.LOGITS], axis=-1))


def _also_output(graph: onnx.GraphProto) -> None:  # the lm_head's output is read by something else too
    _bias_and_scale(graph)
    graph.output.append(helper.make_tensor_value_info("lm_out", onnx.TensorProto.FLOAT, ["batch", "seq", None]))


@pytest.mark.parametrize(("tail", "pruned"), [(_bias_and_scale, True), (_softmax, False), (_also_output, False)])
def test_hand_built_tails(tmp_path: Path, tail: Callable[[onnx.GraphProto], None], pruned: bool) -> None:
    vocab = 300
    plain = _edit_tail(make_plain(tmp_path / "target.onnx", vocab), tail)
    assert isinstance(find_lm_head(onnx.load(str(plain), load_external_data=False).graph), LmHead) == pruned
    session = _session(plain)
    rng = np.random.default_rng(3)
    runs = []
    for k in (0, 1, 3):
        feeds = plain_feeds(rng, k + 1 + int(rng.integers(0, 3)), int(rng.integers(0, 5)), vocab)
        runs.append((k, feeds, session.run(None, feeds)))
    del session
    out = tmp_path / names.VERIFY_FILE
    with _not_pruned_warning(not pruned):
        build_verify_graph(copy_plain(plain, tmp_path / "copy.onnx"), out, vocab)
    assert _lm_head_input_is_slice(out) == pruned
    verify = _session(out)
    params = PARAMS[1]
    for k, feeds, (logits, *rest) in runs:
        q = _full_support_q(rng, k, vocab)
        uniforms = rng.random((1, k + 1), dtype=F32)
        n, next_token, *presents = verify.run(None, {**feeds, names.DRAFT_PROBS: q, names.UNIFORMS: uniforms,
                                                     **sampling_feeds(params)})
        drafts = feeds[names.INPUT_IDS][0, feeds[names.INPUT_IDS].shape[1] - k :]
        assert (int(n[0]), int(next_token[0])) == oracle.verify(logits[0, -(k + 1) :], drafts, q[0], uniforms[0], params)
        for got, want in zip(presents, rest[-len(presents):], strict=True):
            np.testing.assert_array_equal(got, want)
