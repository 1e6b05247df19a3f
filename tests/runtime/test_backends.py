"""The backends through the runtime's interfaces, on tiny packs: the CPU backend gives the reference backend's
tokens (greedy and sampled, same seed, every family of the golden test), for model and deterministic drafts,
on one cache slot or two; the registry refuses what it cannot run, saying what is missing."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pytest
from harness import LookupDrafter, run

import specpack
from specpack import names
from specpack.contract.manifest import Manifest
from specpack.errors import SpecpackError
from specpack.runtime.backend import BACKENDS, BackendOptions, open_backend
from specpack.runtime.state import DecodeState
from specpack.sampling import SamplingParams
from tests.e2e.test_greedy_golden import CASES

SAMPLED = SamplingParams(1.0, top_k=40, top_p=0.95)


def _open(pack_dir: Path, device: str, slots: int = 1):  # -> the backend
    return open_backend(device, pack_dir, Manifest.read(pack_dir), BackendOptions(threads=1, slots=slots))


def _tokens(backend, pack_dir: Path, prompt: list[int], k: int, params: SamplingParams, **kwargs) -> list[int]:
    m = Manifest.read(pack_dir)
    state, _ = run(backend, prompt, 24, k, params=params, seed=7, eos=frozenset(m.eos_token_ids), max_len=m.max_len,
                   k_max=m.k_max, **kwargs)
    return state.out


@pytest.mark.parametrize(("family", "draft", "pair"), CASES, ids=[f"{f}-{d}-{p}" for f, d, p in CASES])
def test_cpu_equals_reference(tiny_pack, family: str, draft: str, pair: dict[str, int]) -> None:
    pack_dir = tiny_pack(family, draft, **pair)[0]
    cpu, ref = _open(pack_dir, "cpu"), _open(pack_dir, "reference")
    vocab = Manifest.read(pack_dir).vocab_size
    for prompt in ([3], np.random.default_rng(1).integers(0, vocab - 8, 30).tolist()):
        for k, params in ((0, SamplingParams()), (3, SamplingParams()), (8, SamplingParams()), (0, SAMPLED),
                          (3, SAMPLED), (8, SAMPLED)):
            assert _tokens(cpu, pack_dir, prompt, k, params) == _tokens(ref, pack_dir, prompt, k, params), (prompt, k)
    cpu.close()


def test_greedy_single_steps_run_two_rows_on_cpu(tiny_pack, monkeypatch: pytest.MonkeyPatch) -> None:
    """A greedy k = 0 step after the prefill verifies the token and a pad draft (two rows), so that it takes the
    multi-row kernels every verify of drafts takes (docs/architecture.md, "One row is never run alone"); the pad
    is kept out of the output and the cache whether it passed or not. Sampled steps run one row."""
    pack_dir = tiny_pack("qwen2", "noisy")[0]
    cpu, ref = _open(pack_dir, "cpu"), _open(pack_dir, "reference")
    graph = cpu.target().engine.graph
    runs: list[tuple[int, int]] = []  # (rows, n_accepted) of every target run
    real_run = graph.run

    def spy(binding, inputs, outputs) -> None:  # type: ignore[no-untyped-def]
        real_run(binding, inputs, outputs)
        runs.append((inputs[names.INPUT_IDS].shape[1], int(outputs[names.N_ACCEPTED][0])))

    monkeypatch.setattr(graph, "run", spy)
    vocab = Manifest.read(pack_dir).vocab_size
    prompts = [[5, 6, 7], [3], *np.random.default_rng(2).integers(0, vocab - 8, (4, 12)).tolist()]
    verdicts = set()
    for prompt in prompts:
        runs.clear()
        assert _tokens(cpu, pack_dir, prompt, 0, SamplingParams()) == _tokens(ref, pack_dir, prompt, 0, SamplingParams())
        # the prefill runs the prompt (a one-token prompt padded too), every later step two rows
        assert runs[0][0] == max(len(prompt), 2) and {rows for rows, _ in runs[1:]} == {2}, runs
        verdicts |= {n for _, n in runs}
    assert verdicts == {0, 1}  # the pad passed at some steps and not at others: both gave the reference's tokens
    runs.clear()
    _tokens(cpu, pack_dir, [5, 6, 7], 0, SAMPLED)
    assert {rows for rows, _ in runs[1:]} == {1}
    cpu.close()


def test_deterministic_proposals_on_cpu_equal_reference(tiny_pack) -> None:
    """q None on the CPU backend: one-hot rows in a buffer of its own (cleared after each verify)."""
    pack_dir = tiny_pack("qwen2", "noisy")[0]
    cpu, ref = _open(pack_dir, "cpu"), _open(pack_dir, "reference")
    greedy_ids = _tokens(cpu, pack_dir, [5, 6], 0, SamplingParams())  # the target alone

    def continuation(state: DecodeState) -> list[int]:  # the greedy output as a lookup: often right, then not
        done = state.length - 2
        return [*greedy_ids[done : done + 2], 7, 7]

    for params in (SamplingParams(), SAMPLED):
        outs = [_tokens(b, pack_dir, [5, 6], 4, params, drafter=LookupDrafter(continuation)) for b in (cpu, ref)]
        assert outs[0] == outs[1]
    assert not cpu.draft_loaded  # no model drafter: the draft session never opened
    assert not any(q.any() for q in cpu.target()._one_hot.values())  # back to all zeros


def test_two_slots_interleaved_on_cpu(tiny_pack) -> None:
    """Two requests on two slots of one CPU backend, run from two threads at once: each as if alone."""
    pack_dir = tiny_pack("qwen2", "noisy")[0]
    alone = _open(pack_dir, "cpu")
    prompts = ([1, 2, 3], [9])
    expected = [_tokens(alone, pack_dir, p, 3, SAMPLED) for p in prompts]
    shared = _open(pack_dir, "cpu", slots=2)
    results: dict[int, list[int]] = {}

    def request(slot: int) -> None:
        for _ in range(3):
            results[slot] = _tokens(shared, pack_dir, prompts[slot], 3, SAMPLED, slot=slot)
            assert results[slot] == expected[slot]

    threads = [threading.Thread(target=request, args=(slot,)) for slot in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [results[0], results[1]] == expected


def test_unknown_device_lists_the_registered_ones(tiny_pack) -> None:
    with pytest.raises(SpecpackError, match=re.escape("expected: cpu | cuda | reference | tensorrt")) as err:
        specpack.load(tiny_pack("qwen2", "noisy")[0], device="gpu")
    assert "'gpu'" in str(err.value) and set(BACKENDS) == {"cpu", "cuda", "reference", "tensorrt"}


def test_cuda_says_what_is_missing(tiny_pack) -> None:
    import onnxruntime as ort

    with pytest.raises(SpecpackError) as err:
        specpack.load(tiny_pack("qwen2", "noisy")[0], device="cuda")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert "static KV cache" in str(err.value)  # this pack is concat-style
    else:
        assert "CUDAExecutionProvider" in str(err.value) and "onnxruntime-gpu" in str(err.value)


def test_a_bf16_pack_is_refused_on_the_cpu_with_its_reason(tiny_pack) -> None:
    """ONNX Runtime's CPU EP has no bf16 kernels: the cpu backend says so before it opens a session (it failed with
    ONNX Runtime's NOT_IMPLEMENTED and a hint to run `specpack verify`, as if the graph were corrupt)."""
    pack_dir = tiny_pack("qwen2")[0]
    m = Manifest.read(pack_dir)
    bf16 = m.model_copy(update={"target": m.target.model_copy(update={"dtype": "bf16"})})
    with pytest.raises(SpecpackError, match="this bf16 pack cannot run on the CPU") as err:
        open_backend("cpu", pack_dir, bf16, BackendOptions())
    assert "bf16 target graphs" in str(err.value) and "--device cuda" in str(err.value)
    assert "specpack verify" not in str(err.value)


@pytest.mark.parametrize("attention", ["standard", "gqa"])
def test_a_static_pack_runs_on_the_reference_device(trt_pack: Path, tiny_pack, attention: str) -> None:
    """The issue's finding: a legitimate static-cache pack failed on --device reference with a raw ScatterND error."""
    pack = trt_pack if attention == "standard" else \
        tiny_pack("qwen2", "noisy", kv_cache="static", attention="gqa", head_dim=16)[0]  # test_cuda_backend's
    ref, cpu = specpack.load(pack, device="reference", threads=1), specpack.load(pack, threads=1)
    for k, sampling in ((0, {}), (3, {}), (2, {"temperature": 0.8, "seed": 3})):
        assert ref.generate("def add(a, b):", 10, k=k, **sampling).tokens == \
            cpu.generate("def add(a, b):", 10, k=k, **sampling).tokens, (k, sampling)


def test_adaptive_k_pools_acceptance_over_requests_but_not_for_seeded_sampling(tiny_pack) -> None:
    """Pack.policy: every adaptive chain policy of one drafter shrinks toward one PackAcceptance, kept across requests;
    a seeded sampling request's policy does not (its tokens must follow its seed alone, not the requests before it)."""
    from specpack.runtime.adaptive_k import AdaptiveK
    from specpack.sampling import SamplingParams

    with specpack.load(tiny_pack("qwen2", "small")[0]) as pack:
        greedy, sampled = SamplingParams(), SamplingParams(temperature=0.8)
        first, second = (pack.policy(None, "model", greedy, None) for _ in range(2))
        unseeded, seeded = pack.policy(None, "model", sampled, None), pack.policy(None, "model", sampled, 7)
        assert all(isinstance(p, AdaptiveK) for p in (first, second, unseeded, seeded))
        pooled = first.acceptance.pack  # type: ignore[attr-defined]
        assert pooled is not None and second.acceptance.pack is pooled  # type: ignore[attr-defined]
        assert unseeded.acceptance.pack is pooled  # type: ignore[attr-defined]
        assert seeded.acceptance.pack is None  # type: ignore[attr-defined]
        assert pack.policy(None, "ngram", greedy, None).acceptance.pack not in (None, pooled)  # type: ignore[attr-defined]
