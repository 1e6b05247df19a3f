"""Pre-capture (runtime/backends/cuda_precapture.py) on the cuda backend's code, run on the CPU EP: every shape a
greedy request runs (chains; a tree pack's trees: its tree verifies, kv_compact.onnx and the head's or draft model's
tree runs) was
already run at load, so no graph is captured mid-request on a GPU; the tokens are unchanged (the dummy rows are
dropped) and each slot's cache is empty after load.

A shape is "run" when its binding exists (bound once per shape, and captured with it on the GPU): a request that adds
a binding would capture a graph mid-request there."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import specpack
from specpack.runtime.backends import cuda_precapture
from specpack.runtime.ngram_drafter import NgramConfig
from specpack.runtime.pack import Pack
from specpack.runtime.request import GenerateRequest
from specpack.runtime.state import DecodeState, Proposal
from tests.runtime.test_cuda_backend import device_pack

NGRAM = NgramConfig(1, 3, width=4)  # as tests/runtime/test_cuda_tree.py's packs
REPEATED = "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\n"  # prompt lookup drafts tries here
PROMPT = "def add(a, b):"


def _bindings(pack: Pack) -> dict[str, set[tuple[Any, ...]]]:
    """Every shape bound so far: per engine (slot, *key), and kv_compact.onnx's (slot, T)."""
    backend: Any = pack.backend
    target = backend.target().engine
    engines = {"target": target}
    if pack.manifest.draft_model is not None or pack.manifest.head is not None:  # a prompt-lookup pack has no draft
        engines["draft"] = backend.draft().engine
    bound = {label: {(i, *key) for i, slot in enumerate(e.slots) for key in slot.bindings} for label, e in engines.items()}
    return {**bound, "kv_compact": set(target._compact_bindings)}


def _requests(pack: Pack, drafter: str) -> list[tuple[Any, int | None]]:
    """Prompts of several lengths (one past LONG_CHUNK + k_max + 1: chunks), every k and adaptive k."""
    rng = np.random.default_rng(3)
    prompts: list[Any] = ["def add(a, b):", [5], *(rng.integers(0, pack.manifest.vocab_size - 8, n).tolist()
                                                  for n in (7, 13, 45, 50))]
    return [(p, k) for p in prompts for k in (0, 1, 2, pack.manifest.k_max, None)]


def _check(pack_dir: Path, drafter: str) -> None:
    cpu = specpack.load(pack_dir, threads=1)
    dev = device_pack(pack_dir, slots=2, chunked_runs=True, precapture=True)
    try:
        assert all(slot.cache.length == 0 for slot in dev.backend.draft().engine.slots)  # type: ignore[attr-defined]
        before = _bindings(dev)
        assert before["target"] and before["draft"]
        for prompt, k in _requests(dev, drafter):
            want = cpu.generate(prompt, 24, k=k, drafter=drafter).tokens
            assert dev.generate(prompt, 24, k=k, drafter=drafter).tokens == want, (prompt, k)
        assert _bindings(dev) == before  # nothing new bound (captured, on a GPU) while requests ran
    finally:
        cpu.close()
        dev.close()


def test_a_model_pack_runs_no_new_shape_after_load(tiny_pack: Callable[..., tuple[Path, Path, Path]]) -> None:
    _check(tiny_pack("qwen2", "noisy", kv_cache="static", attention="gqa", head_dim=16, k=4)[0], "model")


def test_a_head_pack_runs_no_new_shape_after_load(tiny_head_pack: Callable[..., tuple[Path, Path, Path]]) -> None:
    _check(tiny_head_pack("qwen2", kv_cache="static")[0], "head")


@pytest.mark.parametrize("precapture", [False, True])
def test_without_precapture_a_request_binds_new_shapes(tiny_head_pack: Callable[..., tuple[Path, Path, Path]],
                                                       precapture: bool) -> None:
    """The check above can fail: the same requests on a backend that did not pre-capture bind shapes as they go."""
    dev = device_pack(tiny_head_pack("qwen2", kv_cache="static")[0], chunked_runs=True, precapture=precapture)
    try:
        before = _bindings(dev)
        dev.generate(PROMPT, 24, drafter="head")
        assert (_bindings(dev) != before) is not precapture
    finally:
        dev.close()


def test_a_tree_pack_precaptures_its_chains_and_keeps_its_tokens(tiny_export: Callable[..., Path]) -> None:
    """A tree pack (short_max T_max + 1 > k_max + 1): its chains run no new shape; trees keep their tokens."""
    pack_dir = tiny_export("qwen2", "small", k=4, max_len=64, kv_cache="static", max_tree_nodes=16)
    cpu = specpack.load(pack_dir, threads=1, ngram=NGRAM)
    dev = device_pack(pack_dir, chunked_runs=True, precapture=True)
    dev = Pack(dev.path, dev.manifest, dev.tokenizer, dev.backend, ngram=NGRAM)
    try:
        before = _bindings(dev)
        for prompt, k in _requests(dev, "model")[:15]:  # prompts up to 13 tokens: max_len 64
            want = cpu.generate(prompt, 24, k=k, tree="off").tokens
            assert dev.generate(prompt, 24, k=k, tree="off").tokens == want, (prompt, k)
        assert _bindings(dev) == before
        got = dev.generate(REPEATED, 24, drafter="ngram", tree=4)
        assert got.tokens == cpu.generate(REPEATED, 24, drafter="ngram", tree=4).tokens and got.stats["proposed"]
        assert _bindings(dev) == before
    finally:
        cpu.close()
        dev.close()


# The tree packs (the tree_packs fixture), each with the drafter of its trees. "head": a head tree pack (k 4, 16 nodes,
# max_len 256, the head's K 8: tests/e2e/test_head_trees.py's); "lookup": a prompt-lookup tree pack (no draft model nor
# head; k 4, 16 nodes, max_len 64: tests/gpu/test_cuda_gpu.py's, fp32); "model": a draft model's tree pack (k 4, 16
# nodes, max_len 64, the draft's K 8: tests/e2e/test_model_trees.py's).
TREE_PACKS = {"head": "head", "lookup": "ngram", "model": "model"}


@pytest.fixture(scope="module")
def tree_packs(tiny_head_pack: Callable[..., tuple[Path, Path, Path]], tiny_export: Callable[..., Path]
               ) -> dict[str, Path]:
    return {"head": tiny_head_pack("qwen2", kv_cache="static", max_tree_nodes=16)[0],
            "lookup": tiny_export("qwen2", None, k=4, max_len=64, kv_cache="static", drafter="ngram",
                                  max_tree_nodes=16),
            "model": tiny_export("qwen2", "small", k=4, max_len=64, kv_cache="static", max_tree_nodes=16)}


def _tree_requests(pack: Pack) -> list[tuple[Any, Any]]:
    """Prompts of several lengths (1 to 13 tokens, and the repeated lines' 30: max_len 64; two of them repeat, so
    prompt lookup drafts trees), tree "auto" and fixed node counts below, at and above k_max (4) up to the packs'
    16."""
    rng = np.random.default_rng(5)
    prompts: list[Any] = [PROMPT, REPEATED, [5], [7, 8, 9, 7, 8, 9, 7, 8],  # a short prompt that repeats
                          *(rng.integers(0, pack.manifest.vocab_size - 8, n).tolist() for n in (7, 13))]
    return [(p, tree) for p in prompts for tree in ("auto", 1, 2, 3, 5, 8, 12, 16)]


def _device(pack_dir: Path, precapture: bool, slots: int = 1) -> Pack:
    dev = device_pack(pack_dir, slots=slots, chunked_runs=True, precapture=precapture)
    return Pack(dev.path, dev.manifest, dev.tokenizer, dev.backend, ngram=NGRAM)


class SiblingChain:
    """Knows the target's greedy continuation `want`: a wrong root child first, then the right tokens as a chain under
    the second root child (parents -1, -1, 1, 2, ..): greedy accepts every node but the first, so each step's path
    moves rows and kv_compact.onnx runs, whatever the node count (2 or more; the tiny random target accepts next to
    none of prompt lookup's drafts, so its own trees seldom compact)."""

    def __init__(self, want: list[int], prompt_length: int, vocab: int) -> None:
        self.want, self.prompt_length, self.vocab = [*want, *[0] * 17], prompt_length, vocab

    def begin(self, state: DecodeState) -> None: ...

    def propose(self, state: DecodeState, k: int) -> Proposal:
        done, start = state.length - self.prompt_length, state.length
        tokens = [(self.want[done] + 1) % self.vocab, *self.want[done : done + k - 1]]
        state.ids[start : start + k] = tokens
        return Proposal(state.ids[start : start + k], None, np.array([-1, -1, *range(1, k - 1)][:k], np.int64))

    def commit(self, state: DecodeState) -> None: ...


def _sibling_chains(pack: Pack, cpu: Pack, trees: tuple[int, ...]) -> None:
    """Trees of each node count in `trees` through a sibling (SiblingChain) on `pack`: the target alone's tokens."""
    want = cpu.generate(PROMPT, 24, k=0).tokens
    siblings = Pack(pack.path, pack.manifest, pack.tokenizer, pack.backend,
                    SiblingChain(want, len(pack.encode(PROMPT)), pack.manifest.vocab_size))
    for tree in trees:
        got = siblings.generate(PROMPT, 24, tree=tree)
        assert got.tokens == want and got.stats["accepted"], tree


def _caches(pack: Pack) -> list[int]:
    """Every slot's cached length, the target's and the draft's."""
    bound = _bindings(pack)  # opens the draft where the pack has one
    backend: Any = pack.backend
    engines = [backend.target().engine, *([backend.draft().engine] if "draft" in bound else [])]
    return [slot.cache.length for engine in engines for slot in engine.slots]


@pytest.mark.parametrize("kind", sorted(TREE_PACKS))
def test_a_tree_pack_runs_no_new_shape_after_load(tree_packs: dict[str, Path], kind: str) -> None:
    """Greedy trees (the head's or prompt lookup's, tree "auto" and fixed node counts; trees through a sibling, which
    kv_compact.onnx moves) bind nothing after load and give the target alone's tokens; the same requests on a backend
    without pre-capture bind tree shapes as they go (tree verifies past k_max, kv_compact.onnx, the head's tree runs),
    every one of them bound at load here."""
    drafter, sizes = TREE_PACKS[kind], (2, 3, 5, 8, 12, 16)
    cpu = specpack.load(tree_packs[kind], threads=1, ngram=NGRAM)
    dev, lazy = _device(tree_packs[kind], True, slots=2), _device(tree_packs[kind], False)
    try:
        assert not any(_caches(dev))  # each slot's caches empty after load, as without pre-capture
        before = _bindings(dev)
        assert {t for *_, n, t in before["target"] if n == t + 1} >= set(range(1, 17))  # (slot, greedy, n, T)
        assert {t for _, t in before["kv_compact"]} == set(range(2, 17))
        for pack in (dev, lazy):
            for prompt, tree in _tree_requests(pack):
                want = cpu.generate(prompt, 24, k=0).tokens
                assert pack.generate(prompt, 24, drafter=drafter, tree=tree).tokens == want, (prompt, tree)
            _sibling_chains(pack, cpu, sizes)
        assert _bindings(dev) == before  # nothing new bound (captured, on a GPU) while tree requests ran
        used = _bindings(lazy)  # what the requests bound without pre-capture: all of it bound at load
        assert all(used[label] <= before[label] for label in used)
        assert any(t > dev.manifest.k_max for *_, t in used["target"])  # trees of more nodes than a chain's drafts
        assert {t for _, t in used["kv_compact"]} >= set(sizes)
        if kind == "head":
            assert any(key[1] == "tree" and key[3] for key in used["draft"])  # the head's expansions (slot, "tree", C, W)
        if kind == "model":
            # the draft's expansions (slot, greedy, plain, W, "tree", W)
            assert any(key[4:5] == ("tree",) for key in used["draft"])
    finally:
        cpu.close()
        dev.close()
        lazy.close()


def test_a_tree_request_over_a_long_prompt_runs_only_captured_shapes(tree_packs: dict[str, Path],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A greedy tree request over a prompt longer than the engine's short_max (30 tokens, 17): the prompt goes as
    captured chunks (the loop's first step is a prefill), every tree verify over T + 1 rows (pre-captured), so no
    target run is uncaptured; the target alone's tokens."""
    cpu = specpack.load(tree_packs["lookup"], threads=1, ngram=NGRAM)
    dev = _device(tree_packs["lookup"], True)
    session = dev.backend.target().engine.session(True)  # type: ignore[attr-defined]
    keys: list[Any] = []
    run = session.run
    monkeypatch.setattr(session, "run", lambda binding, key: (keys.append(key), run(binding, key))[1])
    try:
        got = dev.generate(REPEATED, 24, drafter="ngram", tree=8)
        assert got.tokens == cpu.generate(REPEATED, 24, k=0).tokens and got.stats["proposed"]
        assert keys and None not in keys, keys  # None: an uncaptured run (on a GPU, ONNX Runtime's plain run)
    finally:
        cpu.close()
        dev.close()


@pytest.mark.parametrize("precapture", ["none", "chains", "all"])
def test_without_tree_precapture_a_tree_request_binds_new_shapes(tree_packs: dict[str, Path],
                                                                monkeypatch: pytest.MonkeyPatch, precapture: str) -> None:
    """The check above can fail: trees on a backend that pre-captured nothing, or its chains alone, bind shapes as they
    go (a tree verify past k_max, kv_compact.onnx, the head's tree runs: each one missing without its part)."""
    if precapture == "chains":
        monkeypatch.setattr(cuda_precapture, "precapture_tree_target", lambda *args: 0)
        monkeypatch.setattr(cuda_precapture, "precapture_head_tree", lambda *args: 0)
    cpu = specpack.load(tree_packs["head"], threads=1)
    dev = _device(tree_packs["head"], precapture != "none")
    try:
        before = _bindings(dev)
        for tree in (16, "auto"):
            dev.generate(REPEATED, 24, drafter="head", tree=tree)
        _sibling_chains(dev, cpu, (8,))
        new = {label: keys - before[label] for label, keys in _bindings(dev).items()}
        assert any(new.values()) is (precapture != "all")
        if precapture == "chains":
            assert new["kv_compact"] and any(t > dev.manifest.k_max for *_, t in new["target"])
            assert any(key[1] == "tree" for key in new["draft"])
    finally:
        cpu.close()
        dev.close()


def test_warmup_runs_are_counted_per_thread() -> None:
    """ONNX Runtime's CUDA EP keeps captured graphs per thread: a shape captured on the loading thread (pre-capture)
    is run plainly and captured again the first CAPTURE_RUNS times a batcher's thread runs it, so those runs count as
    warm-ups there too (the k policies take no time sample from them: one client through the scheduler on an H100
    timed them as drafts, d 12.3 ms against 2.2 ms). Over a stand-in session (no GPU here): the counting alone."""
    import threading

    from specpack.runtime.backends.cuda import CAPTURE_RUNS, DeviceSession, WarmupRuns

    class Session:
        def run_with_iobinding(self, binding: object, options: object) -> None: ...

    class Ort:
        class RunOptions:
            def add_run_config_entry(self, key: str, value: str) -> None: ...

    session: Any = object.__new__(DeviceSession)
    session.capture, session.session, session._ort = True, Session(), Ort()
    session._graph_ids, session._run_options, session._local = {}, {}, threading.local()
    session._warmups = warmups = WarmupRuns()
    for _ in range(CAPTURE_RUNS + 3):
        session.run(None, ("verify", 2))
    assert warmups.count == CAPTURE_RUNS  # this thread: captured, then replayed
    other = threading.Thread(target=lambda: [session.run(None, ("verify", 2)) for _ in range(CAPTURE_RUNS + 3)])
    other.start()
    other.join()
    assert warmups.count == 2 * CAPTURE_RUNS  # another thread captures the same shape again
    session.run(None, ("verify", 2))
    assert warmups.count == 2 * CAPTURE_RUNS and len(session._graph_ids) == 1  # one graph id for the shape


def _spy_precaptures(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(function, thread name) of every precapture_target / precapture_draft call from now on."""
    import threading

    ran: list[tuple[str, str]] = []
    for name in ("precapture_target", "precapture_draft"):
        real = getattr(cuda_precapture, name)
        monkeypatch.setattr(cuda_precapture, name, lambda *a, real=real, name=name: (
            ran.append((name, threading.current_thread().name)), real(*a))[1])
    return ran


def _server_pack(pack_dir: Path) -> Pack:
    """The cuda backend's code on the CPU EP, loaded as `specpack serve` loads (precapture "batcher")."""
    from specpack.contract.manifest import Manifest
    from specpack.runtime.backend import BackendOptions
    from specpack.runtime.backends.cuda import CudaBackend
    from specpack.runtime.tokenizer import PackTokenizer

    manifest = Manifest.read(pack_dir)
    backend = CudaBackend(pack_dir, manifest, BackendOptions(precapture="batcher"), device="cpu", precapture=True)
    return Pack(pack_dir, manifest, PackTokenizer.load(pack_dir / "tokenizer"), backend)


def test_a_one_row_batcher_captures_the_chains_again_on_its_thread(tiny_pack: Callable[..., tuple[Path, Path, Path]],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Verified per slot (max_batch 1: SerialVerifier), a batcher's steps run the per-slot chains on its own thread,
    where the load's captures (on the loading thread) do not serve: start_batching runs them there first, target and
    draft. A failure there ends every request with its error."""
    import threading

    pack_dir = tiny_pack("qwen2", "noisy", kv_cache="static", attention="gqa", head_dim=16)[0]
    ran = _spy_precaptures(monkeypatch)
    dev = device_pack(pack_dir, precapture=True)
    try:
        load = [name for name, thread in ran if thread == threading.current_thread().name]
        assert load == ["precapture_target", "precapture_draft"]  # the load's, on this thread
        ran.clear()
        dev.start_batching(1)
        want = specpack.load(pack_dir).generate(PROMPT, 16, k=2).tokens
        assert dev.submit(GenerateRequest.of(PROMPT, 16, k=2)).result(timeout=60).tokens == want
        assert ran == [("precapture_target", "specpack-batcher"), ("precapture_draft", "specpack-batcher")]
    finally:
        dev.close()
    broken = _server_pack(pack_dir)  # nothing captured at load: the batcher's captures alone fail
    monkeypatch.setattr(cuda_precapture, "precapture_target", lambda *a: 1 / 0)
    try:
        broken.start_batching(1)
        with pytest.raises(ZeroDivisionError):
            broken.submit(GenerateRequest.of(PROMPT, 16, k=2)).result(timeout=60)
    finally:
        broken.close()


def test_a_server_load_captures_on_the_batchers_thread_alone(tiny_pack: Callable[..., tuple[Path, Path, Path]],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """BackendOptions(precapture="batcher") (`specpack serve`: every request goes through the batcher): nothing is
    captured at load, on a thread no request runs on; start_batching captures the target's chains and opens and
    captures the draft on the batcher's thread; an invalid value is refused."""
    from specpack.contract.manifest import Manifest
    from specpack.errors import SpecpackError
    from specpack.runtime.backend import BackendOptions
    from specpack.runtime.backends.cuda import CudaBackend

    pack_dir = tiny_pack("qwen2", "noisy", kv_cache="static", attention="gqa", head_dim=16)[0]
    manifest = Manifest.read(pack_dir)
    ran = _spy_precaptures(monkeypatch)
    pack = _server_pack(pack_dir)
    try:
        assert ran == [] and not pack.backend.draft_loaded
        assert pack.start_batching(1).prepared.wait(60)
        assert sorted(ran) == [("precapture_draft", "specpack-batcher"), ("precapture_target", "specpack-batcher")]
        want = specpack.load(pack_dir).generate(PROMPT, 16, k=2).tokens
        assert pack.submit(GenerateRequest.of(PROMPT, 16, k=2)).result(timeout=60).tokens == want
    finally:
        pack.close()
    with pytest.raises(SpecpackError, match="invalid precapture"):
        CudaBackend(pack_dir, manifest, BackendOptions(precapture="load"), device="cpu")  # type: ignore[arg-type]


def test_a_one_at_a_time_server_captures_on_its_worker_thread(tiny_pack: Callable[..., tuple[Path, Path, Path]],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """`specpack serve --max-batch 1` decodes every job on its decoder's one worker thread (no batcher): the decoder's
    start has the pack capture there first (Pack.precapture_thread), the target's chains and the draft's; the pack
    loaded as the server loads it (precapture "batcher") captured nothing before."""
    import asyncio

    from specpack.serve.decoder import Decoder
    from specpack.serve.metrics import ServerMetrics

    pack_dir = tiny_pack("qwen2", "noisy", kv_cache="static", attention="gqa", head_dim=16)[0]
    ran = _spy_precaptures(monkeypatch)
    pack = _server_pack(pack_dir)

    async def start_and_stop(decoder: Decoder) -> int:
        decoder.start()
        assert decoder._precaptured is not None
        runs = await asyncio.wrap_future(decoder._precaptured)
        await decoder.close()
        return runs

    try:
        assert ran == []
        runs = asyncio.run(start_and_stop(Decoder(pack, ServerMetrics(), max_queue=4, timeout_s=60.0, max_batch=1)))
        assert runs > 0 and sorted(name for name, _ in ran) == ["precapture_draft", "precapture_target"]
        assert {thread for _, thread in ran} == {"specpack-decode_0"}, ran
    finally:
        pack.close()
