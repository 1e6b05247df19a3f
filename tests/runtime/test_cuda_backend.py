"""The cuda backend's code on the CPU EP (device="cpu"): device buffers bound by pointer, the device static
cache, the greedy form of the graphs, per-shape bindings made once. Same tokens as the cpu backend, greedy and
sampled (same seed), through prefills, long prompts, every k, deterministic proposals and two slots.
The CUDA run itself (CUDA EP, captured graphs) is tests/gpu/, marked `gpu`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import specpack
from specpack.contract.manifest import Manifest
from specpack.errors import SpecpackError
from specpack.runtime.backend import BackendOptions
from specpack.runtime.backends.cuda import CudaBackend
from specpack.runtime.pack import Pack
from specpack.runtime.tokenizer import PackTokenizer
from specpack.sampling import SamplingParams


def device_pack(pack_dir: Path, slots: int = 1, chunked_runs: bool = False, pad_single_steps: bool = True,
                precapture: bool = False, threads: int | None = None) -> Pack:
    manifest = Manifest.read(pack_dir)
    backend = CudaBackend(pack_dir, manifest, BackendOptions(slots=slots, pad_single_steps=pad_single_steps,
                                                             threads=threads),
                          device="cpu", chunked_runs=chunked_runs, precapture=precapture)
    return Pack(pack_dir, manifest, PackTokenizer.load(pack_dir / "tokenizer"), backend)


@pytest.fixture(scope="module")
def static_pack(tiny_pack) -> Path:
    return tiny_pack("qwen2", "noisy", kv_cache="static", attention="gqa", head_dim=16)[0]


def test_greedy_and_sampled_tokens_equal_the_cpu_backend(static_pack: Path) -> None:
    cpu, dev = specpack.load(static_pack), device_pack(static_pack)
    long_ids = np.random.default_rng(2).integers(0, cpu.tokenizer.vocab_size - 8, 60).tolist()  # > k_max + 1
    for prompt in ["def add(a, b):", [5], long_ids]:
        for k in (0, 1, 3, 8):
            assert dev.generate(prompt, 24, k=k).tokens == cpu.generate(prompt, 24, k=k).tokens, (prompt, k)
        sampled = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 7}
        assert dev.generate(prompt, 24, k=4, **sampled).tokens == cpu.generate(prompt, 24, k=4, **sampled).tokens
    assert dev.backend.target().engine._sessions.keys() == {True, False}  # type: ignore[attr-defined]


def test_plain_sampling_runs_on_the_plain_form_with_the_cpu_backends_tokens(static_pack: Path) -> None:
    """Temperature-only requests (top_k 0 or >= V, top_p 1) on the plain sampling form (graphs/sampling_form.py),
    bound once per run shape as captured runs are (a draft binding per q row, a verify binding per (k, q buffer)):
    the cpu backend's tokens for the same seeds, model drafts and n-gram ones (a one-hot q in the scratch buffer);
    a request that filters still runs on the graph as exported."""
    cpu, dev = specpack.load(static_pack), device_pack(static_pack)
    vocab = dev.manifest.vocab_size
    for prompt in ["def add(a, b):", [5, 9, 5, 9, 5, 9, 5]]:
        for k, drafter in ((4, "model"), (8, "model"), (3, "ngram"), (None, "model")):
            for seed, extra in ((7, {}), (8, {"top_k": vocab}), (9, {"top_p": 1.0})):
                sampled = {"temperature": 0.9, "seed": seed, "drafter": drafter, **extra}
                want = cpu.generate(prompt, 24, k=k, **sampled).tokens  # type: ignore[arg-type]
                assert dev.generate(prompt, 24, k=k, **sampled).tokens == want, (prompt, k, drafter, seed)  # type: ignore[arg-type]
    target, draft = dev.backend.target().engine, dev.backend.draft().engine  # type: ignore[attr-defined]
    assert target._sessions.keys() == {True, "plain"} and draft._sessions.keys() == {"plain"}  # the draft: on first use
    assert target.plain_error is None and draft.plain_error is None
    plain_keys = [key for key in target.slots[0].bindings if key[1]]  # (greedy, plain, S, k, q buffer)
    assert plain_keys and all(len(key) == 5 for key in plain_keys)
    rows = {key[3] for key in draft.slots[0].bindings if key[1]}  # (greedy, plain, S, q row)
    assert len(rows) > 1, rows  # a binding per q row
    filtered = {"temperature": 0.9, "top_p": 0.8, "seed": 3}
    want = cpu.generate("def add(a, b):", 16, k=4, **filtered).tokens  # type: ignore[arg-type]
    assert dev.generate("def add(a, b):", 16, k=4, **filtered).tokens == want  # type: ignore[arg-type]
    assert False in target._sessions


def test_chunked_runs_give_the_same_tokens(static_pack: Path) -> None:
    """Prefills and the draft's catch-ups after k = 0 steps as chunks of LONG_CHUNK and k_max + 1 tokens (as
    captured on a GPU): the same tokens as one run, greedy, fixed and adaptive k; only those two run shapes (and
    the shorter rest) are bound, whatever the length."""
    from specpack.runtime.backends.cuda import LONG_CHUNK

    cpu, dev = specpack.load(static_pack), device_pack(static_pack, chunked_runs=True)
    rng = np.random.default_rng(3)
    for length in (30, LONG_CHUNK, LONG_CHUNK + 1, 9 * 16 + 5):  # short chunks only; one long; long + rest; both
        prompt = rng.integers(0, cpu.tokenizer.vocab_size - 8, length).tolist()
        for k in (0, 3, 8, None):
            assert dev.generate(prompt, 40, k=k).tokens == cpu.generate(prompt, 40, k=k).tokens, (length, k)
    for model in (dev.backend.target().engine, dev.backend.draft().engine):  # type: ignore[attr-defined]
        shapes = {key[2] for key in model.slots[0].bindings}  # (greedy, plain, S, ...)
        assert LONG_CHUNK in shapes and shapes - {LONG_CHUNK} <= set(range(1, dev.manifest.k_max + 2)), shapes


def test_bindings_are_made_once_per_run_shape(static_pack: Path) -> None:
    dev = device_pack(static_pack)
    dev.generate("def add(a, b):", 20, k=4)
    target = dev.backend.target().engine  # type: ignore[attr-defined]
    first = dict(target.slots[0].bindings)
    dev.generate("Hello there", 20, k=4)
    assert {key: id(b) for key, b in target.slots[0].bindings.items() if key in first} == \
           {key: id(b) for key, b in first.items()}
    assert all(key[0] is True and key[1] <= dev.manifest.k_max + 1 for key in first)


def test_greedy_single_steps_run_two_rows(static_pack: Path) -> None:
    """After the prefill a greedy k = 0 step runs the verify's k = 1 shape (the token and a pad draft), as on the
    cpu backend (docs/architecture.md, "One row is never run alone"); the same tokens either way here, and one
    row alone with pad_single_steps off."""
    padded, alone = device_pack(static_pack), device_pack(static_pack, pad_single_steps=False)
    for prompt in ("def add(a, b):", [5]):
        assert padded.generate(prompt, 24, k=0).tokens == alone.generate(prompt, 24, k=0).tokens
    shapes = {key[2:] for key in padded.backend.target().engine.slots[0].bindings}  # type: ignore[attr-defined]
    assert (2, 1) in shapes and (1, 0) not in shapes, shapes  # (rows, k): never one row, even the 1-token prefill
    shapes = {key[2:] for key in alone.backend.target().engine.slots[0].bindings}  # type: ignore[attr-defined]
    assert (1, 0) in shapes and (2, 1) not in shapes, shapes


def test_deterministic_proposals_and_two_slots(static_pack: Path) -> None:
    from specpack.runtime.k_policy import FixedK
    from specpack.runtime.loop import decode
    from specpack.runtime.state import DecodeState, Proposal
    from specpack.runtime.stats import DecodeStats
    from specpack.sampling import SamplingParams, Uniforms

    cpu, dev = specpack.load(static_pack), device_pack(static_pack, slots=2)
    m = dev.manifest

    class Repeat:  # proposes the last committed token k times, q None (one-hot)
        def begin(self, state: DecodeState) -> None: ...

        def propose(self, state: DecodeState, k: int) -> Proposal:
            state.ids[state.length : state.length + k] = state.ids[state.length - 1]
            return Proposal(tokens=state.ids[state.length : state.length + k], q=None)

        def commit(self, state: DecodeState) -> None: ...

    def run(pack: Pack, slot: int, params: SamplingParams) -> list[int]:
        ids = pack.encode("def f(x):")
        state = DecodeState.start(ids, 20, params, Uniforms(params, m.k_max, seed=3), eos_ids=pack.eos_ids,
                                  max_len=m.max_len, k_max=m.k_max, stats=DecodeStats(k=3), slot=slot)
        decode(state, pack.backend.target(), Repeat(), FixedK(3))
        return state.out

    for params in (SamplingParams(), SamplingParams(temperature=0.9)):
        want = run(cpu, 0, params)
        assert run(dev, 1, params) == want and run(dev, 0, params) == want


def test_refuses_fp32_gqa_graphs_on_cuda(static_pack: Path) -> None:
    """ONNX Runtime's CUDA EP runs an fp32 GroupQueryAttention graph with copies of the cache (docs/cuda_backend.md)."""
    with pytest.raises(SpecpackError, match="fp32 GroupQueryAttention"):
        CudaBackend(static_pack, Manifest.read(static_pack), BackendOptions(), device="cuda")


def test_refuses_concat_packs(tiny_pack) -> None:
    pack_dir = tiny_pack("qwen2", "noisy")[0]
    with pytest.raises(SpecpackError, match="static KV cache"):
        CudaBackend(pack_dir, Manifest.read(pack_dir), BackendOptions(), device="cpu")


def test_a_pinned_load_opens_every_graph_from_verified_bytes(static_pack: Path, tmp_path: Path) -> None:
    """BackendOptions.verified_reads: both graphs (greedy forms) open at load from the bytes hashed; a weight file
    that no longer matches the manifest is refused, never opened."""
    import shutil

    manifest = Manifest.read(static_pack)
    pinned = CudaBackend(static_pack, manifest, BackendOptions(verified_reads=True), device="cpu")
    assert pinned.draft_loaded
    pinned.close()
    copy = Path(shutil.copytree(static_pack, tmp_path / "pack"))
    weights = copy / manifest.draft.graph.data_files[0]
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(SpecpackError, match="does not match the pinned manifest"):
        CudaBackend(copy, manifest, BackendOptions(verified_reads=True), device="cpu")


def test_the_plain_sampling_forms_read_no_host_value_as_data(static_pack: Path) -> None:
    """The plain sampling form of each model (what a temperature-only request runs, captured on a GPU) keeps shape
    values out of its data, as the greedy form does: a Memcpy node would refuse its capture (tests/graphs/host_values.py)."""
    import onnx

    from specpack.graphs.greedy_form import greedy_form
    from specpack.graphs.sampling_form import plain_sampling_form
    from tests.graphs.host_values import host_values_in_data

    for name in ("verify.onnx", "draft_step.onnx"):
        path = static_pack / name
        assert host_values_in_data(onnx.load_from_string(greedy_form(path))) == [], name  # the baseline it matches
        assert host_values_in_data(onnx.load_from_string(plain_sampling_form(path))) == [], name


@pytest.mark.parametrize("one_binding_for_every_row", [False, True], ids=["plain-form", "q-rows-share-a-binding"])
def test_plain_sampling_keeps_the_targets_distribution(tiny_pack, monkeypatch: pytest.MonkeyPatch,
                                                       one_binding_for_every_row: bool) -> None:
    """The chi-square of tests/e2e/test_sampling_distribution.py against exact probabilities, through the cuda
    backend's plain sampling form (temperature 0.4, k 3, the model's drafts), bound once per run shape as on a GPU; its
    planted defect: the draft's plain runs keyed without their q row, so one binding (its q output row 0's view) serves
    every draft of a step and the verify reads stale q rows: it fails the same test."""
    from specpack.runtime.backends.cuda import DeviceDraft
    from tests.distribution import chi_square_pvalue
    from tests.e2e.test_sampling_distribution import P_FAIL, TargetLogits, draw_samples, partitions

    pack_dir, _, target_dir = tiny_pack("qwen2", "noisy", kv_cache="static", attention="gqa", head_dim=16)
    if one_binding_for_every_row:
        real_run = DeviceDraft._run

        def keyless(self, state, end, key, inputs, outputs, chunks=True):  # type: ignore[no-untyped-def]
            plain = self.slots[state.slot].plain
            return real_run(self, state, end, () if plain else key, inputs, outputs, chunks)

        monkeypatch.setattr(DeviceDraft, "_run", keyless)
    dev = device_pack(pack_dir)
    params, k, n = SamplingParams(0.4), 3, 1_000  # peaked: bins reach past the first token
    prompt = dev.encode("def add(a, b):")
    part = partitions(TargetLogits(target_dir, prompt), dev.eos_ids)(params, k + 2, n)
    samples = draw_samples(dev, dev.drafter, prompt, params, k, seed=17, n=n, decided=part.decided)
    p = chi_square_pvalue([part.bin_of(s) for s in samples.continuations], part.probs)
    draft = dev.backend.draft().engine  # type: ignore[attr-defined]
    print(f"cuda backend (CPU EP), plain form, one binding for every q row {one_binding_for_every_row}: "
          f"alpha {samples.alpha:.3f}, p = {p:.3g}")
    assert "plain" in draft._sessions and draft.plain_error is None
    if one_binding_for_every_row:
        assert p < P_FAIL
    else:
        assert p > P_FAIL
