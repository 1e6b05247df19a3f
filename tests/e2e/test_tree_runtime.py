"""Token trees through a real tree pack (`spec-export --kv-cache static --max-tree-nodes 16`, tiny qwen2 pair) on the
cpu backend: the tree verify graph, the accepted path moved into place (state.ids and the static cache's rows), the
rest dropped (docs/trees.md).

Greedy: the output is the target alone's with chains through the tree form (the model drafter; its trees:
tests/e2e/test_model_trees.py), with n-gram tries
(tree "auto", "off" and fixed budgets up to the pack's max tree nodes, above its k_max),
and with trees whose first child is always wrong (the walk goes through a sibling, so the cache rows move every
step); with the rows left unmoved the same run leaves the target's output (the test sees the compaction). Sampling:
the chi-square test of test_sampling_distribution.py with trees of the target's top tokens (deterministic
candidates), against exact probabilities.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import specpack
from specpack.runtime.drafter import Drafter
from specpack.runtime.ngram_drafter import NgramConfig
from specpack.runtime.pack import Pack
from specpack.runtime.state import DecodeState, Proposal
from specpack.runtime.static_kv_cache import StaticKVCache
from specpack.sampling import SamplingParams
from tests.e2e.test_sampling_distribution import (
    P_FAIL,
    PartitionFor,
    TargetLogits,
    draw_samples,
    partitions,
    pvalue,
)

PROMPT = "def add(a, b):"
SAMPLES = 1_500


@pytest.fixture(scope="module")
def tree_pack_dir(tiny_export: Callable[..., Path]) -> Path:
    return tiny_export("qwen2", "small", k=4, max_len=64, kv_cache="static", max_tree_nodes=16)


@pytest.fixture(scope="module")
def pack(tree_pack_dir: Path) -> Iterator[Pack]:
    loaded = specpack.load(tree_pack_dir, threads=1, ngram=NgramConfig(1, 3, width=4))
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def logits(tiny_pairs: Callable[..., tuple[Path, Path]], pack: Pack) -> TargetLogits:
    return TargetLogits(tiny_pairs("qwen2", "small")[1], pack.encode(PROMPT))


class TargetTopTree:
    """A deterministic tree from the target's own logits (transformers): its top 3 tokens after the committed ones as
    the root's children, the top 2 after the first child under it; `wrong_first`: the first root child is the
    target's least likely token (greedy never accepts it: the walk goes through a sibling)."""

    def __init__(self, logits: TargetLogits, prompt_length: int, wrong_first: bool = False) -> None:
        self.logits, self.prompt_length, self.wrong_first = logits, prompt_length, wrong_first

    def begin(self, state: DecodeState) -> None: ...

    def propose(self, state: DecodeState, k: int) -> Proposal:
        done = tuple(state.ids[self.prompt_length : state.length].tolist())
        order = np.argsort(-self.logits([done])[0], kind="stable")  # [V] best first
        roots = [int(order[-1]), int(order[0]), int(order[1])] if self.wrong_first else [int(t) for t in order[:3]]
        below = [int(t) for t in np.argsort(-self.logits([(*done, roots[0])])[0], kind="stable")[:2]]
        tokens, parents = [*roots, *below][:k], [-1, -1, -1, 0, 0][:k]
        start = state.length
        state.ids[start : start + len(tokens)] = tokens
        return Proposal(state.ids[start : start + len(tokens)], None, np.asarray(parents, np.int64))

    def commit(self, state: DecodeState) -> None: ...


def _with(pack: Pack, drafter: Drafter) -> Pack:
    return Pack(pack.path, pack.manifest, pack.tokenizer, pack.backend, drafter)


def test_greedy_chains_and_tries_equal_the_target_alone(pack: Pack) -> None:
    repeated = pack.encode("x = 1\ny = 2\nx = 1\ny = 2\nx = 1\n")[:30]
    for prompt in (PROMPT, repeated):
        want = pack.generate(prompt, 24, k=0).tokens
        for k in (1, 4, None):
            assert pack.generate(prompt, 24, k=k, drafter="model").tokens == want, (prompt, k)
            assert pack.generate(prompt, 24, k=k, drafter="ngram").tokens == want, (prompt, k)
    assert pack.generate(repeated, 24, k=4, drafter="ngram").stats["proposed"] > 0


def test_greedy_trees_through_siblings_move_the_cache_rows(pack: Pack, logits: TargetLogits,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    want = pack.generate(PROMPT, 20, k=0).tokens
    tree = _with(pack, TargetTopTree(logits, len(pack.encode(PROMPT)), wrong_first=True))
    out = tree.generate(PROMPT, 20, k=4)
    assert out.tokens == want and out.stats["accepted"] > 0
    monkeypatch.setattr(StaticKVCache, "keep_rows", lambda self, start, rows: None)  # the rows left unmoved
    assert tree.generate(PROMPT, 20, k=4).tokens != want


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, top_k=20)], ids=str)
def test_sampled_trees_keep_the_distribution(pack: Pack, logits: TargetLogits, params: SamplingParams) -> None:
    exact: PartitionFor = partitions(logits, pack.eos_ids)
    k = 4  # the pack's k_max: the tree's node budget (the target's top 3, and the top 1 under the first)
    part = exact(params, k + 2, SAMPLES)
    prompt = pack.encode(PROMPT)
    samples = draw_samples(pack, TargetTopTree(logits, len(prompt)), prompt, params, k, 11, n=SAMPLES,
                           decided=part.decided)
    p = pvalue(part, samples)
    print(f"trees {params}: alpha={samples.alpha:.3f} p={p:.4g}")
    assert samples.accepted > SAMPLES // 10
    assert p > P_FAIL


def test_backends_without_trees_refuse_a_tree_pack_at_load(tree_pack_dir: Path) -> None:
    with pytest.raises(specpack.SpecpackError, match="does not run tree verify graphs yet"):
        specpack.load(tree_pack_dir, device="reference")


def test_a_fixed_tree_needs_a_tree_pack(tiny_pack: Callable[..., tuple[Path, Path, Path]]) -> None:
    """A pack without a tree verify graph: tree "auto" drafts chains, a fixed tree is refused (any n-gram width)."""
    with specpack.load(tiny_pack("qwen2", "small")[0], threads=1, ngram=NgramConfig(width=2)) as chains:
        assert chains.generate(PROMPT, 6, drafter="ngram").stats["tree"] is False
        with pytest.raises(specpack.SpecpackError, match="a fixed tree needs a pack whose verify graph takes trees"):
            chains.generate(PROMPT, 6, drafter="ngram", tree=4)


def test_greedy_tree_auto_off_and_n_equal_the_target_alone(pack: Pack) -> None:
    """tree="auto" (the policy), "off" (chains) and fixed budgets below, at and above the pack's k_max (4) up to its
    max tree nodes (16): the target alone's tokens; budgets above k_max verify more than k_max nodes in a step."""
    repeated = pack.encode("x = 1\ny = 2\nx = 1\ny = 2\nx = 1\n")[:30]
    for prompt in (PROMPT, repeated):
        want = pack.generate(prompt, 24, k=0).tokens
        for tree in ("auto", "off", 2, 8, 16):
            out = pack.generate(prompt, 24, drafter="ngram", tree=tree)
            assert out.tokens == want, (prompt, tree)
            assert out.stats["tree"] is (tree != "off")
        assert pack.generate(prompt, 24, drafter="model", tree="auto").tokens == want  # the draft model's trees
    big = pack.generate(repeated, 24, drafter="ngram", tree=16).stats
    assert big["k"] == 16 and sum(big["k_histogram"][5:]) > 0  # a verify of more than k_max nodes


def test_seeded_sampling_with_the_tree_policy_repeats(pack: Pack) -> None:
    """Sampling with a seed: the tree policy follows PriorCosts, not the clock, so the same seed gives the same tokens."""
    repeated = pack.encode("x = 1\ny = 2\nx = 1\ny = 2\nx = 1\n")[:30]
    runs = [pack.generate(repeated, 24, drafter="ngram", temperature=0.8, seed=7) for _ in range(2)]
    assert runs[0].tokens == runs[1].tokens and runs[0].stats["tree"] is True
    assert runs[0].stats["k_histogram"] == runs[1].stats["k_histogram"]


def test_trees_are_refused_clearly(pack: Pack) -> None:
    with pytest.raises(specpack.SpecpackError, match=re.escape("1..16 (this pack's max tree nodes)")):
        pack.generate(PROMPT, 6, drafter="ngram", tree=17)
    assert pack.generate(PROMPT, 6, drafter="model", tree=4).stats["tree"]  # the draft's tree form (test_model_trees.py)
    with pytest.raises(specpack.SpecpackError, match="k and a fixed tree both fix"):
        pack.generate(PROMPT, 6, drafter="ngram", tree=4, k=2)


def test_the_tree_flag(tree_pack_dir: Path) -> None:
    from click.testing import CliRunner

    from specpack.cli.main import cli

    args = ["generate", str(tree_pack_dir), "--prompt", PROMPT, "--max-new-tokens", "8", "--drafter", "ngram",
            "--threads", "1"]
    result = CliRunner().invoke(cli, [*args, "--tree", "8", "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)["stats"]
    assert stats["tree"] is True and stats["k"] == 8 and stats["k_policy"] == "fixed"
    result = CliRunner().invoke(cli, [*args, "--tree", "17"])
    assert result.exit_code == 2 and "1..16 (this pack's max tree nodes)" in result.output, result.output
    assert "Traceback" not in result.output
    result = CliRunner().invoke(cli, ["generate", "no-such-pack", "--prompt", "x", "--tree", "wide"])
    assert result.exit_code == 2 and "invalid --tree" in result.output and "no pack at" not in result.output


def test_the_greedy_form_of_the_tree_verify_is_its_greedy_branch(tree_pack_dir: Path) -> None:
    """The cuda backend captures the greedy form (graphs/greedy_form.py: the head's If inlined): for the tree head
    too, and it gives what the graph gives at temperature 0, path included."""
    import onnx
    import onnxruntime as ort

    from specpack import names
    from specpack.contract.manifest import Manifest
    from specpack.graphs.greedy_form import greedy_form

    m = Manifest.read(tree_pack_dir)
    graph = tree_pack_dir / m.target.graph.path
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(graph.parent))
    full = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    greedy = ort.InferenceSession(greedy_form(graph), opts, providers=["CPUExecutionProvider"])
    assert not any(n.op_type == "If" for n in onnx.load_from_string(greedy_form(graph)).graph.node)
    rng = np.random.default_rng(0)
    e = m.target
    for nodes in (1, 5, 16):
        parents = np.array([[rng.integers(-1, i) for i in range(nodes)]], np.int64)  # topological
        seq, past = nodes + 3, 4
        mask = np.zeros((1, m.max_len), np.int64)
        mask[0, : past + seq] = 1
        feed = {names.INPUT_IDS: rng.integers(0, m.vocab_size, (1, seq)), names.ATTENTION_MASK: mask,
                names.POSITION_IDS: np.arange(past, past + seq)[None], names.PARENTS: parents,
                names.UNIFORMS: rng.random((1, nodes + 1), dtype=np.float32),
                names.TEMPERATURE: np.zeros(1, np.float32), names.TOP_K: np.zeros(1, np.int64),
                names.TOP_P: np.ones(1, np.float32),
                **dict.fromkeys(names.kv_names(e.num_layers, "past"),
                                rng.standard_normal((1, e.kv_heads, m.max_len, e.head_dim)).astype(np.float32))}
        want = full.run([names.N_ACCEPTED, names.NEXT_TOKEN, names.PATH], feed)
        got = greedy.run([names.N_ACCEPTED, names.NEXT_TOKEN, names.PATH], feed)
        assert all((a == b).all() for a, b in zip(want, got, strict=True)), nodes
