"""The batched greedy head with its K + 1 from shapes (graphs/batched_fixed_rows.py): every row's first k_b + 1 argmaxes
those of the head as exported, for decode steps (S <= rows) and long catch-ups (S > rows), and, unlike the head as
exported, no tensor the CUDA EP would copy between host and device (a session with such a copy refuses CUDA graphs:
the batched draft on an H200, 2026-12-07; tests/graphs/host_values.py models the EP's placement)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from specpack import names
from specpack.export.model_info import read_model_info
from specpack.graphs.attach import build_batched_greedy_graph
from specpack.graphs.batched_fixed_rows import batched_fixed_rows
from specpack.graphs.batched_greedy_form import batched_greedy_form
from tests.graphs.host_values import host_values_in_data
from tests.runtime.test_batched_sampling import attached_copy

VOCAB = 330  # the tiny pairs' vocabulary (tests/tiny.py)
ROWS = 5     # k_max + 1 of a pack exported with --k 4


@pytest.fixture(scope="module")
def draft_graph(tiny_batched_plain, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    out = tmp_path_factory.mktemp("fixed-rows") / "draft_batched.onnx"
    return attached_copy(tiny_batched_plain("qwen2", "noisy", "draft"), out, VOCAB, build_batched_greedy_graph)


def _session(model: str | bytes, folder: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
    return ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("seq", [1, 2, 5, 11])
def test_each_rows_first_k_plus_1_argmaxes_are_the_exported_heads(tiny_pairs, draft_graph: Path, seq: int) -> None:  # type: ignore[no-untyped-def]
    exported = _session(str(draft_graph), draft_graph.parent)
    fixed = _session(batched_fixed_rows(draft_graph, rows=ROWS), draft_graph.parent)
    info, width = read_model_info(tiny_pairs("qwen2", "noisy")[0]), 32
    rng = np.random.default_rng(seq)
    batch = 4
    lengths = np.minimum(np.array([seq, seq - 1, seq, 1]), seq).clip(1)     # each row's real tokens S_b <= S
    counts = np.minimum(rng.integers(0, ROWS, batch), lengths - 1)           # k_b <= S_b - 1 and <= k_max
    feeds = {names.INPUT_IDS: rng.integers(0, VOCAB - 8, (batch, seq)),
             names.POSITION_IDS: np.tile(np.arange(seq), (batch, 1)),
             names.ATTENTION_MASK: (np.arange(width)[None] < seq).astype(np.int64).repeat(batch, 0),
             **dict.fromkeys(names.kv_names(info.num_layers, "past"),
                             np.zeros((batch, info.kv_heads, width, info.head_dim), np.float32)),
             names.DRAFT_COUNTS: counts, names.TOKEN_COUNTS: lengths}
    (want,) = exported.run([names.BEST], feeds)  # [B, max k_b + 1]
    (got,) = fixed.run([names.BEST], feeds)      # [B, min(S, ROWS)]
    assert want.shape == (batch, counts.max() + 1) and got.shape == (batch, min(seq, ROWS))
    for b in range(batch):
        assert got[b, : counts[b] + 1].tolist() == want[b, : counts[b] + 1].tolist(), b


def test_the_captured_forms_copy_nothing_between_host_and_device(draft_graph: Path, tiny_batched_plain,  # type: ignore[no-untyped-def]
                                                                 tmp_path: Path) -> None:
    """The forms the cuda backend captures (the draft's fixed rows, the verify graph's greedy form) are clean; the
    draft's head as exported is not (its K + 1 = max k_b + 1 is a device value ranged over on the host), which shows
    the check can fail, as it did on the graphs before the device-side bounds (Min(pos, S - 1), mask sum - S: a host
    value entering device ops), and on the Clip(pos, 0, S - 1) that followed: it names the Clip's max, the very value an
    H100 copied in (2026-12-07: "Add MemcpyFromHost after specpack/squeeze_36"; pos is now clamped to S_b - 1 from
    token_counts, a device input)."""
    from specpack.graphs.attach import build_batched_verify_graph

    verify = attached_copy(tiny_batched_plain("qwen2", "noisy"), tmp_path / "verify_batched.onnx", VOCAB,
                           build_batched_verify_graph)
    assert host_values_in_data(onnx.load_from_string(batched_fixed_rows(draft_graph, rows=ROWS))) == []
    assert host_values_in_data(onnx.load_from_string(batched_greedy_form(verify))) == []
    (problem,) = host_values_in_data(onnx.load(str(draft_graph), load_external_data=False))
    assert "Range" in problem and "a device value" in problem


def test_a_verify_head_is_refused_and_an_older_greedy_head_kept(tiny_batched_plain, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The verify graph's head reads draft_counts without the greedy head's ReduceMax: refused. A graph without
    draft_counts (the greedy head before 2026-12-06 read every position) comes back as it was."""
    from specpack.graphs.attach import build_batched_verify_graph

    verify = attached_copy(tiny_batched_plain("qwen2", "noisy"), tmp_path / "verify_batched.onnx", VOCAB,
                           build_batched_verify_graph)
    with pytest.raises(ValueError, match="batched greedy head"):
        batched_fixed_rows(verify, rows=ROWS)
    plain = tiny_batched_plain("qwen2", "noisy")
    assert batched_fixed_rows(plain, rows=ROWS) == onnx.load(str(plain), load_external_data=False).SerializeToString()
