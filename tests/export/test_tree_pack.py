"""spec-export --max-tree-nodes: the forms it is refused for (exit 2: expected / found / hint), which draft models get
the tree form, and a tiny tree pack's manifest (the tree record, kv_compact.onnx listed and hashed, verify.onnx's I/O,
the draft's tree_width)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from specpack import names
from specpack.cli.main import spec_export
from specpack.contract.manifest import Manifest
from specpack.errors import SpecpackError
from specpack.export.config import ExportConfig


@pytest.mark.parametrize(("options", "found"), [
    ({"kv_cache": "concat"}, "--kv-cache concat"),
    ({"kv_cache": "static", "form": "tensorrt"}, "--form tensorrt"),
])
def test_tree_refused_for_other_forms(options: dict[str, str], found: str) -> None:
    with pytest.raises(SpecpackError, match="--max-tree-nodes") as err:
        ExportConfig(max_tree_nodes=8, **options)  # type: ignore[arg-type]
    assert err.value.found == found and err.value.hint and "not built yet" in err.value.hint


def test_head_trees_accepted_on_builder_graphs(tmp_path: Path) -> None:
    """A head's tree pack on the builder's graphs (its tree form with the features cache: test_builder_head_tree.py)."""
    config = ExportConfig(max_tree_nodes=8, kv_cache="static", graphs="builder", draft_head=tmp_path)  # type: ignore[arg-type]
    assert config.max_tree_nodes == 8 and config.graphs == "builder"


@pytest.mark.parametrize("nodes", [-1, 65, True])
def test_tree_nodes_out_of_range(nodes: object) -> None:
    with pytest.raises(SpecpackError, match="invalid --max-tree-nodes"):
        ExportConfig(max_tree_nodes=nodes, kv_cache="static")  # type: ignore[arg-type]


def test_cli_refuses_concat_trees(tmp_path: Path, tiny_pairs) -> None:
    draft, target = tiny_pairs("qwen2")
    result = CliRunner().invoke(spec_export, ["--draft", str(draft), "--target", str(target), "-o", str(tmp_path / "p"),
                                              "--kv-cache", "concat", "--max-tree-nodes", "8"])
    text = result.output + (result.stderr if result.stderr_bytes else "")
    assert result.exit_code == 2 and "Traceback" not in text, text
    for fragment in ("--max-tree-nodes", "expected", "--kv-cache static", "found", "--kv-cache concat", "hint"):
        assert fragment in text, text
    assert not (tmp_path / "p").exists()


@pytest.mark.slow  # a whole tiny export, both models (about 35 s on the shared 2-core VM)
def test_tree_pack_manifest(tiny_export) -> None:
    pack = tiny_export("qwen2", "small", k=4, max_len=64, kv_cache="static", max_tree_nodes=16)
    manifest = Manifest.read(pack)
    graph = manifest.target.graph
    assert graph.tree is not None and graph.tree.max_nodes == 16 and graph.tree.rules == ["greedy", "deterministic"]
    assert graph.kv_cache == "static" and manifest.draft.graph.tree is None
    draft = manifest.draft  # the draft model in its tree form (docs/trees.md, "Trees drafted by the draft model")
    assert draft.tree_width == 8 and manifest.target.tree_width == 0
    assert [s.name for s in draft.graph.inputs][3:5] == [names.DRAFT_POSITIONS, names.DRAFT_MASK]
    assert {s.name for s in draft.graph.outputs} >= {names.TREE_TOKENS, names.TREE_LOGPROBS}
    assert names.KV_COMPACT_FILE in {f.path for f in manifest.files} and names.KV_COMPACT_FILE in manifest.loaded_files()
    inputs = {s.name: s for s in graph.inputs}
    assert inputs[names.PARENTS].shape == [1, "tree_nodes"] and names.DRAFT_PROBS not in inputs
    assert {s.name for s in graph.outputs} >= {names.N_ACCEPTED, names.NEXT_TOKEN, names.PATH}
    onnx.checker.check_model(str(pack / names.KV_COMPACT_FILE))
    # a chain pack of the same pair has none of it
    chain = Manifest.read(tiny_export("qwen2", "small", k=4, max_len=64, kv_cache="static"))
    assert chain.target.graph.tree is None and names.PARENTS not in {s.name for s in chain.target.graph.inputs}
    assert chain.draft.tree_width == 0 and names.DRAFT_MASK not in {s.name for s in chain.draft.graph.inputs}


@pytest.mark.parametrize(("options", "width"), [
    ({"max_tree_nodes": 16}, 8), ({"max_tree_nodes": 3}, 3),  # K = TREE_WIDTH_MAX, at most the nodes
    ({"max_tree_nodes": 0}, 0),  # no tree verify graph: the draft's chain form
    ({"max_tree_nodes": 16, "graphs": "builder"}, 8),  # the builder's draft too (builder_tree.add_draft_tree_form)
    ({"max_tree_nodes": 16, "drafter": "ngram"}, 0),  # no draft model
])
def test_which_drafts_get_the_tree_form(options: dict[str, object], width: int) -> None:
    assert ExportConfig(kv_cache="static", **options).draft_tree_width(256) == width  # type: ignore[arg-type]
    assert ExportConfig(kv_cache="static", max_tree_nodes=16).draft_tree_width(5) == 5  # at most the vocabulary


def test_tree_refuses_a_sliding_window_that_binds() -> None:
    """A window counted in cache rows would cut a tree node's keys wrongly: refused, unless no context reaches it."""
    from types import SimpleNamespace

    from specpack.export.static_attention import _check_tree_window

    module = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=256))
    _check_tree_window(module, 4096)  # type: ignore[arg-type]  # Mistral's default on a short-context model
    with pytest.raises(SpecpackError, match="sliding-window") as err:
        _check_tree_window(module, 128)  # type: ignore[arg-type]
    assert err.value.found == "sliding_window 128"
