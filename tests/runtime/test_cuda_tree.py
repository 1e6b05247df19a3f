"""Token trees on the cuda backend's code, run on the CPU EP (CudaBackend(device="cpu"): no GPU, no capture).

The tiny tree pack of tests/e2e/test_tree_runtime.py (qwen2, k_max 4, 16 tree nodes; built once per code version):
the tree form verifies chains as trees of width 1 and n-gram tries, parents staged per T and the path kept on the
device; after a tree verify the cache's keep_rows runs kv_compact.onnx (present bound onto past) over the path,
skipped for a chain's path (docs/cuda_backend.md, "Trees").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import specpack
from specpack import names
from specpack.runtime.backends.cuda import DeviceSession, DeviceTarget
from specpack.runtime.ngram_drafter import NgramConfig
from specpack.runtime.pack import Pack
from specpack.runtime.state import DecodeState, Proposal
from tests.runtime.test_cuda_backend import device_pack

PROMPT = "def add(a, b):"
REPEATED = "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\n"


@pytest.fixture(scope="module")
def tree_pack_dir(tiny_export: Callable[..., Path]) -> Path:
    return tiny_export("qwen2", "small", k=4, max_len=64, kv_cache="static", max_tree_nodes=16)  # the e2e test's


def cpu_and_device_packs(pack_dir: Path) -> Iterator[tuple[Pack, Pack]]:
    """(cpu, cuda code on the CPU EP) of one tree pack, both with the same n-gram drafter settings (a fixture body)."""
    cpu = specpack.load(pack_dir, threads=1, ngram=NgramConfig(1, 3, width=4))
    dev = device_pack(pack_dir)
    dev = Pack(dev.path, dev.manifest, dev.tokenizer, dev.backend, ngram=NgramConfig(1, 3, width=4))
    yield cpu, dev
    cpu.close()
    dev.close()


@pytest.fixture(scope="module")
def packs(tree_pack_dir: Path) -> Iterator[tuple[Pack, Pack]]:
    yield from cpu_and_device_packs(tree_pack_dir)


def _engine(pack: Pack) -> DeviceTarget:
    return pack.backend.target().engine  # type: ignore[no-any-return,attr-defined]


class SiblingTree:
    """Knows the target's greedy continuation `want`: proposes a wrong first root child, then the right one and the
    right token under it (parents -1, -1, 1, 1): greedy accepts nodes 1 and 2, so the path moves rows every step."""

    def __init__(self, want: list[int], prompt_length: int, vocab: int) -> None:
        self.want, self.prompt_length, self.vocab = want, prompt_length, vocab

    def begin(self, state: DecodeState) -> None: ...

    def propose(self, state: DecodeState, k: int) -> Proposal:
        done = state.length - self.prompt_length
        right = [*self.want[done : done + 2], 0, 0][:2]
        tokens = [(right[0] + 1) % self.vocab, right[0], right[1], (right[1] + 1) % self.vocab][:k]
        parents = [-1, -1, 1, 1][:k]
        start = state.length
        state.ids[start : start + len(tokens)] = tokens
        return Proposal(state.ids[start : start + len(tokens)], None, np.asarray(parents, np.int64))

    def commit(self, state: DecodeState) -> None: ...


def test_greedy_trees_and_chains_equal_the_target_and_the_cpu_backend(packs: tuple[Pack, Pack]) -> None:
    cpu, dev = packs
    for prompt in (PROMPT, cpu.encode(REPEATED)[:30]):
        want = cpu.generate(prompt, 24, k=0).tokens
        assert dev.generate(prompt, 24, k=0).tokens == want
        for tree in ("auto", "off", 2, 16):
            out, ref = dev.generate(prompt, 24, drafter="ngram", tree=tree), cpu.generate(prompt, 24, drafter="ngram",
                                                                                        tree=tree)
            assert out.tokens == want == ref.tokens, (prompt, tree)
            if isinstance(tree, int):  # a fixed budget: the same steps (auto / off follow each backend's clock)
                assert out.stats["k_histogram"] == ref.stats["k_histogram"], (prompt, tree)
        assert dev.generate(prompt, 24, k=4, drafter="model").tokens == want  # chains as trees of width 1
    assert dev.generate(cpu.encode(REPEATED)[:30], 24, drafter="ngram", tree=16).stats["proposed"] > 0


def test_accepted_siblings_move_the_cache_rows_on_the_device(packs: tuple[Pack, Pack],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step's path goes through a sibling (rows move): kv_compact runs, the output is the target's; with the
    compaction a no-op the output leaves it (the test sees the rows move)."""
    cpu, dev = packs
    want = cpu.generate(PROMPT, 16, k=0).tokens
    tree = Pack(dev.path, dev.manifest, dev.tokenizer, dev.backend,
                SiblingTree(want, len(dev.encode(PROMPT)), dev.manifest.vocab_size))
    engine = _engine(dev)
    cache, ran = engine.slots[0].cache, []
    compact = cache.compact
    assert compact is not None
    monkeypatch.setattr(cache, "compact", lambda nodes: (ran.append(nodes), compact(nodes))[1])
    out = tree.generate(PROMPT, 16, k=4)
    assert out.tokens == want and out.stats["accepted"] > 0 and ran.count(4) >= 3, ran
    assert {(0, nodes) for nodes in ran} <= set(engine._compact_bindings)  # one binding per (slot, T)
    monkeypatch.setattr(cache, "compact", lambda nodes: None)  # the rows left where the verify wrote them
    assert tree.generate(PROMPT, 16, k=4).tokens != want


def test_chain_paths_skip_the_compaction_and_bindings_are_per_captured_shape(packs: tuple[Pack, Pack],
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain's path moves nothing (kv_compact not run); every binding is of a fixed shape (greedy, S <= T_max + 1,
    T), bound once and reused by later requests; kv_compact's once per (slot, T); the capture keys (slot, S, T) and
    (slot, T) name exactly those."""
    _, dev = packs
    engine = _engine(dev)
    keys: list[tuple[DeviceSession, tuple[int, ...] | None]] = []
    run, cache = DeviceSession.run, engine.slots[0].cache
    monkeypatch.setattr(DeviceSession, "run", lambda self, binding, key: (keys.append((self, key)),
                                                                          run(self, binding, key))[1])
    compact = cache.compact
    monkeypatch.setattr(cache, "compact", lambda nodes: pytest.fail("a chain's path was compacted"))
    dev.generate(PROMPT, 16, k=4, drafter="model")
    monkeypatch.setattr(cache, "compact", compact)
    dev.generate(dev.encode(REPEATED)[:30], 24, drafter="ngram", tree=8)
    first = {key: id(b) for key, b in engine.slots[0].bindings.items()}
    compact = {key: id(b) for key, b in engine._compact_bindings.items()}
    dev.generate(dev.encode(REPEATED)[:30], 24, drafter="ngram", tree=8)
    assert {key: id(b) for key, b in engine.slots[0].bindings.items() if key in first} == first
    assert {key: id(b) for key, b in engine._compact_bindings.items() if key in compact} == compact
    t_max = dev.manifest.target.graph.tree.max_nodes  # type: ignore[union-attr]
    assert engine.short_max == t_max + 1
    for greedy, plain, rows, nodes in first:
        assert greedy is True and plain is False and rows <= t_max + 1 and nodes <= t_max and (rows == nodes + 1 or nodes == 0)
    assert all(slot == 0 and 1 <= nodes <= t_max for slot, nodes in engine._compact_bindings)
    verify = {key for session, key in keys if session is engine.session(True) and key is not None}  # None: a long prefill
    assert verify and verify <= {(0, rows, nodes) for _, _, rows, nodes in first}
    assert {key for session, key in keys if session is engine._compact_session} <= set(engine._compact_bindings)


def test_sampled_tokens_equal_the_cpu_backend(packs: tuple[Pack, Pack]) -> None:
    """The tree head's deterministic rule (the pack's sampled rule), seeded: the cpu backend's tokens and steps."""
    cpu, dev = packs
    sampled = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 7}
    prompt = cpu.encode(REPEATED)[:30]
    for tree in ("auto", 8, "off"):
        out, ref = (p.generate(prompt, 24, drafter="ngram", tree=tree, **sampled) for p in (dev, cpu))
        assert out.tokens == ref.tokens and out.stats["k_histogram"] == ref.stats["k_histogram"], tree
    assert dev.generate(PROMPT, 24, k=4, drafter="model", **sampled).tokens == \
        cpu.generate(PROMPT, 24, k=4, drafter="model", **sampled).tokens


def test_tensorrt_and_reference_still_refuse_a_tree_pack(tree_pack_dir: Path) -> None:
    from specpack.contract.manifest import Manifest
    from specpack.runtime.target import refuse_cpu_only

    for backend in ("tensorrt", "reference"):
        with pytest.raises(specpack.SpecpackError, match="does not run tree verify graphs yet"):
            refuse_cpu_only(Manifest.read(tree_pack_dir), backend)


def test_a_pinned_load_opens_kv_compact_from_verified_bytes(tree_pack_dir: Path, packs: tuple[Pack, Pack]) -> None:
    from specpack.contract.manifest import Manifest
    from specpack.runtime.backend import BackendOptions
    from specpack.runtime.backends.cuda import CudaBackend

    cpu, _ = packs
    manifest = Manifest.read(tree_pack_dir)
    pinned = CudaBackend(tree_pack_dir, manifest, BackendOptions(verified_reads=True), device="cpu")
    with Pack(tree_pack_dir, manifest, cpu.tokenizer, pinned, ngram=NgramConfig(1, 3, width=4)) as pack:
        assert pack.backend.capture_report()["kv_compact"]["capture"] is False  # type: ignore[attr-defined]
        prompt = cpu.encode(REPEATED)[:30]
        assert pack.generate(prompt, 16, drafter="ngram", tree=4).tokens == cpu.generate(prompt, 16, k=0).tokens


def test_the_captured_graphs_read_no_host_value_as_data(tree_pack_dir: Path) -> None:
    """Every graph the cuda backend captures for a tree pack keeps shape values out of its data (a Memcpy node
    refuses capture on the CUDA EP: kv_compact.onnx was, on an H200; tests/graphs/host_values.py)."""
    import onnx

    from tests.graphs.host_values import host_values_in_data

    for name in ("verify.onnx", "draft_step.onnx", names.KV_COMPACT_FILE):
        path = tree_pack_dir / name
        if path.is_file():
            assert host_values_in_data(onnx.load(str(path), load_external_data=False)) == [], name
