"""`spec-export --graphs builder`: onnxruntime-genai's model builder graphs with our heads, as a normal pack.

Golden: greedy speculative tokens through the builder's graphs equal transformers' greedy `generate` of the
target alone, on the cpu backend and on the cuda backend's code (device="cpu"). Refusals: what the builder
cannot build is refused before anything is built, with what was expected and found. Needs onnxruntime-genai
(the `builder` extra); without it the pack tests skip and the "not installed" refusal is tested instead.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import specpack
from specpack.cli.main import cli, spec_export
from specpack.errors import SpecpackError
from specpack.export.pipeline import ExportConfig, export_pack

HAVE_BUILDER = importlib.util.find_spec("onnxruntime_genai") is not None
needs_builder = pytest.mark.skipif(not HAVE_BUILDER, reason="onnxruntime-genai (pip install specpack[builder]) is not "
                                   "installed: the model builder cannot run")
CASES = [("qwen2", "noisy"), ("llama", "noisy")]  # a perturbed draft: both acceptances and rejections
HEAD_DIM = 16  # GroupQueryAttention needs head_dim % 8 == 0


@pytest.fixture(scope="module")
def builder_pack(tiny_pairs, tmp_path_factory: pytest.TempPathFactory):
    """(family, draft) -> (pack_dir, target_dir): a pack exported with --graphs builder (fp32, cpu), k 4."""
    built: dict[tuple[str, str], tuple[Path, Path]] = {}

    def make(family: str, draft: str) -> tuple[Path, Path]:
        if (family, draft) not in built:
            draft_dir, target_dir = tiny_pairs(family, draft, head_dim=HEAD_DIM)
            out = tmp_path_factory.mktemp(f"builder-{family}-{draft}") / "pack"
            export_pack(str(draft_dir), str(target_dir), out,
                        ExportConfig(k=4, max_len=128, kv_cache="static", graphs="builder", isolate=False))
            built[family, draft] = (out, target_dir)
        return built[family, draft]

    return make


@needs_builder
@pytest.mark.parametrize(("family", "draft"), CASES, ids=[f"{f}-{d}" for f, d in CASES])
def test_builder_pack_greedy_equals_target_generate(builder_pack, family: str, draft: str) -> None:
    from tests.e2e.test_greedy_golden import TEXT_PROMPTS, _reference

    pack_dir, target_dir = builder_pack(family, draft)
    pack = specpack.load(pack_dir)
    for _, entry in pack.manifest.models():
        graph = entry.graph
        assert (graph.kv_cache, graph.attention, graph.positions) == ("static", "gqa", "internal")
        assert (graph.exporter, graph.execution_provider) == ("builder", "cpu")
        assert "position_ids" not in {spec.name for spec in graph.inputs}
    long_ids = np.random.default_rng(1).integers(0, pack.tokenizer.vocab_size - 8, 60).tolist()
    proposed = 0
    for prompt in [TEXT_PROMPTS[0], [3], long_ids]:
        ids = pack.encode(prompt)
        ref = _reference(target_dir, ids, 32, pack.manifest.eos_token_ids)
        for k in (0, 1, 4):
            out = pack.generate(prompt, 32, k=k)
            assert out.tokens == ref, (prompt, k)
            proposed += out.stats["proposed"]
    assert proposed
    pack.close()


@needs_builder
@pytest.mark.parametrize("method", ["int4", "int8"])
def test_builder_quantized_pack(tiny_pairs, tmp_path: Path, method: str) -> None:
    """--graphs builder with --quantize-draft/--quantize-target int4|int8: the builder's quantizer writes
    MatMulNBits at modes.py's bits and block size, the manifest records every quantized weight, and greedy
    speculative output equals the quantized target's own greedy output (k 0) at k 1 and 4."""
    from specpack.quantize import modes

    draft_dir, target_dir = tiny_pairs("qwen2", "noisy", head_dim=HEAD_DIM)
    out = export_pack(str(draft_dir), str(target_dir), tmp_path / "pack",
                      ExportConfig(k=4, max_len=128, kv_cache="static", graphs="builder", isolate=False,
                                   quantize_draft=method, quantize_target=method))
    spec = modes.SPECS[method]
    pack = specpack.load(out)
    for role, entry in pack.manifest.models():
        q = entry.quantization
        assert q is not None and q.method == method and q.block_size == spec.block_size, role
        assert q.tensors and all(t.path == f"int{spec.bits}" for t in q.tensors), q.tensors
        model = onnx.load(str(out / entry.graph.path), load_external_data=False)
        ops = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
        assert len(ops) == len(q.tensors) and not [n for n in model.graph.node if n.op_type == "MatMul"
                                                   and any(i in {t.name for t in model.graph.initializer}
                                                           for i in n.input)], role
        assert {onnx.helper.get_attribute_value(a) for n in ops for a in n.attribute if a.name == "bits"} == {spec.bits}
        assert q.model_dump()["bytes_after"] < q.model_dump()["bytes_before"]
    proposed = 0
    rng = np.random.default_rng(0)  # random prompts: a batch-variant kernel showed on 1 in 6 of them (CPU_ACCURACY_LEVEL)
    for prompt in ["def add(a, b):", [3, 7, 11], *(rng.integers(0, 300, n).tolist() for n in (2, 5, 8, 11))]:
        alone = pack.generate(prompt, 24, k=0).tokens
        for k in (1, 4):
            out_k = pack.generate(prompt, 24, k=k)
            assert out_k.tokens == alone, (prompt, k)
            proposed += out_k.stats["proposed"]
    assert proposed
    inspect = CliRunner().invoke(cli, ["inspect", str(out)])
    assert inspect.exit_code == 0 and f"target: {method} weight-only" in inspect.output, inspect.output
    assert "different model" in inspect.output, inspect.output
    pack.close()


@needs_builder
def test_cuda_backend_code_runs_builder_packs(builder_pack) -> None:
    """The cuda backend's code on the CPU EP feeds the same inputs: the same greedy and sampled tokens as the
    cpu backend (same seed)."""
    from specpack.contract.manifest import Manifest
    from specpack.runtime.backend import BackendOptions
    from specpack.runtime.backends.cuda import CudaBackend
    from specpack.runtime.pack import Pack
    from specpack.runtime.tokenizer import PackTokenizer

    pack_dir, _ = builder_pack(*CASES[0])
    manifest = Manifest.read(pack_dir)
    dev = Pack(pack_dir, manifest, PackTokenizer.load(pack_dir / "tokenizer"),
               CudaBackend(pack_dir, manifest, BackendOptions(), device="cpu"))
    cpu = specpack.load(pack_dir)
    for kwargs in ({}, {"temperature": 1.0, "seed": 7}):
        for k in (0, 3):
            assert dev.generate("def add(a, b):", 24, k=k, **kwargs).tokens == \
                cpu.generate("def add(a, b):", 24, k=k, **kwargs).tokens, (kwargs, k)
    dev.close()
    cpu.close()


@needs_builder
def test_cpu_backend_refuses_graphs_built_for_cuda(builder_pack, tmp_path: Path) -> None:
    """A builder pack whose manifest says its graphs were built for CUDA is refused on --device cpu by name."""
    import shutil

    pack_dir = tmp_path / "pack"
    shutil.copytree(builder_pack(*CASES[0])[0], pack_dir)
    manifest = json.loads((pack_dir / "manifest.json").read_text())
    for role in ("draft", "target"):
        manifest[role]["graph"]["execution_provider"] = "cuda"
    (pack_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SpecpackError, match="built for the CUDA execution provider") as err:
        specpack.load(pack_dir)
    assert "--device cuda" in str(err.value), err.value


@needs_builder
def test_inspect_names_the_builder(builder_pack) -> None:
    result = CliRunner().invoke(cli, ["inspect", str(builder_pack(*CASES[0])[0])])
    assert result.exit_code == 0, result.output
    assert "model builder" in result.output and "positions internal" in result.output, result.output


@needs_builder
def test_sampled_tokens_equal_the_oracle(builder_pack) -> None:
    """Sampling through the builder graphs' heads draws what the numpy oracle draws from the same graph's logits
    (the reference backend: no KV cache, every prefix recomputed), speculative and not, same seed. The
    chi-square test (tests/e2e/test_sampling_distribution.py) establishes that the oracle's output is the target's
    distribution; it is not repeated here (minutes of CPU for 10,000 samples per setting)."""
    pack_dir, _ = builder_pack(*CASES[1])
    cpu, ref = specpack.load(pack_dir, threads=1), specpack.load(pack_dir, device="reference", threads=1)
    for params in ({"temperature": 1.0}, {"temperature": 0.7, "top_k": 20, "top_p": 0.9}):
        for k in (0, 3):
            for seed in (1, 2):
                got = cpu.generate("def add(a, b):", 16, k=k, seed=seed, **params).tokens
                assert got == ref.generate("def add(a, b):", 16, k=k, seed=seed, **params).tokens, (params, k, seed)
    cpu.close()
    ref.close()


def test_manifest_positions_are_strict() -> None:
    """positions "internal" needs the static cache and no position_ids input; "inputs" needs position_ids;
    a graph input the runtime does not feed is refused."""
    from specpack.contract.manifest import parse_manifest
    from tests.deploy.manifests import valid_manifest

    def parse(mutate) -> None:
        data = valid_manifest()
        mutate(data["target"]["graph"])
        parse_manifest(json.dumps(data).encode())

    def drop_positions(graph: dict) -> None:
        graph["inputs"] = [s for s in graph["inputs"] if s["name"] != "position_ids"]

    with pytest.raises(SpecpackError, match=r"lacks.*position_ids"):
        parse(drop_positions)
    with pytest.raises(SpecpackError, match="needs kv_cache 'static'"):
        parse(lambda g: (drop_positions(g), g.update(positions="internal")))
    with pytest.raises(SpecpackError, match=r"does not feed.*position_ids"):
        parse(lambda g: g.update(positions="internal", kv_cache="static"))
    with pytest.raises(SpecpackError, match=r"does not feed.*extra"):
        parse(lambda g: g["inputs"].append({"name": "extra", "dtype": "int64", "shape": [1]}))
    with pytest.raises(SpecpackError, match="execution_provider"):
        parse(lambda g: g.update(exporter="builder"))
    parse(lambda g: (drop_positions(g), g.update(positions="internal", kv_cache="static", attention="gqa",
                                                 exporter="builder", execution_provider="cuda")))


# ------------------------------------------------------------------------------------------------- refusals


def _export(tmp_path: Path, draft: Path | str, target: Path | str, *options: str) -> tuple[int, str]:
    result = CliRunner().invoke(spec_export, ["--draft", str(draft), "--target", str(target),
                                              "-o", str(tmp_path / "p"), "--graphs", "builder", *options])
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes else "")


@pytest.mark.parametrize(("options", "fragments"), [
    (["--kv-cache", "concat"], ["--kv-cache concat", "expected: --kv-cache static"]),
    (["--attention", "standard"], ["--attention standard"]),
    (["--form", "tensorrt"], ["--form tensorrt"]),
    (["--quantize-target", "fp8", "--calib-prompts", "p.jsonl"], ["does not write fp8", "--quantize-target none | int4"]),
    (["--dtype", "fp16"], ["no FP16 CPU build", "--dtype fp16 --ep cuda"]),
    (["--dtype", "fp32", "--ep", "cuda"], ["refuses fp32 GroupQueryAttention"]),
    (["--dtype", "bf16", "--ep", "cuda"], ["bf16"]),
])
def test_cli_refuses_what_the_builder_cannot_build(tmp_path: Path, options: list[str], fragments: list[str]) -> None:
    code, text = _export(tmp_path, tmp_path / "d", tmp_path / "t", *options)
    assert code == 2, text
    for fragment in ["expected", "found", *fragments]:
        assert fragment in text, text
    assert not (tmp_path / "p").exists()


def test_cli_refuses_ep_without_builder(tmp_path: Path) -> None:
    result = CliRunner().invoke(spec_export, ["--draft", "d", "--target", "t", "-o", str(tmp_path / "p"),
                                              "--ep", "cuda", "--dtype", "fp16"])
    assert result.exit_code == 2 and "--graphs builder --ep cuda" in result.output, result.output


def test_cli_refuses_when_the_builder_is_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       tiny_pairs) -> None:
    draft, target = tiny_pairs("qwen2", head_dim=HEAD_DIM)
    monkeypatch.setitem(sys.modules, "onnxruntime_genai.models.builder", None)  # import raises ImportError
    code, text = _export(tmp_path, draft, target)
    assert code == 2, text
    assert "needs onnxruntime-genai" in text and "pip install specpack[builder]" in text, text


@needs_builder
def test_cli_refuses_unsupported_families_and_gguf_blocks(tmp_path: Path, tiny_pairs) -> None:
    draft, target = tiny_pairs("gpt2")
    code, text = _export(tmp_path, draft, target)
    assert code == 2 and "does not support the draft's architecture" in text and "GPT2LMHeadModel" in text, text
    assert "--graphs torch" in text
    config = ExportConfig(kv_cache="static", graphs="builder")
    with pytest.raises(SpecpackError, match="--dequantize"):
        config.quantization("target", "model.gguf")
    assert ExportConfig(kv_cache="static", graphs="builder", dequantize=True).quantization("target", "m.gguf") == "none"
