"""The draft head on the cuda backend's code, run on the CPU EP (device="cpu"): a head pack of the static form
(`spec-export --kv-cache static --draft-head HEAD`), whose verify writes its features into a cache in place and
whose head reads that cache (docs/heads.md, "The static form"). The CUDA run itself is tests/gpu/ (marked `gpu`).

Greedy: the target alone's tokens, and the cpu backend's, at every k, adaptive k, long prompts, captured-chunk runs.
Sampling: the same tokens as the cpu backend for the same seed, and the chi-square of test_sampling_distribution.py
with the device head drafting; the same test with the device head's q misreported (tempered) must reject.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import specpack
from specpack.runtime.device_buffers import DeviceArray, DeviceView
from specpack.runtime.drafter import HeadDrafter
from specpack.runtime.pack import Pack
from specpack.runtime.state import DecodeState
from specpack.sampling import SamplingParams
from tests.e2e.test_sampling_distribution import P_FAIL, SAMPLES, TargetLogits, draw_samples, partitions, pvalue
from tests.mutations import TemperedQ
from tests.runtime.test_cuda_backend import device_pack

PROMPT = "def add(a, b):"
CASE = (SamplingParams(1.0), 3)


@pytest.fixture(scope="module")
def head_dirs(tiny_head_pack: Callable[..., tuple[Path, Path, Path]]) -> tuple[Path, Path, Path]:
    return tiny_head_pack("qwen2", kv_cache="static")


@pytest.fixture(scope="module")
def cpu(head_dirs: tuple[Path, Path, Path]) -> Iterator[Pack]:
    loaded = specpack.load(head_dirs[0], threads=1)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def dev(head_dirs: tuple[Path, Path, Path]) -> Iterator[Pack]:
    loaded = device_pack(head_dirs[0], chunked_runs=True)
    yield loaded
    loaded.close()


def test_the_static_form_reads_the_features_cache(cpu: Pack) -> None:
    m = cpu.manifest
    assert m.head is not None and m.head.graph.kv_cache == "static" and m.target.graph.kv_cache == "static"
    assert {s.name for s in m.target.graph.inputs} >= {"past_target_features"}
    assert {s.name for s in m.head.graph.inputs} >= {"attention_mask", "features"}


def head_greedy_accepted(cpu: Pack, dev: Pack) -> int:
    """Greedy through the head at k 1, 2, k_max and adaptive, on both packs, equals the target alone on `cpu` for
    three prompts (one a catch-up past k_max + 1 rows); returns the drafts accepted in all."""
    rng = np.random.default_rng(5)
    long_prompt = rng.integers(0, cpu.manifest.vocab_size - 8, 45).tolist()
    accepted = 0
    for prompt in (PROMPT, [5], long_prompt):
        want = cpu.generate(prompt, 32, k=0).tokens
        for k in (1, 2, cpu.manifest.k_max, None):
            for pack in (cpu, dev):
                got = pack.generate(prompt, 32, k=k, drafter="head")
                assert got.tokens == want, (pack.backend.name, prompt, k)
                accepted += got.stats["accepted"]
    return accepted


def test_greedy_equals_the_target_alone_on_both_backends(cpu: Pack, dev: Pack) -> None:
    assert head_greedy_accepted(cpu, dev) > 0  # the head's drafts pass sometimes: the accept path ran
    from specpack.runtime.backends.cuda import LONG_CHUNK

    head = dev.backend.draft().engine  # type: ignore[attr-defined]
    keys = set(head.slots[0].bindings)  # (C, W, current): captured shapes only, C <= k_max + 1 or a LONG_CHUNK chunk
    assert keys and all((c <= cpu.manifest.k_max + 1 or c == LONG_CHUNK) and w in (0, 1) for c, w, _ in keys), keys
    assert any(c == LONG_CHUNK for c, _, _ in keys)  # the 45-token prompt's catch-up went as captured chunks


def test_chunked_catch_ups_write_what_one_run_writes(head_dirs: tuple[Path, Path, Path], dev: Pack) -> None:
    """The head's catch-up over a 45-token prompt as captured chunks (LONG_CHUNK, then k_max + 1 and the rest) writes
    the head's cache rows one uncaptured run writes (greedy identity alone would hold whatever the head computed)."""
    prompt = np.random.default_rng(6).integers(0, dev.manifest.vocab_size - 8, 45).tolist()
    one_run = device_pack(head_dirs[0], chunked_runs=False)
    try:
        caches = []
        for pack in (dev, one_run):
            assert pack.generate(prompt, 4, k=2).stats["proposed"] > 0  # the first proposal caught up on the prompt
            cache = pack.backend.draft().engine.slots[0].cache  # type: ignore[attr-defined]
            caches.append([buffer.read()[:, :, : len(prompt)] for buffer in cache._buffers])  # [1, kvh, 45, D] each
        for chunked, whole in zip(*caches, strict=True):
            assert chunked.any()
            np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-5)
    finally:
        one_run.close()


def test_sampled_tokens_equal_the_cpu_backend(cpu: Pack, dev: Pack) -> None:
    for params in ({"temperature": 1.0, "seed": 3}, {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "seed": 11}):
        for k in (2, 4):
            want = cpu.generate(PROMPT, 24, k=k, **params)
            got = dev.generate(PROMPT, 24, k=k, **params)
            assert got.tokens == want.tokens, (params, k)


class TemperedDeviceQ(TemperedQ):
    """tests/mutations.py's TemperedQ over a device head: its q read back from the device, tempered, and copied into a
    device buffer of its own."""

    def __init__(self, real: Any, k_max: int, vocab: int) -> None:
        """real: the backend's Draft over a DeviceHead (its slots' q buffers are read back)."""
        super().__init__(real)
        self.device_q = DeviceArray((1, k_max, vocab), np.float32, real.engine.device)
        self.host = np.zeros((1, k_max, vocab), np.float32)

    def q(self, state: DecodeState, k: int) -> DeviceView:
        q = self.real.engine.slots[state.slot].q.read()[:, :k]  # [1, k, V], read back from the device
        self.host[:, :k] = self.tempered(q)
        self.device_q.write(self.host)
        return self.device_q.view((1, k, self.host.shape[2]))


def device_head_pvalue(dev: Pack, head_dirs: tuple[Path, Path, Path], broken: bool, n: int = SAMPLES) -> float:
    """The chi-square p of samples drafted by the pack's head on its device (broken: its q tempered)."""
    params, k = CASE
    part = partitions(TargetLogits(head_dirs[2], dev.encode(PROMPT)), dev.eos_ids)(params, k + 2)
    m = dev.manifest
    drafter: Any = (HeadDrafter(lambda: TemperedDeviceQ(dev.backend.draft(), m.k_max, m.vocab_size)) if broken
                    else dev.drafters["head"])
    samples = draw_samples(dev, drafter, dev.encode(PROMPT), params, k, 7 + k, n=n, decided=part.decided)
    p = pvalue(part, samples)
    print(f"device head {'tempered q' if broken else 'honest'} k={k}: alpha={samples.alpha:.3f} p={p:.4g}")
    assert samples.accepted > n // 50  # acceptances happen: the accept path is tested
    return p


def test_sampling_with_the_device_head_has_the_targets_distribution(dev: Pack, head_dirs: tuple[Path, Path, Path]
                                                                     ) -> None:
    assert device_head_pvalue(dev, head_dirs, broken=False) > P_FAIL


def test_a_misreported_device_head_q_is_rejected(dev: Pack, head_dirs: tuple[Path, Path, Path]) -> None:
    assert device_head_pvalue(dev, head_dirs, broken=True, n=SAMPLES // 4) < P_FAIL  # measured p = 0 at 2,000


def test_a_concat_head_pack_is_refused_by_the_cuda_backend(tiny_head_pack: Callable[..., tuple[Path, Path, Path]]
                                                          ) -> None:
    with pytest.raises(specpack.SpecpackError, match="static form"):
        device_pack(tiny_head_pack("qwen2")[0])


def test_step_costs_time_the_heads_drafted_row(cpu: Pack, dev: Pack) -> None:
    """specpack.bench's step costs on a head pack (both engines): the timed draft step is a drafted row (W = 1)."""
    from specpack.bench.timing import measure_step_costs

    for pack in (cpu, dev):
        costs = measure_step_costs(pack, [1, 2], 40, pack.encode(PROMPT), reps=2, warmup=1).to_dict()
        assert costs["draft_step_ms"] > 0 and costs["target_step_ms"] > 0 and costs["c"] > 0, costs
