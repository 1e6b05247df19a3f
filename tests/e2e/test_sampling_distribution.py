"""Speculative sampling through the real ONNX graphs of a tiny pack has the target's exact distribution.

The pack is the qwen2 tiny pair with the "noisy" draft (a perturbed copy of the target: it agrees often,
not always), vocabulary 330. For each setting, SAMPLES continuations are drawn with one Philox generator
(fixed seed) through the pack's own engines, and a chi-square compares their counts with exact
probabilities computed from the target's transformers model (torch, fp32) and the oracle's transform.

Each generation asks for k + 2 tokens, so that the first speculative step verifies all k drafts (the loop
caps k at the tokens still allowed: with max_new_tokens = 3, k = 3 and k = 6 would both run as k = 1).
The tiny target's distributions are flat (hundreds of plausible next tokens), so the bins are an
`ExactPartition` (tests/distribution.py): frequent prefixes get bins of their own, rare next tokens are
pooled by rank quantile, and every bin's probability is exact. A generation stops as soon as its tokens
fix its bin: where the distribution is flat that is after 2-3 tokens, where it is sharp (temperature 0.5,
top-k 5) deeper drafts are tested too.

The n-gram drafter (a deterministic proposal: q one-hot on each draft) goes through the same test with
adaptive k, on a prompt built so that it proposes something at nearly every step (the tiny target's text
repeats nothing by itself): a body B (the prompt and 160 greedy tokens), preceded, for each of the target's
3 likeliest next tokens a, by the last 3 tokens of B, a and the greedy continuation of B + a. The tiny
target's distributions are flat, so most of these drafts are rejected (alpha ~0.006): the test checks
mostly the rejection path (draw from p without the drafted token) through the real verify graph; the
reference backend's test (tests/runtime/test_sampling_reference.py) has a sharper target and thousands of
acceptances.

A deliberately broken draft (q taken before the transform, transformers #32867 / #47932) fails the same
test with the same seed; the same wrapper made honest gives bit-identical q and tokens. For the n-gram drafter,
deterministic drafts whose q is one-hot on another token (the one-hot rows misplaced) fail its test.

Power (docs/testing.md). `make test` draws SAMPLES = 2,000 generations per setting; the slow set repeats the grid
at SLOW_SAMPLES = 10,000. At 2,000 the bins (20-117 per setting) detect an effect of Cohen's w >= 0.17-0.23 with
99 % power at P_FAIL; the broken q of test_catches_q_taken_before_the_transform is rejected there at p = 9e-23
(T 0.5) and 4e-100 (top-k 5), measured 2026-11-27: an effect far above what the test resolves. Each generation
through ONNX Runtime costs ~1.5 ms (calls on these tiny graphs are overhead, not arithmetic).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

import specpack
from specpack.errors import SpecpackError
from specpack.graphs import oracle
from specpack.limits import numpy_dtype
from specpack.runtime.adaptive_k import AdaptiveK, PriorCosts
from specpack.runtime.backend import DraftModel, TargetModel
from specpack.runtime.backends.cpu import OrtDraft
from specpack.runtime.drafter import Drafter, ModelDrafter
from specpack.runtime.k_policy import FixedK, KPolicy
from specpack.runtime.kv_cache import ConcatKVCache
from specpack.runtime.loop import decode
from specpack.runtime.ngram_drafter import NgramConfig, NgramDrafter
from specpack.runtime.ort_session import OrtGraph
from specpack.runtime.pack import Pack
from specpack.runtime.state import DecodeState, Proposal, VerifyResult
from specpack.runtime.stats import DecodeStats
from specpack.runtime.target import Draft
from specpack.sampling import SamplingParams, Uniforms
from tests.distribution import (
    Continuation,
    ExactPartition,
    RankBin,
    chi_square_pvalue,
    exact_continuations,
    transformed_next_probs,
)

FAMILY, DRAFT = "qwen2", "noisy"
PROMPT = "def add(a, b):"
SAMPLES = 2_000  # `make test`
SLOW_SAMPLES = 10_000  # the slow set: the same grid, about 2.2x the resolution (w scales as 1 / sqrt(n))
SIZES = [SAMPLES, pytest.param(SLOW_SAMPLES, marks=pytest.mark.slow)]
P_FAIL = 1e-3
SETTINGS = [SamplingParams(0.5), SamplingParams(1.0), SamplingParams(1.5), SamplingParams(1.0, top_k=5),
            SamplingParams(1.0, top_p=0.8)]
KS = [1, 3, 6]
RAW = SamplingParams(1.0)  # no transform: q = softmax(raw draft logits)


PartitionFor = Callable[..., ExactPartition]  # (params, length, n=SAMPLES) -> exact bins for n samples


def _id(params: SamplingParams) -> str:
    return f"T{params.temperature:g}-topk{params.top_k}-topp{params.top_p:g}"


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def pack_dirs(tiny_pack: Callable[..., tuple[Path, Path, Path]]) -> tuple[Path, Path, Path]:
    return tiny_pack(FAMILY, DRAFT)


@pytest.fixture(scope="module")
def pack(pack_dirs: tuple[Path, Path, Path]) -> Iterator[Pack]:
    """One thread per session: on tiny graphs a second thread costs more in synchronisation than it saves."""
    loaded = specpack.load(pack_dirs[0], threads=1)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def prompt_ids(pack: Pack) -> list[int]:
    return pack.encode(PROMPT)


@pytest.fixture(scope="module")
def target_logits(pack_dirs: tuple[Path, Path, Path], prompt_ids: list[int]) -> TargetLogits:
    return TargetLogits(pack_dirs[2], prompt_ids)


@pytest.fixture(scope="module")
def exact(target_logits: TargetLogits, pack: Pack) -> PartitionFor:
    return partitions(target_logits, pack.eos_ids)


def partitions(target_logits: TargetLogits, eos_ids: frozenset[int]) -> PartitionFor:
    """Exact partitions for n samples, built once per (params, length, n) and shared by the tests."""

    @cache
    def partition(params: SamplingParams, length: int, n: int = SAMPLES) -> ExactPartition:
        def next_probs(prefixes: list[Continuation]) -> np.ndarray:
            return oracle.transform(target_logits(prefixes), params)  # [N, V]

        return ExactPartition.build(next_probs, length, eos_ids, n)

    return partition


# ----------------------------------------------------------------------------------------------- helpers


class TargetLogits:
    """Raw next-token logits of the target after prompt + prefix: transformers, fp32, batched and cached."""

    def __init__(self, model_dir: Path, prompt: list[int], batch: int = 1024) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.prompt, self.batch = prompt, batch
        self.cache: dict[Continuation, np.ndarray] = {}

    def __call__(self, prefixes: list[Continuation]) -> np.ndarray:
        """[N] continuations so far -> [N, V] fp32 logits of the next token."""
        todo = sorted({s for s in prefixes if s not in self.cache}, key=lambda s: (len(s), s))
        for length in sorted({len(s) for s in todo}):
            same = [s for s in todo if len(s) == length]  # equal lengths: no padding, no mask
            for i in range(0, len(same), self.batch):
                chunk = same[i : i + self.batch]
                ids = self.torch.tensor([[*self.prompt, *s] for s in chunk])  # [B, S]
                with self.torch.inference_mode():
                    logits = self.model(input_ids=ids, logits_to_keep=1).logits[:, -1].float().numpy()  # [B, V]
                self.cache.update(zip(chunk, logits, strict=True))
        return np.stack([self.cache[s] for s in prefixes])


class ShadowDraft:
    """The pack's draft model, then a second session of the same draft graph (same ids, its own cache and
    sampling inputs) whose q overwrites the one the real draft step wrote into the q buffer the verify reads.

    With `q_params` = RAW this is the canonical bug: the token is drawn from the transformed distribution,
    but the q the verify graph divides by is softmax(raw logits), taken before the transform (as in
    transformers #32867 / #47932); under top-k / top-p it even puts mass outside the kept set. With
    `q_params` equal to the request's params it is an honest control: the shadow's q must be bit-identical
    to the real one (checked on every step), so a failure of the broken variant is the bug's, not the
    wrapper's.
    """

    def __init__(self, pack: Pack, q_params: SamplingParams) -> None:
        m, entry = pack.manifest, pack.manifest.draft
        self.real: DraftModel = pack.backend.draft()
        self.max_q_diff, self.q_inputs = 0.0, q_params.graph_inputs()
        cache = ConcatKVCache(entry.num_layers, entry.kv_heads, entry.head_dim, m.max_len + m.k_max + 1,
                              numpy_dtype(entry.dtype))
        self.shadow = Draft(OrtDraft(OrtGraph(pack.path / entry.graph.path, threads=1), [cache],
                                     pack.backend.constants, m.k_max, m.vocab_size))  # type: ignore[attr-defined]

    def reset(self, state: DecodeState) -> None:
        self.real.reset(state)
        self.shadow.reset(state)

    def step(self, state: DecodeState, end: int, row: int) -> int:
        token = self.real.step(state, end, row)
        self.shadow.step(dataclasses.replace(state, sampling_inputs=self.q_inputs), end, row)  # same ids, q params
        q_real, q_shadow = self.real.q(state, row + 1)[0, row], self.shadow.q(state, row + 1)[0, row]
        self.max_q_diff = max(self.max_q_diff, float(np.abs(q_real - q_shadow).max()))
        q_real[:] = q_shadow
        return token

    def q(self, state: DecodeState, k: int) -> Any:
        return self.real.q(state, k)

    def rollback(self, state: DecodeState, length: int) -> None:
        self.real.rollback(state, length)
        self.shadow.rollback(state, length)

    def close(self) -> None:
        self.shadow.engine.graph.close()


def drafter_over(model: DraftModel) -> ModelDrafter:
    """The model drafter over a given draft model (a wrapper) instead of the pack's."""
    return ModelDrafter(lambda: model)


class RecordingTarget:
    """The pack's target model, recording (k, n_accepted) of every verify."""

    def __init__(self, real: TargetModel) -> None:
        self.real, self.calls = real, list[tuple[int, int]]()

    def reset(self, state: DecodeState) -> None:
        self.real.reset(state)

    def verify(self, state: DecodeState, proposal: Proposal) -> VerifyResult:
        result = self.real.verify(state, proposal)
        self.calls.append((proposal.k, result.n_accepted))
        return result

    def rollback(self, state: DecodeState, length: int) -> None:
        self.real.rollback(state, length)


@dataclasses.dataclass
class Samples:
    continuations: list[Continuation]
    proposed: int
    accepted: int

    @property
    def alpha(self) -> float:
        return self.accepted / self.proposed


class _Decided(Exception):
    """Raised from on_tokens to end a generation whose bin is already fixed."""


def draw_samples(pack: Pack, drafter: Drafter, prompt: list[int], params: SamplingParams, k: int, seed: int,
                 n: int = SAMPLES, decided: Callable[[Continuation], bool] | None = None,
                 policy: Callable[[], KPolicy] | None = None) -> Samples:
    """n generations of k + 2 tokens (the first step verifies all k drafts), one Philox generator across them;
    `policy` makes each generation's k policy (default: FixedK(k)).

    A generation ends early at an eos, or once `decided` says its tokens so far fix its bin: the tokens
    after that cannot change the chi-square, and skipping them halves the cost where distributions are flat.
    """
    m, rng = pack.manifest, np.random.Generator(np.random.Philox(seed))
    out: list[Continuation] = []
    tokens: list[int] = []  # the current generation's

    def on_tokens(new: list[int]) -> None:
        tokens.extend(new)
        if decided is not None and decided(tuple(tokens)):
            raise _Decided

    with pack.exclusive() as backend:
        target = RecordingTarget(backend.target())
        for _ in range(n):
            tokens.clear()
            state = DecodeState.start(prompt, k + 2, params, Uniforms(params, m.k_max, generator=rng),
                                      eos_ids=pack.eos_ids, max_len=m.max_len, k_max=m.k_max, stats=DecodeStats(k=k))
            with contextlib.suppress(_Decided):
                decode(state, target, drafter, FixedK(k) if policy is None else policy(), on_tokens)
            out.append(tuple(tokens))
    return Samples(out, sum(k_step for k_step, _ in target.calls), sum(acc for _, acc in target.calls))


def pvalue(part: ExactPartition, samples: Samples) -> float:
    return chi_square_pvalue([part.bin_of(s) for s in samples.continuations], part.probs)


def _seed(params: SamplingParams, k: int) -> int:
    return 1000 * SETTINGS.index(params) + k


# ------------------------------------------------------------------------------------------------- tests


def test_partitions_have_power(exact: PartitionFor) -> None:
    """The exact partitions are not degenerate: enough bins with >= 5 expected samples, and most of the mass
    is in bins decided by the speculative tokens (depth >= 2), not by the first token (the target's prefill)."""
    for params in SETTINGS:
        for k in KS:
            part = exact(params, k + 2)
            assert abs(sum(part.probs.values()) - 1.0) < 1e-9
            assert sum(SAMPLES * p >= 5 for p in part.probs.values()) >= 10, (params, k)  # the smaller size
            assert sum(p for b, p in part.probs.items() if _depth(b) >= 2) > 0.5, (params, k)


def _depth(b: object) -> int:
    """The position a bin is decided at: a continuation's length, or a rank bin's depth."""
    return b.depth if isinstance(b, RankBin) else len(cast(Continuation, b))


def test_partition_agrees_with_full_enumeration(exact: PartitionFor, target_logits: TargetLogits, pack: Pack,
                                                prompt_ids: list[int]) -> None:
    """Where every continuation can be enumerated (top-k 5, 3 tokens: 125), each bin's probability is the
    sum of its continuations', computed one prefix at a time (unbatched); decided() agrees with bin_of."""
    params = SamplingParams(1.0, top_k=5)
    part = exact(params, 3)

    def logits_of(ids: list[int]) -> np.ndarray:
        return target_logits([tuple(ids[len(prompt_ids) :])])[0]

    sums: dict[object, float] = {}
    for seq, p in exact_continuations(transformed_next_probs(logits_of, params), prompt_ids, 3, pack.eos_ids).items():
        sums[part.bin_of(seq)] = sums.get(part.bin_of(seq), 0.0) + p
        assert all(part.decided(seq[:i]) == (part.bin_of(seq[:i]) == part.bin_of(seq)) for i in range(len(seq) + 1))
    assert sums.keys() == part.probs.keys()
    assert max(abs(sums[b] - part.probs[b]) for b in sums) < 1e-6


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("params", SETTINGS, ids=_id)
def test_distribution_is_the_targets(pack: Pack, prompt_ids: list[int], exact: PartitionFor, params: SamplingParams,
                                     k: int, n: int) -> None:
    part = exact(params, k + 2, n)
    samples = draw_samples(pack, pack.drafter, prompt_ids, params, k, _seed(params, k), n=n, decided=part.decided)
    assert 0.2 < samples.alpha < 0.95, f"acceptance {samples.alpha:.3f}: the test would not exercise rejections"
    p = pvalue(part, samples)
    print(f"{_id(params)} k={k}: alpha={samples.alpha:.3f} p={p:.4g}")
    assert p > P_FAIL


NGRAM_SETTINGS = [(SamplingParams(1.0), None)]  # one setting: ~2 minutes on the 2-core CPU
NGRAM_DRAFTER = NgramConfig(n_min=1, n_max=4)


def build_ngram_prompt(pack: Pack, target_dir: Path, prompt_ids: list[int]) -> list[int]:
    """[B[-3:], a, greedy(B + a)] for the 3 likeliest next tokens a, then B (the module docstring)."""
    body = [*prompt_ids, *pack.generate(prompt_ids, 160, k=0).tokens]
    likeliest = np.argsort(TargetLogits(target_dir, body)([()])[0])[::-1][:3]  # [3] next tokens after B
    prefix = []
    for a in likeliest.tolist():
        prefix += [*body[-3:], a, *pack.generate([*body, a], 8, k=0).tokens]
    return [*prefix, *body]


@pytest.fixture(scope="module")
def ngram_prompt(pack: Pack, pack_dirs: tuple[Path, Path, Path], prompt_ids: list[int]) -> list[int]:
    return build_ngram_prompt(pack, pack_dirs[2], prompt_ids)


@pytest.fixture(scope="module")
def ngram_exact(pack_dirs: tuple[Path, Path, Path], ngram_prompt: list[int], pack: Pack) -> PartitionFor:
    logits = TargetLogits(pack_dirs[2], ngram_prompt)

    @cache
    def partition(params: SamplingParams, length: int, n: int = SAMPLES) -> ExactPartition:
        return ExactPartition.build(lambda prefixes: oracle.transform(logits(prefixes), params), length,
                                    pack.eos_ids, n)

    return partition


class MisplacedOneHot(NgramDrafter):
    """Broken on purpose: prompt lookup's drafts with q one-hot on the next token id instead of the drafted one
    (a deterministic proposal's q built wrong): u * q(x) = 0 < p(x), so every draft is accepted."""

    def __init__(self, config: NgramConfig, vocab: int) -> None:
        super().__init__(config)
        self.vocab = vocab

    def propose(self, state: DecodeState, k: int) -> Proposal:
        proposal = super().propose(state, k)
        q = np.zeros((1, proposal.k, self.vocab), np.float32)  # [1, k, V]
        q[0, np.arange(proposal.k), (np.asarray(proposal.tokens) + 1) % self.vocab] = 1.0
        return Proposal(tokens=proposal.tokens, q=q)


def ngram_samples(pack: Pack, prompt: list[int], part: ExactPartition, params: SamplingParams, k: int | None,
                   n: int, drafter: NgramDrafter | None = None) -> Samples:
    """n generations with prompt lookup (q one-hot) through the verify graph; k None: adaptive k."""
    k_max = pack.manifest.k_max
    steps = k_max if k is None else k
    policy: Callable[[], KPolicy] = (lambda: FixedK(steps)) if k is not None else (
        lambda: AdaptiveK(k_max, costs=PriorCosts(0.0)))
    return draw_samples(pack, drafter or NgramDrafter(NGRAM_DRAFTER), prompt, params, steps, 77 + steps, n=n,
                        decided=part.decided, policy=policy)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize(("params", "k"), NGRAM_SETTINGS,
                         ids=[f"{_id(p)}-k{'auto' if k is None else k}" for p, k in NGRAM_SETTINGS])
def test_ngram_drafter_distribution_is_the_targets(pack: Pack, ngram_prompt: list[int], ngram_exact: PartitionFor,
                                                   params: SamplingParams, k: int | None, n: int) -> None:
    """Deterministic drafts (q one-hot) through the same verify graph; k None: adaptive k (acceptance alone)."""
    part = ngram_exact(params, (pack.manifest.k_max if k is None else k) + 2, n)
    samples = ngram_samples(pack, ngram_prompt, part, params, k, n)
    assert samples.proposed > n and samples.accepted >= n // 100, (samples.proposed, samples.accepted)
    p = pvalue(part, samples)
    print(f"ngram {_id(params)} k={k} n={n}: proposed={samples.proposed} alpha={samples.alpha:.3f} p={p:.4g}")
    assert p > P_FAIL


def test_ngram_catches_a_misplaced_one_hot(pack: Pack, ngram_prompt: list[int], ngram_exact: PartitionFor) -> None:
    """The n-gram test above at its size and seed, with q one-hot on the wrong token: rejected."""
    (params, k), = NGRAM_SETTINGS
    part = ngram_exact(params, pack.manifest.k_max + 2)
    broken = MisplacedOneHot(NGRAM_DRAFTER, pack.manifest.vocab_size)
    samples = ngram_samples(pack, ngram_prompt, part, params, k, SAMPLES, broken)
    p = pvalue(part, samples)
    print(f"ngram misplaced one-hot: alpha={samples.alpha:.3f} p={p:.4g}")
    assert samples.alpha > 0.99 and p < P_FAIL


BROKEN = [(SamplingParams(0.5), 1), (SamplingParams(1.0, top_k=5), 1)]  # at T = 1 with no filter the bug is a no-op


@pytest.mark.parametrize(("params", "k"), BROKEN, ids=[f"{_id(p)}-k{k}" for p, k in BROKEN])
def test_catches_q_taken_before_the_transform(pack: Pack, prompt_ids: list[int], exact: PartitionFor,
                                              params: SamplingParams, k: int) -> None:
    """Same samples, same seed, same test as test_distribution_is_the_targets[params, k, SAMPLES]: only q differs."""
    part, broken = exact(params, k + 2), ShadowDraft(pack, RAW)
    try:
        samples = draw_samples(pack, drafter_over(broken), prompt_ids, params, k, _seed(params, k),
                               decided=part.decided)
    finally:
        broken.close()
    assert broken.max_q_diff > 0.01  # q was really replaced
    p = pvalue(part, samples)
    print(f"broken {_id(params)} k={k}: alpha={samples.alpha:.3f} p={p:.4g}")
    assert p < P_FAIL


def test_shadow_wrapper_is_transparent(pack: Pack, prompt_ids: list[int]) -> None:
    """The broken test's wrapper, honest (the request's own params): q bit-identical, and with the same seed
    the very same tokens as the bare engine, so the broken variant's failure is the bug's alone."""
    for (params, _), k in zip(BROKEN, (1, 6), strict=True):  # k = 6: every draft slot, catch-up after all accepted
        control = ShadowDraft(pack, params)
        try:
            wrapped = draw_samples(pack, drafter_over(control), prompt_ids, params, k, _seed(params, k), n=300)
        finally:
            control.close()
        assert control.max_q_diff == 0.0
        bare = draw_samples(pack, pack.drafter, prompt_ids, params, k, _seed(params, k), n=300)
        assert wrapped.continuations == bare.continuations


def test_same_seed_same_tokens(pack: Pack, pack_dirs: tuple[Path, Path, Path]) -> None:
    """Same seed, same tokens: run after run, and on a fresh load with the default thread count."""
    fresh = specpack.load(pack_dirs[0])
    try:
        runs = [p.generate(PROMPT, 24, k=3, temperature=1.0, top_p=0.9, seed=seed).tokens
                for p, seed in ((pack, 7), (pack, 7), (fresh, 7), (pack, 8))]
    finally:
        fresh.close()
    assert runs[0] == runs[1] == runs[2]
    assert runs[0] != runs[3]


def test_stats_under_sampling_as_under_greedy(pack: Pack, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same keys as greedy; proposed = the k actually verified per step (capped), alpha = accepted / proposed."""
    recorder = RecordingTarget(pack.backend.target())
    monkeypatch.setattr(pack.backend, "target", lambda: recorder)
    greedy = pack.generate(PROMPT, 30, k=6).stats
    settings: list[dict[str, Any]] = [{}, {"temperature": 1.0, "seed": 3}, {"temperature": 0.5, "top_k": 5, "seed": 4}]
    for kwargs in settings:
        recorder.calls.clear()
        out = pack.generate(PROMPT, 30, k=6, **kwargs)
        stats, steps = out.stats, recorder.calls[1:]  # calls[0]: the prefill (k = 0)
        assert stats.keys() == greedy.keys()
        assert recorder.calls[0][0] == 0 and all(1 <= k <= 6 for k, _ in steps)
        assert stats["steps"] == len(steps)
        assert stats["proposed"] == sum(k for k, _ in steps) == sum(stats["proposed_at"])
        assert stats["accepted"] == sum(n for _, n in steps) == sum(stats["accepted_at"])
        assert 0.0 <= stats["alpha"] <= 1.0 and stats["alpha"] == pytest.approx(stats["accepted"] / stats["proposed"])
        assert stats["proposed_at"] == [sum(k > i for k, _ in steps) for i in range(6)]
        pairs = zip(stats["accepted_at"], stats["proposed_at"], strict=True)
        assert stats["per_position"] == [a / p if p else None for a, p in pairs]
        emitted = 1
        for k, n in steps:  # k capped so that a verify never emits past max_new_tokens
            assert k == min(6, 30 - emitted - 1)
            emitted += n + 1
        assert stats["new_tokens"] == len(out.tokens)
        assert len(out.tokens) == emitted or out.tokens[-1] in pack.eos_ids


def test_tiny_temperature_is_greedy(pack: Pack) -> None:
    greedy = pack.generate(PROMPT, 24, k=3).tokens
    for seed in range(3):
        assert pack.generate(PROMPT, 24, k=3, temperature=1e-4, seed=seed).tokens == greedy


def test_top_k_beyond_the_vocabulary_is_off(pack: Pack) -> None:
    vocab = pack.manifest.vocab_size
    off = pack.generate(PROMPT, 24, k=3, temperature=1.0, seed=11).tokens
    for top_k in (vocab, vocab + 1, 10 * vocab):
        assert pack.generate(PROMPT, 24, k=3, temperature=1.0, top_k=top_k, seed=11).tokens == off


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"temperature": -0.5}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_p": float("nan")}, "top_p"), ({"top_k": -1}, "top_k"),
], ids=lambda v: str(v) if isinstance(v, str) else "-".join(f"{a}={b}" for a, b in v.items()))
def test_invalid_sampling_values_are_refused(pack: Pack, kwargs: dict[str, float], name: str) -> None:
    with pytest.raises(SpecpackError, match=name):
        pack.generate(PROMPT, 8, temperature=kwargs.get("temperature", 1.0), top_k=int(kwargs.get("top_k", 0)),
                      top_p=kwargs.get("top_p", 1.0), seed=0)
