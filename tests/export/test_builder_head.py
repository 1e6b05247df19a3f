"""`spec-export --graphs builder --draft-head HEAD`: a head pack whose target is onnxruntime-genai's model builder
graph with the features cache added (export/builder_features.py).

Features: the builder graph's features cache equals transformers' hidden states of the tapped layers.
Greedy: the target alone's tokens at every k and adaptive k, on the cpu backend and on the cuda backend's code
(device="cpu"). Sampling: the same tokens on both backends for the same seed, and the chi-square of
tests/runtime/test_cuda_head.py with the head drafting over the builder target (its q tempered: rejected).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import specpack
from specpack.runtime.pack import Pack
from tests.export.test_builder_export import HEAD_DIM, needs_builder
from tests.runtime.test_cuda_backend import device_pack
from tests.runtime.test_cuda_head import head_greedy_accepted

PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def head_dirs(tiny_head_pack: Callable[..., tuple[Path, Path, Path]]) -> tuple[Path, Path, Path]:
    return tiny_head_pack("qwen2", kv_cache="static", head_dim=HEAD_DIM, graphs="builder")


@pytest.fixture(scope="module")
def cpu(head_dirs: tuple[Path, Path, Path]) -> Iterator[Pack]:
    loaded = specpack.load(head_dirs[0], threads=1)
    yield loaded
    loaded.close()


@needs_builder
def test_the_builder_target_writes_the_features_cache(cpu: Pack) -> None:
    m = cpu.manifest
    assert m.head is not None and m.target.graph.exporter == "builder" and m.target.graph.positions == "internal"
    inputs = {s.name: s.shape for s in m.target.graph.inputs}
    outputs = {s.name: s.shape for s in m.target.graph.outputs}
    assert inputs["past_target_features"] == outputs["target_features"]
    assert inputs["past_target_features"][-1] == m.head.feature_dim


@needs_builder
def test_greedy_equals_the_target_alone_on_both_backends(cpu: Pack, head_dirs: tuple[Path, Path, Path]) -> None:
    dev = device_pack(head_dirs[0], chunked_runs=True)
    try:
        assert head_greedy_accepted(cpu, dev) > 0  # the head's drafts pass: it reads the features the builder wrote
        for params in ({"temperature": 1.0, "seed": 3}, {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "seed": 11}):
            for k in (2, 4):
                assert dev.generate(PROMPT, 24, k=k, **params).tokens == cpu.generate(PROMPT, 24, k=k, **params).tokens
    finally:
        dev.close()


@needs_builder
def test_the_features_are_the_targets_hidden_states(cpu: Pack, head_dirs: tuple[Path, Path, Path]) -> None:
    """The builder graph's features cache after a prefill holds transformers' hidden_states[i] of the head's tapped
    layers, concatenated (fp32: equal to the last bits the two implementations' kernels differ in)."""
    import torch
    from transformers import AutoModelForCausalLM

    m = cpu.manifest
    assert m.head is not None
    ids = cpu.encode(PROMPT)
    model = AutoModelForCausalLM.from_pretrained(head_dirs[2], torch_dtype=torch.float32).eval()
    with torch.no_grad():
        hidden = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    want = torch.cat([hidden[i][0] for i in m.head.taps], dim=-1).numpy()  # [S, F]
    got = _prefill_features(head_dirs[0], ids)
    assert got.shape == want.shape and len(set(m.head.taps)) > 1
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _prefill_features(pack_dir: Path, ids: list[int]) -> np.ndarray:
    """The target's features cache rows [0, len(ids)) after one prefill run of the pack's verify graph."""
    import onnxruntime as ort

    from specpack.contract.manifest import parse_manifest, read_manifest_bytes

    m = parse_manifest(read_manifest_bytes(pack_dir))
    session = ort.InferenceSession(str(pack_dir / m.target.graph.path), providers=["CPUExecutionProvider"])
    dims = {"max_sequence_length": m.max_len, "total_sequence_length": m.max_len, "past_sequence_length": m.max_len,
            "kv_cache_dim": HEAD_DIM, "k": 1, "k_plus_1": 2}
    feeds: dict[str, np.ndarray] = {}
    for spec in session.get_inputs():
        shape = [d if isinstance(d, int) else dims.get(d, 1) for d in spec.shape]
        dtype = np.int64 if "int64" in spec.type else np.float32
        feeds[spec.name] = np.zeros(shape, dtype)
    feeds["input_ids"] = np.asarray([ids], np.int64)
    feeds["attention_mask"] = (np.arange(m.max_len) < len(ids)).astype(np.int64)[None]
    if "position_ids" in feeds:
        feeds["position_ids"] = np.arange(len(ids), dtype=np.int64)[None]
    out = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    return np.asarray(out["target_features"][0, 0, : len(ids)])


@needs_builder
@pytest.mark.parametrize("broken", [False, True], ids=["honest", "tempered-q"])
def test_sampling_with_the_head_on_builder_graphs_has_the_targets_distribution(head_dirs: tuple[Path, Path, Path],
                                                                                broken: bool) -> None:
    """tests/runtime/test_cuda_head.py's chi-square on the builder head pack (the cuda backend's code, CPU EP): the
    head drafting over the builder target's features, against transformers' exact probabilities; the head's q
    tempered (read back, squared, renormalized) must be rejected by the same test."""
    from tests.e2e.test_sampling_distribution import P_FAIL, SAMPLES
    from tests.runtime.test_cuda_head import device_head_pvalue

    dev = device_pack(head_dirs[0], chunked_runs=True)
    try:
        p = device_head_pvalue(dev, head_dirs, broken, n=SAMPLES // 4 if broken else SAMPLES)
    finally:
        dev.close()
    assert (p < P_FAIL) if broken else (p > P_FAIL)
