"""`spec-export --graphs builder --max-tree-nodes 16`: a tree pack whose target is the model builder's graph in the
tree form (export/builder_tree.py), its draft the builder's too (tiny qwen2, head_dim 16, k 4, max_len 64).

The manifest records the tree form as the torch path does (positions internal, exporter builder); the captured graphs
read no host value as data. Greedy: transformers' target alone, with n-gram tries (tree auto, off, 2, 16), chains
from the draft model (trees of width 1), the draft model's own trees (its tree form on the builder's graph: its tree
rows equal its chain's) and trees whose first child is always wrong (rows move every step), on the cpu
backend and on the cuda backend's code (device="cpu"); seeded sampling: the same tokens on both; the chi-square test
against the target's exact probabilities (slow), and the same test rejecting trees chosen by peeking at the uniforms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import specpack
from specpack import names
from specpack.contract.manifest import Manifest
from specpack.runtime.ngram_drafter import NgramConfig
from specpack.runtime.pack import Pack
from specpack.runtime.state import DecodeState, Proposal
from specpack.sampling import SamplingParams
from tests.e2e.test_sampling_distribution import P_FAIL, TargetLogits, draw_samples, partitions, pvalue
from tests.e2e.test_tree_runtime import SAMPLES, TargetTopTree
from tests.export.test_builder_export import HEAD_DIM, needs_builder
from tests.runtime.test_cuda_backend import device_pack
from tests.runtime.test_cuda_tree import PROMPT, REPEATED, SiblingTree, cpu_and_device_packs

pytestmark = needs_builder  # the pack: two builder runs, about 5 s on the 2-core VM (once per code version)


@pytest.fixture(scope="module")
def pack_dir(tiny_export: Callable[..., Path]) -> Path:
    return tiny_export("qwen2", "small", {"head_dim": HEAD_DIM}, k=4, max_len=64, graphs="builder",
                       max_tree_nodes=16)


@pytest.fixture(scope="module")
def packs(pack_dir: Path) -> Iterator[tuple[Pack, Pack]]:
    yield from cpu_and_device_packs(pack_dir)


def test_the_manifest_records_the_builder_tree_form(pack_dir: Path) -> None:
    from tests.graphs.host_values import host_values_in_data

    manifest = Manifest.read(pack_dir)
    graph = manifest.target.graph
    assert graph.tree is not None and graph.tree.max_nodes == 16 and graph.tree.rules == ["greedy", "deterministic"]
    assert (graph.exporter, graph.positions, graph.attention, graph.kv_cache) == ("builder", "internal", "gqa", "static")
    assert manifest.draft.graph.tree is None and manifest.draft.graph.exporter == "builder"
    draft = manifest.draft  # the draft's tree form on the builder's graph (builder_tree.add_draft_tree_form)
    assert draft.tree_width == 8 and draft.graph.positions == "internal"
    assert {names.DRAFT_POSITIONS, names.DRAFT_MASK} <= {s.name for s in draft.graph.inputs}
    inputs = {s.name: s for s in graph.inputs}
    assert inputs[names.PARENTS].shape == [1, "tree_nodes"] and names.POSITION_IDS not in inputs
    assert names.DRAFT_PROBS not in inputs and names.KV_COMPACT_FILE in manifest.loaded_files()
    for name in ("verify.onnx", "draft_step.onnx", names.KV_COMPACT_FILE):
        assert host_values_in_data(onnx.load(str(pack_dir / name), load_external_data=False)) == [], name
    entry = graph.model_dump()
    type(graph).model_validate(entry)
    for wrong in ({"positions": "inputs"}, {"exporter": "torch", "execution_provider": None}):  # not a tree form
        with pytest.raises(ValueError, match="a tree verify graph"):
            type(graph).model_validate({**entry, **wrong})


def test_greedy_trees_and_chains_equal_the_target_alone(packs: tuple[Pack, Pack], tiny_pairs) -> None:
    from tests.e2e.test_greedy_golden import _reference

    cpu, dev = packs
    target = tiny_pairs("qwen2", head_dim=HEAD_DIM)[1]
    proposed = 0
    for prompt in (PROMPT, cpu.encode(REPEATED)[:30]):
        want = _reference(target, cpu.encode(prompt), 24, cpu.manifest.eos_token_ids)
        for pack in (cpu, dev):
            assert pack.generate(prompt, 24, k=0).tokens == want
            for tree in ("auto", "off", 2, 16):
                out = pack.generate(prompt, 24, drafter="ngram", tree=tree)
                assert out.tokens == want, (prompt, tree)
                proposed += out.stats["proposed"]
            assert pack.generate(prompt, 24, k=4, drafter="model", tree="off").tokens == want  # chains as width 1
            for tree in ("auto", 4, 16):  # the draft model's trees (docs/trees.md, "Trees drafted by the draft model")
                out = pack.generate(prompt, 24, drafter="model", tree=tree)
                assert out.tokens == want and out.stats["tree"], (prompt, tree)
    assert proposed > 0


def test_the_builder_drafts_tree_rows_are_the_chains_rows(packs: tuple[Pack, Pack], pack_dir: Path) -> None:
    """The draft's tree form on the builder's graph (GroupQueryAttention's position_ids and attention_bias from
    draft_positions and draft_mask): every tree run's top-K equals the builder draft run as a chain from an empty cache
    over the node's root path (tests/e2e/test_model_trees.py's check)."""
    from specpack.runtime.state import TreeShape
    from tests.e2e.test_model_trees import ChainCheckingDrafter

    cpu = packs[0]
    with specpack.load(pack_dir, threads=1) as reference:
        drafter = ChainCheckingDrafter(cpu, TreeShape(3, 4), reference)
        out = Pack(cpu.path, cpu.manifest, cpu.tokenizer, cpu.backend, drafter).generate(PROMPT, 12, tree=12)
    assert out.stats["tree"] and drafter.checked >= 20, drafter.checked


def test_accepted_siblings_move_the_rows_on_both_backends(packs: tuple[Pack, Pack],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step's path goes through a sibling (the cache rows move: on the host, and by kv_compact.onnx on the
    device's cache); the output is the target's."""
    cpu, dev = packs
    cache = dev.backend.target().engine.slots[0].cache  # type: ignore[attr-defined]
    compact, ran = cache.compact, []
    monkeypatch.setattr(cache, "compact", lambda nodes: (ran.append(nodes), compact(nodes))[1])
    for pack in (cpu, dev):
        want = pack.generate(PROMPT, 16, k=0).tokens
        tree = Pack(pack.path, pack.manifest, pack.tokenizer, pack.backend,
                    SiblingTree(want, len(pack.encode(PROMPT)), pack.manifest.vocab_size))
        out = tree.generate(PROMPT, 16, k=4)
        assert out.tokens == want and out.stats["accepted"] > 0
    assert ran.count(4) >= 3, ran


def test_sampled_tokens_equal_the_cpu_backend(packs: tuple[Pack, Pack]) -> None:
    cpu, dev = packs
    sampled = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 7}
    prompt = cpu.encode(REPEATED)[:30]
    for tree in ("auto", 8, "off"):
        out, ref = (p.generate(prompt, 24, drafter="ngram", tree=tree, **sampled) for p in (dev, cpu))
        assert out.tokens == ref.tokens and out.stats["k_histogram"] == ref.stats["k_histogram"], tree


def test_an_int4_builder_tree_pack_gives_its_own_greedy_tokens(tiny_export: Callable[..., Path]) -> None:
    """The builder's int4 target (its quantizer, MatMulNBits at accuracy level 1) in the tree form, n-gram drafter:
    trees and chains give the target's own k = 0 tokens on both backends."""
    pack_dir = tiny_export("qwen2", None, {"head_dim": HEAD_DIM}, k=4, max_len=64, graphs="builder", drafter="ngram",
                           quantize_target="int4", max_tree_nodes=8)
    cpu = specpack.load(pack_dir, threads=1, ngram=NgramConfig(1, 3, width=4))
    dev = device_pack(pack_dir)
    dev = Pack(dev.path, dev.manifest, dev.tokenizer, dev.backend, ngram=NgramConfig(1, 3, width=4))
    try:
        assert cpu.manifest.target.quantization is not None and cpu.manifest.target.graph.tree is not None
        proposed = 0
        for prompt in (PROMPT, cpu.encode(REPEATED)[:30]):
            want = cpu.generate(prompt, 24, k=0).tokens
            for pack in (cpu, dev):
                for tree in ("auto", "off", 2, 8):
                    out = pack.generate(prompt, 24, tree=tree)
                    assert out.tokens == want, (prompt, tree)
                    proposed += out.stats["proposed"]
        assert proposed > 0
    finally:
        cpu.close()
        dev.close()


@pytest.mark.slow
@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, top_k=20)], ids=str)
def test_sampled_trees_on_the_builder_form_keep_the_distribution(tiny_pairs: Callable[..., tuple[Path, Path]],
                                                                  packs: tuple[Pack, Pack],
                                                                  params: SamplingParams) -> None:
    """The chi-square test of tests/e2e/test_tree_runtime.py on the builder's tree form (cpu backend): trees of the
    target's top tokens (deterministic candidates) against the target's exact probabilities (transformers); the same
    test rejects a tree chosen by peeking at the verify's uniform (below)."""
    samples, p = _builder_tree_samples(tiny_pairs, packs[0], params, peeking=False)
    print(f"builder trees {params}: alpha={samples.alpha:.3f} p={p:.4g}")
    assert samples.accepted > SAMPLES // 10
    assert p > P_FAIL


@pytest.mark.slow
def test_a_tree_peeking_at_the_uniforms_is_rejected(tiny_pairs: Callable[..., tuple[Path, Path]],
                                                     packs: tuple[Pack, Pack]) -> None:
    samples, p = _builder_tree_samples(tiny_pairs, packs[0], SamplingParams(1.0), peeking=True, n=5 * SAMPLES)
    print(f"peeking builder trees: alpha={samples.alpha:.3f} p={p:.4g}")
    assert p < P_FAIL


class PeekingTopTree(TargetTopTree):
    """A defect: the target's top-3 tree (temperature 1), its first two root children swapped whenever the first
    node's uniform (state.uniforms.verify[0, 0], drawn before the step) says the top token would be rejected there: the
    second token is then rejected too and the top one tested again against the residual, so it comes out about
    p0 (1 - p0) / (1 - p1) more often. The deterministic rule is exact only for candidates fixed before the uniforms."""

    def propose(self, state: DecodeState, k: int) -> Proposal:
        done = tuple(state.ids[self.prompt_length : state.length].tolist())
        logits = self.logits([done])[0]
        probs = np.exp(logits - logits.max())
        order = np.argsort(-logits, kind="stable")
        proposal = super().propose(state, k)
        if proposal.k >= 2 and state.uniforms.verify[0, 0] * probs.sum() >= probs[order[0]]:
            proposal.tokens[[0, 1]] = proposal.tokens[[1, 0]]  # both root children: parents unchanged
        return proposal


def _builder_tree_samples(tiny_pairs: Callable[..., tuple[Path, Path]], pack: Pack, params: SamplingParams,
                          peeking: bool, n: int = SAMPLES) -> tuple[Any, float]:
    prompt = pack.encode(PROMPT)
    logits = TargetLogits(tiny_pairs("qwen2", "small", head_dim=HEAD_DIM)[1], prompt)
    k = 4
    part = partitions(logits, pack.eos_ids)(params, k + 2, n)
    drafter = (PeekingTopTree if peeking else TargetTopTree)(logits, len(prompt))  # k 4: root children 0-2, 3 under 0
    samples = draw_samples(pack, drafter, prompt, params, k, 11, n=n, decided=part.decided)
    return samples, pvalue(part, samples)
