"""spec-export --draft-head on a tiny target: head_step.onnx's q is the torch head's distribution, the verify graph's
target_features are the torch target's hidden states at the taps, and a head trained for another target is refused."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tiny
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM

from specpack import names
from specpack.cli.main import cli
from specpack.contract.manifest import Manifest, parse_manifest
from specpack.errors import SpecpackError
from specpack.graphs import oracle
from specpack.heads.head_file import build_head, read_head
from specpack.sampling import SamplingParams

# fp32 graph vs eager fp32 torch: the same math in another order. Logits differ by ~1e-6, so probabilities of ~1/200
# by ~1e-8 (measured: 3e-8); 1e-6 leaves room and is still far below any probability a defect would change
# (a wrong row or a missing token moves q by ~1/V_sub = 5e-3). Outside the subset q must be exactly 0.
Q_ATOL = 1e-6
FEATURE_ATOL = 1e-5  # hidden states of size ~1-10 (measured difference ~1e-6)


@pytest.fixture(scope="module")
def pack(tiny_head_pack: Callable[..., tuple[Path, Path, Path]]) -> tuple[Path, Path, Path]:
    torch.set_num_threads(1)
    return tiny_head_pack("qwen2")


@pytest.fixture(scope="module")
def torch_head(pack: tuple[Path, Path, Path]) -> tuple[object, object]:
    _, head_dir, target_dir = pack
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    return build_head(read_head(head_dir), target), target


def _sampling(temperature: float, top_k: int = 0, top_p: float = 1.0, u: float = 0.5) -> dict[str, np.ndarray]:
    return {names.TEMPERATURE: np.array([temperature], np.float32), names.TOP_K: np.array([top_k], np.int64),
            names.TOP_P: np.array([top_p], np.float32), names.UNIFORM: np.array([u], np.float32)}


def _head_run(sess: ort.InferenceSession, head: object, ids: np.ndarray, feats: np.ndarray, draft_ids: np.ndarray,
              hidden: np.ndarray, past: tuple[np.ndarray, np.ndarray], sampling: dict[str, np.ndarray]
              ) -> tuple[list[np.ndarray], tuple[torch.Tensor, ...]]:
    feeds = {names.INPUT_IDS: ids, names.FEATURES: feats, names.DRAFT_IDS: draft_ids, names.HIDDEN_IN: hidden,
             names.past_name(0, "key"): past[0], names.past_name(0, "value"): past[1], **sampling}
    got = sess.run([names.TOKEN, names.PROBS, names.HIDDEN_OUT, names.present_name(0, "key"),
                    names.present_name(0, "value")], feeds)
    with torch.no_grad():
        want = head.step(*(torch.from_numpy(a) for a in (ids, feats, draft_ids, hidden, *past)))  # type: ignore[attr-defined]
    return got, want


def test_head_step_q_is_the_torch_heads_distribution(pack: tuple[Path, Path, Path], torch_head: tuple) -> None:
    """A catch-up run (C = 7 feature rows, W = 0), then two drafting runs (C = 0, W = 1) on its cache, then a mixed
    one: q equals softmax of the torch head's logits (T 1), the sampling transform of them (T 0.7, top-k 5; the
    numpy oracle), exactly zero outside the subset; greedy draws the argmax; hidden_out and the cache match."""
    pack_dir = pack[0]
    head, _ = torch_head
    c = head.config
    sess = ort.InferenceSession(str(pack_dir / names.HEAD_STEP_FILE), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    outside = np.ones(c.vocab_rows, bool)
    outside[head.subset.numpy()] = False
    empty_ids, empty_h = np.zeros((1, 0), np.int64), np.zeros((1, 0, c.hidden), np.float32)
    past = (np.zeros((1, c.kv_heads, 0, c.head_dim), np.float32),) * 2
    ids, feats = rng.integers(0, c.vocab_rows, (1, 7)), rng.normal(size=(1, 7, c.feature_dim)).astype(np.float32)
    runs = [(ids, feats, empty_ids, empty_h)]
    for step in range(4):
        (token, probs, hidden_out, *present), (logits, h, k, v) = _head_run(sess, head, *runs[-1], past, _sampling(1.0))
        q = torch.softmax(logits[0].double(), -1).numpy()  # [1, V]
        np.testing.assert_allclose(probs, q, rtol=0, atol=Q_ATOL)
        assert (probs[0, outside] == 0).all() and (q[0, outside] == 0).all() and probs[0, ~outside].min() > 0
        np.testing.assert_allclose(hidden_out, h.numpy(), rtol=0, atol=1e-5)
        np.testing.assert_allclose(present[0], k.numpy(), rtol=0, atol=1e-5)
        np.testing.assert_allclose(present[1], v.numpy(), rtol=0, atol=1e-5)
        greedy, _ = _head_run(sess, head, *runs[-1], past, _sampling(0.0))
        assert int(greedy[0][0]) == int(q.argmax()) and greedy[1][0, int(q.argmax())] == 1.0
        shaped, _ = _head_run(sess, head, *runs[-1], past, _sampling(0.7, top_k=5))
        want = oracle.transform(logits[0].numpy().astype(np.float32), SamplingParams(temperature=0.7, top_k=5))
        np.testing.assert_allclose(shaped[1], want, rtol=0, atol=Q_ATOL)
        past = (present[0], present[1])
        draft = np.array([[int(token[0])]], np.int64)
        if step < 2:  # drafting runs: the drawn token and hidden_out fed back
            runs.append((empty_ids, np.zeros((1, 0, c.feature_dim), np.float32), draft, hidden_out))
        else:  # a mixed run: two feature rows and one own row
            runs.append((rng.integers(0, c.vocab_rows, (1, 2)), rng.normal(size=(1, 2, c.feature_dim)).astype(np.float32),
                         draft, hidden_out))
    assert past[0].shape[2] == 7 + 1 + 1 + 3


def test_verify_features_are_the_targets_hidden_states(pack: tuple[Path, Path, Path], torch_head: tuple) -> None:
    """A prefill of 9 tokens, then a verify over 1 + 3 drafts on its cache: target_features of every row equal the
    torch target's hidden_states at the taps (the input of those layers), concatenated."""
    pack_dir = pack[0]
    head, target = torch_head
    m = Manifest.read(pack_dir)
    sess = ort.InferenceSession(str(pack_dir / names.VERIFY_FILE), providers=["CPUExecutionProvider"])
    layers, kv, dim = m.target.num_layers, m.target.kv_heads, m.target.head_dim
    ids = np.random.default_rng(1).integers(0, m.vocab_size, (1, 13))
    with torch.no_grad():
        hs = target(input_ids=torch.from_numpy(ids), output_hidden_states=True).hidden_states
    want = torch.cat([hs[i] for i in m.head.taps], -1).numpy()  # [1, 13, F]
    past = [np.zeros((1, kv, 0, dim), np.float32)] * (2 * layers)
    got = []
    for start, end, k in ((0, 9, 0), (9, 13, 3)):
        feeds = {names.INPUT_IDS: ids[:, start:end], names.POSITION_IDS: np.arange(start, end)[None],
                 names.ATTENTION_MASK: np.ones((1, end), np.int64),
                 names.DRAFT_PROBS: np.zeros((1, k, m.vocab_size), np.float32),
                 names.UNIFORMS: np.full((1, k + 1), 0.5, np.float32), **_sampling(0.0),
                 **dict(zip(names.kv_names(layers, "past"), past, strict=True))}
        feeds.pop(names.UNIFORM)
        features, *past = sess.run([names.TARGET_FEATURES, *names.kv_names(layers, "present")], feeds)
        got.append(features)
    assert m.head.feature_dim == want.shape[-1] == len(m.head.taps) * head.config.hidden
    np.testing.assert_allclose(np.concatenate(got, 1), want, rtol=0, atol=FEATURE_ATOL)


def test_manifest_records_the_head(pack: tuple[Path, Path, Path]) -> None:
    pack_dir, head_dir, _ = pack
    m = Manifest.read(pack_dir)
    record = json.loads((head_dir / "head.json").read_text())
    assert m.drafter == "head" and m.draft_model is None and m.head is not None
    assert m.head.target_weights_sha256 == record["target"]["weights_sha256"]
    assert m.head.weights_sha256 == record["weights_sha256"] and m.head.subset_sha256 == record["subset_sha256"]
    assert [d.sha256 for d in m.head.data] == [d["sha256"] for d in record["data"]]
    extra = m.head.model_extra or {}
    assert extra["recipe"] == record["recipe"] and extra["training"]["seed"] == 0
    assert extra["losses"]["last"] == record["losses"][-1]
    assert {names.HEAD_STEP_FILE, f"{names.HEAD_STEP_FILE}.data"} <= set(m.loaded_files())


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda m: m.pop("head"), "needs a head entry"),
    (lambda m: m["target"]["graph"].update(outputs=[o for o in m["target"]["graph"]["outputs"]
                                                    if o["name"] != "target_features"]), "target_features"),
    (lambda m: m["head"].update(feature_dim=m["head"]["feature_dim"] + 3), "features has shape .* expected last dim"),
    (lambda m: m["head"]["graph"]["inputs"].pop(), "not the contract"),
    (lambda m: m["files"].pop(next(i for i, f in enumerate(m["files"]) if f["path"] == "head_step.onnx")), "not listed"),
])
def test_manifest_refuses_a_broken_head_entry(pack: tuple[Path, Path, Path], mutate: Callable[[dict], object],
                                              message: str) -> None:
    data = json.loads((pack[0] / "manifest.json").read_text())
    parse_manifest(json.dumps(data).encode())
    mutate(data)
    with pytest.raises(SpecpackError, match=message):
        parse_manifest(json.dumps(data).encode())


def test_a_head_for_another_target_is_refused(pack: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """The same architecture with other weights: exit 2 before anything is exported, both hashes named."""
    _, head_dir, target_dir = pack
    other = tiny.perturb_copy(target_dir, tmp_path / "other-target", scale=0.01)
    out = tmp_path / "pack"
    result = CliRunner().invoke(cli, ["export", "--target", str(other), "--draft-head", str(head_dir), "-o", str(out)])
    assert result.exit_code == 2, result.output
    record = json.loads((head_dir / "head.json").read_text())
    assert "trained for another target" in result.output and record["target"]["weights_sha256"] in result.output
    assert "expected:" in result.output and "hint:" in result.output and "specpack distill" in result.output
    assert not out.exists()


def test_draft_head_excludes_a_draft(pack: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, head_dir, target_dir = pack
    result = CliRunner().invoke(cli, ["export", "--draft", str(target_dir), "--target", str(target_dir),
                                      "--draft-head", str(head_dir), "-o", str(tmp_path / "p")])
    assert result.exit_code == 2 and "--draft-head" in result.output
    result = CliRunner().invoke(cli, ["export", "--target", str(target_dir), "--draft-head", str(tmp_path),
                                      "-o", str(tmp_path / "p")])
    assert result.exit_code == 2 and "is not a draft head" in result.output


GQA_HEAD_DIM = 16  # GroupQueryAttention needs head_dim % 8 == 0 (the tiny pairs' default 12 gets the standard form)


@pytest.fixture(scope="module")
def gqa_pack(tiny_head_pack: Callable[..., tuple[Path, Path, Path]]) -> tuple[Path, Path, Path]:
    return tiny_head_pack("qwen2", kv_cache="static", head_dim=GQA_HEAD_DIM, attention="gqa")


def test_the_gqa_head_step_is_the_torch_heads_step(gqa_pack: tuple[Path, Path, Path]) -> None:
    """The static head step through one GroupQueryAttention (rotary inside; graph_form.head_attention) computes the torch
    head's step: a catch-up of 7 feature rows read from the features cache, two drafting runs, then a mixed run
    (2 feature rows + 1 own row), each on the cache the run before wrote: q (T 1), hidden_out and the cache rows
    written equal the torch head's (concat cache, eager RoPE), fp32, CPU."""
    pack_dir, head_dir, target_dir = gqa_pack
    m = Manifest.read(pack_dir)
    assert m.head is not None and m.head.graph.attention == "gqa"
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    head = build_head(read_head(head_dir), target)
    c = head.config
    sess = ort.InferenceSession(str(pack_dir / names.HEAD_STEP_FILE), providers=["CPUExecutionProvider"])
    assert sum(n.op_type == "GroupQueryAttention" for n in _graph_nodes(pack_dir / names.HEAD_STEP_FILE)) == 1
    rng = np.random.default_rng(2)
    big = m.max_len  # M: the static buffers' rows (the rotary caches cover every row)
    cache = np.zeros((1, 1, big, c.feature_dim), np.float32)  # [1, 1, M, F] the target's features cache
    cache[0, 0, :12] = rng.normal(size=(12, c.feature_dim))
    static = [np.zeros((1, c.kv_heads, big, c.head_dim), np.float32) for _ in range(2)]  # [1, kvh, M, D]
    concat = (torch.zeros(1, c.kv_heads, 0, c.head_dim),) * 2
    ids = rng.integers(0, c.vocab_rows, (1, 12))
    length, own, hidden = 0, np.zeros((1, 0), np.int64), np.zeros((1, 0, c.hidden), np.float32)
    for catchup, drafting in ((7, False), (0, True), (0, True), (2, True)):
        rows = ids[:, length:length + catchup]  # [1, C]
        draft_ids = own if drafting else np.zeros((1, 0), np.int64)
        hidden_in = hidden if drafting else np.zeros((1, 0, c.hidden), np.float32)
        total = length + catchup + draft_ids.shape[1]
        feeds = {names.INPUT_IDS: rows, names.FEATURES: cache, names.DRAFT_IDS: draft_ids, names.HIDDEN_IN: hidden_in,
                 names.ATTENTION_MASK: (np.arange(big) < total).astype(np.int64)[None],
                 names.past_name(0, "key"): static[0], names.past_name(0, "value"): static[1], **_sampling(1.0)}
        token, probs, hidden_out, *static = sess.run(
            [names.TOKEN, names.PROBS, names.HIDDEN_OUT, names.present_name(0, "key"), names.present_name(0, "value")],
            feeds)
        with torch.no_grad():
            feats = torch.from_numpy(cache[:, 0, length:length + catchup])  # [1, C, F]
            logits, h, *concat = head.step(torch.from_numpy(rows), feats, torch.from_numpy(draft_ids),
                                           torch.from_numpy(hidden_in), *concat)
        np.testing.assert_allclose(probs, torch.softmax(logits[0].double(), -1).numpy(), rtol=0, atol=Q_ATOL)
        np.testing.assert_allclose(hidden_out, h.numpy(), rtol=0, atol=1e-5)
        for got, want in zip(static, concat, strict=True):
            np.testing.assert_allclose(got[:, :, :total], want.numpy(), rtol=0, atol=1e-5)
            assert not got[:, :, total:].any()  # rows past the run's are never written
        length, own, hidden = total, token.reshape(1, 1), hidden_out
    assert length == 7 + 1 + 1 + 3


def _graph_nodes(path: Path) -> list:
    import onnx

    return list(onnx.load(str(path), load_external_data=False).graph.node)


@pytest.mark.parametrize("attention", ["standard", "gqa"])
def test_the_static_head_step_reads_only_its_rows_of_the_features_cache(
        tiny_head_pack: Callable[..., tuple[Path, Path, Path]], attention: str) -> None:
    """The features cache [1, 1, M, F] enters the static head step through one Gather of the run's C rows (axis 2): no
    node copies the whole cache. Indexing features[0, 0] first exported two Gathers that did, on every run: 86 us of
    the 0.30 ms head step on an H100, 7 ms of 22 ms on the CPU at M 2560 (bench/README.md, "Run G")."""
    pack_dir = tiny_head_pack("qwen2", kv_cache="static", head_dim=GQA_HEAD_DIM, attention=attention)[0]
    assert Manifest.read(pack_dir).head.graph.attention == attention  # type: ignore[union-attr]
    readers = [n for n in _graph_nodes(pack_dir / names.HEAD_STEP_FILE) if names.FEATURES in n.input]
    assert [(n.op_type, [(a.name, a.i) for a in n.attribute]) for n in readers] == [("Gather", [("axis", 2)])]
