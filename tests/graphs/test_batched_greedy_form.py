"""The greedy form of the batched verify graph (graphs/batched_greedy_form.py): no control flow, no sampling inputs,
and for greedy rows the n_accepted / next_token the exported graph's Scan gives, at every K (0 included), with drafts
that match the target's argmax for a while and then do not, and rows of different counts in one run."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from specpack import names
from specpack.export.model_info import read_model_info
from specpack.graphs.attach import build_batched_verify_graph
from specpack.graphs.batched_greedy_form import batched_greedy_form
from tests.runtime.test_batched_sampling import attached_copy

VOCAB = 330  # the tiny pairs' vocabulary (tests/tiny.py)


@pytest.fixture(scope="module")
def sessions(tiny_batched_plain, tmp_path_factory: pytest.TempPathFactory) -> tuple[ort.InferenceSession, ...]:
    out = tmp_path_factory.mktemp("greedy-form") / "verify_batched.onnx"
    path = attached_copy(tiny_batched_plain("qwen2", "noisy"), out, VOCAB, build_batched_verify_graph)
    greedy = batched_greedy_form(path)
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(path.parent))
    providers = ["CPUExecutionProvider"]
    return (ort.InferenceSession(str(path), providers=providers),
            ort.InferenceSession(greedy, sess_options=opts, providers=providers), onnx.load_from_string(greedy))


def _feeds(tiny_pairs, ids: np.ndarray, counts: np.ndarray, lengths: np.ndarray, k: int) -> dict[str, np.ndarray]:
    info, width = read_model_info(tiny_pairs("qwen2", "noisy")[1]), 24
    batch, seq = ids.shape
    past = dict.fromkeys(names.kv_names(info.num_layers, "past"),
                         np.zeros((batch, info.kv_heads, width, info.head_dim), np.float32))
    return {names.INPUT_IDS: ids, names.POSITION_IDS: np.tile(np.arange(seq), (batch, 1)),
            names.ATTENTION_MASK: (np.arange(width)[None] < seq).astype(np.int64).repeat(batch, 0), **past,
            names.DRAFT_COUNTS: counts, names.TOKEN_COUNTS: lengths,
            names.DRAFT_PROBS: np.zeros((batch, k, VOCAB), np.float32), names.UNIFORMS: np.zeros((batch, k + 1), np.float32),
            names.TEMPERATURE: np.zeros(batch, np.float32), names.TOP_K: np.zeros(batch, np.int64),
            names.TOP_P: np.ones(batch, np.float32)}


def _run(session: ort.InferenceSession, outputs: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The session's outputs from the feeds it takes (the greedy form takes fewer)."""
    wanted = {i.name for i in session.get_inputs()}
    return session.run(outputs, {name: value for name, value in feeds.items() if name in wanted})


def test_the_form_has_no_control_flow_and_no_sampling_inputs(sessions) -> None:  # type: ignore[no-untyped-def]
    model = sessions[2]
    assert not {n.op_type for n in model.graph.node} & {"If", "Loop", "Scan"}
    assert {i.name for i in model.graph.input}.isdisjoint(
        {names.DRAFT_PROBS, names.TEMPERATURE, names.TOP_K, names.TOP_P})
    assert names.UNIFORMS in {i.name for i in model.graph.input}  # K read from its shape


@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_greedy_rows_get_the_exported_heads_verdict(tiny_pairs, sessions, k: int) -> None:  # type: ignore[no-untyped-def]
    exported, greedy, _ = sessions
    rng = np.random.default_rng(k)
    batch, seq = 4, 8
    ids = rng.integers(0, VOCAB - 8, (batch, seq))
    counts = np.array([k, max(k - 1, 0), 0, k])                 # rows of different k_b (pad rows: 0)
    lengths = np.array([seq, seq - 1, seq, seq - 2])
    # drafts that pass for a while: row b's drafts set to the target's own argmax at their positions, row by row,
    # except one wrong token in the last row (its later drafts then fail however they match)
    for b in range(batch):
        for j in range(counts[b]):
            best = _run(greedy, [names.NEXT_TOKEN, names.N_ACCEPTED], _feeds(tiny_pairs, ids, counts, lengths, k))
            pos = lengths[b] - counts[b] + j
            if b == batch - 1 and j == 1:
                ids[b, pos] = (ids[b, pos] + 1) % (VOCAB - 8)
            elif best[1][b] == j:                                  # accepted so far: its next is the argmax at pos - 1
                ids[b, pos] = best[0][b]
    feeds = _feeds(tiny_pairs, ids, counts, lengths, k)
    want = exported.run([names.N_ACCEPTED, names.NEXT_TOKEN], feeds)
    got = _run(greedy, [names.N_ACCEPTED, names.NEXT_TOKEN], feeds)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    if k >= 3:
        assert want[0][0] == k and 0 < want[0][-1] < k  # all accepted in row 0; the wrong token stopped row 3
