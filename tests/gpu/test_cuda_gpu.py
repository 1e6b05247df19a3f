"""The cuda backend on a GPU (ONNX Runtime's CUDA EP, captured CUDA graphs). Marked `gpu`: skipped where the
CUDA execution provider is missing; run on the test GPU (bench/README.md, "GPU").

    greedy    speculative tokens (k = 1, 4, 8, auto) == the target alone (k = 0) on the same GPU, for an fp32 pack (standard
              attention) and an fp16 pack (GroupQueryAttention, whose greedy sessions must capture CUDA graphs)
    plain     temperature-only sampling on the plain sampling form, captured: the exported form's tokens
    sampling  chi-square of speculative samples against the target's exact distribution (tests/e2e's partitions), at
              the slow set's 10,000 samples, with the model drafter and with prompt lookup; the latter also with the
              backend's one-hot q of deterministic drafts misplaced, which the same test must reject
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest

import specpack
from specpack.graphs import oracle
from specpack.runtime.pack import Pack
from specpack.sampling import SamplingParams

ort = pytest.importorskip("onnxruntime")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                                                  reason="needs ONNX Runtime's CUDA execution provider and a GPU")]


FORMS = [("fp32", "standard"), ("fp16", "gqa")]  # fp32 in the standard form: the CUDA EP's GQA is fp16 / bf16


@pytest.mark.parametrize(("dtype", "attention"), FORMS, ids=[f"{d}-{a}" for d, a in FORMS])
def test_greedy_on_the_gpu_equals_the_target_alone(tiny_pairs, tmp_path_factory, dtype: str, attention: str) -> None:
    from specpack.export.config import ExportConfig
    from specpack.export.pipeline import export_pack

    draft_dir, target_dir = tiny_pairs("qwen2", "noisy", head_dim=16)
    greedy_pack = tmp_path_factory.mktemp(f"gpu-{dtype}-{attention}") / "pack"
    export_pack(str(draft_dir), str(target_dir), greedy_pack,
                ExportConfig(k=8, dtype=dtype, kv_cache="static", attention=attention, isolate=False))
    gpu = specpack.load(greedy_pack, device="cuda")
    cpu = specpack.load(greedy_pack) if dtype == "fp32" else None
    long_ids = np.random.default_rng(3).integers(0, gpu.tokenizer.vocab_size - 8, 80).tolist()
    same_as_cpu = 0
    for prompt in ["def add(a, b):", "Hello", [5], long_ids]:
        alone = gpu.generate(prompt, 40, k=0).tokens
        if cpu is not None:  # informative only: CUDA and CPU kernels round apart
            same_as_cpu += alone == cpu.generate(prompt, 40, k=0).tokens
        for k in (1, 4, 8, None):  # None: adaptive k, whose k = 0 steps leave the draft catching up (chunked runs)
            assert gpu.generate(prompt, 40, k=k).tokens == alone, (prompt, k)
    report = gpu.backend.capture_report()  # type: ignore[attr-defined]
    print(f"{dtype} {attention}: target alone on the GPU == on the CPU: "
          f"{same_as_cpu if cpu is not None else 'n/a'} of 4 prompts; {report}")
    if attention == "gqa":  # the fp32 standard-form graph was not captured on the H200 (nodes left on the CPU)
        assert report["target"]["capture"] and report["target"]["captured_graphs"] >= 2, report
        assert report["draft"]["capture"] and report["draft"]["captured_graphs"] >= 1, report


def test_plain_sampling_is_captured_on_the_gpu(tiny_pairs, tmp_path_factory) -> None:
    """Temperature-only requests on an fp16 pack run on the plain sampling form (graphs/sampling_form.py), captured:
    both models' plain sessions capture graphs, and the tokens equal the graph as exported's for the same seeds
    (asserted: the same kernels on the same inputs; the chi-square below covers the distribution)."""
    from specpack.export.config import ExportConfig
    from specpack.export.pipeline import export_pack

    draft_dir, target_dir = tiny_pairs("qwen2", "noisy", head_dim=16)
    pack_dir = tmp_path_factory.mktemp("gpu-plain") / "pack"
    export_pack(str(draft_dir), str(target_dir), pack_dir,
                ExportConfig(k=8, dtype="fp16", kv_cache="static", attention="gqa", isolate=False))
    plain, exported = specpack.load(pack_dir, device="cuda"), specpack.load(pack_dir, device="cuda")
    for engine in (exported.backend.target().engine, exported.backend.draft().engine):  # type: ignore[attr-defined]
        engine.plain_error = "off: this test's baseline"
    for seed, (prompt, k) in enumerate([("def add(a, b):", 4), ("Hello", 8), ([5], None), ("def add(a, b):", 2)]):
        sampled = {"temperature": 0.8, "seed": seed}
        got = plain.generate(prompt, 40, k=k, **sampled).tokens  # type: ignore[arg-type]
        assert got == exported.generate(prompt, 40, k=k, **sampled).tokens, (prompt, k)  # type: ignore[arg-type]
    report = plain.backend.capture_report()  # type: ignore[attr-defined]
    print(f"fp16 gqa plain sampling: {report}")
    for label in ("target plain", "draft plain"):
        assert report[label]["capture"] and report[label]["captured_graphs"] >= 1, report


SAMPLING = [SamplingParams(1.0), SamplingParams(1.0, top_p=0.8)]  # the first on the plain form, the second as exported


@pytest.fixture(scope="module")
def sampling_dirs(tiny_pack) -> tuple[Path, Path, Path]:
    return tiny_pack("qwen2", "noisy", kv_cache="static", attention="standard")


@pytest.mark.parametrize("params", SAMPLING, ids=lambda p: f"T{p.temperature:g}-topp{p.top_p:g}")
def test_sampling_on_the_gpu_has_the_targets_distribution(sampling_dirs: tuple[Path, Path, Path],
                                                          params: SamplingParams) -> None:
    from tests.distribution import ExactPartition, chi_square_pvalue
    from tests.e2e.test_sampling_distribution import P_FAIL, SLOW_SAMPLES, TargetLogits, draw_samples

    pack: Pack = specpack.load(sampling_dirs[0], device="cuda")
    prompt = pack.encode("def add(a, b):")
    logits = TargetLogits(sampling_dirs[2], prompt)
    k = 3

    @cache
    def partition(length: int) -> ExactPartition:
        return ExactPartition.build(lambda prefixes: oracle.transform(logits(prefixes), params), length,
                                    pack.eos_ids, SLOW_SAMPLES)

    part = partition(k + 2)
    samples = draw_samples(pack, pack.drafter, prompt, params, k, seed=11, n=SLOW_SAMPLES, decided=part.decided)
    p = chi_square_pvalue([part.bin_of(s) for s in samples.continuations], part.probs)
    print(f"cuda T={params.temperature} top_p={params.top_p} k={k}: alpha={samples.alpha:.3f} p={p:.4g}")
    assert 0.2 < samples.alpha < 0.95
    assert p > P_FAIL




@pytest.mark.parametrize("broken", [False, True], ids=["honest", "misplaced-one-hot"])
def test_ngram_sampling_on_the_gpu_has_the_targets_distribution(sampling_dirs: tuple[Path, Path, Path], broken: bool,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Prompt lookup (q one-hot, built on the host by runtime/target.py, uploaded by the engine) through the cuda
    backend; broken: the uploaded one-hot rows put on the next token id instead of the drafted one (the defect
    class of a deterministic proposal's q), which the same test, at the same size and seed, must reject."""
    from specpack.runtime.backends.cuda import DeviceTarget
    from tests.distribution import ExactPartition, chi_square_pvalue
    from tests.e2e.test_sampling_distribution import (
        NGRAM_SETTINGS,
        P_FAIL,
        SAMPLES,
        TargetLogits,
        build_ngram_prompt,
        ngram_samples,
    )

    pack: Pack = specpack.load(sampling_dirs[0], device="cuda")
    prompt = build_ngram_prompt(pack, sampling_dirs[2], pack.encode("def add(a, b):"))
    (params, k), = NGRAM_SETTINGS
    logits = TargetLogits(sampling_dirs[2], prompt)
    part = ExactPartition.build(lambda prefixes: oracle.transform(logits(prefixes), params), pack.manifest.k_max + 2,
                                pack.eos_ids, SAMPLES)
    if broken:
        upload = DeviceTarget.upload_q

        def misplaced(self: DeviceTarget, slot: int, host_q: np.ndarray, k: int) -> object:
            return upload(self, slot, np.roll(host_q, 1, axis=-1), k)  # each row one-hot on the next token

        monkeypatch.setattr(DeviceTarget, "upload_q", misplaced)
    samples = ngram_samples(pack, prompt, part, params, k, SAMPLES)
    p = chi_square_pvalue([part.bin_of(s) for s in samples.continuations], part.probs)
    print(f"cuda ngram {'misplaced one-hot' if broken else 'honest'}: proposed={samples.proposed} "
          f"alpha={samples.alpha:.3f} p={p:.4g}")
    assert (p < P_FAIL) if broken else (p > P_FAIL and samples.accepted >= SAMPLES // 100)


@pytest.fixture(scope="module")
def head_dirs(tiny_head_pack) -> tuple[Path, Path, Path]:
    return tiny_head_pack("qwen2", kv_cache="static", dtype="fp16", attention="standard")  # head_dim 12: no GQA


def test_the_head_on_the_gpu_drafts_the_targets_greedy_tokens(head_dirs: tuple[Path, Path, Path]) -> None:
    """The draft head (fp16, static form) on the CUDA EP: the target alone's tokens at every k, the verify and the
    head's runs captured as CUDA graphs (the features cache and the head's rows read in place: no host copy)."""
    pack = specpack.load(head_dirs[0], device="cuda")
    long_ids = np.random.default_rng(4).integers(0, pack.tokenizer.vocab_size - 8, 60).tolist()
    for prompt in ["def add(a, b):", [5], long_ids]:
        alone = pack.generate(prompt, 40, k=0).tokens
        for k in (1, 4, None):
            assert pack.generate(prompt, 40, k=k, drafter="head").tokens == alone, (prompt, k)
    report = pack.backend.capture_report()  # type: ignore[attr-defined]
    print(f"head fp16 standard: {report}")
    assert report["target"]["capture"] and report["draft"]["capture"], report
    assert report["draft"]["captured_graphs"] >= 2, report


@pytest.mark.parametrize("broken", [False, True], ids=["honest", "tempered-q"])
def test_head_sampling_on_the_gpu_has_the_targets_distribution(head_dirs: tuple[Path, Path, Path],
                                                               broken: bool) -> None:
    """tests/runtime/test_cuda_head.py's chi-square on the CUDA EP: the head's q as it drew its drafts, and the same
    q tempered (read back, squared, renormalized), which the same test must reject."""
    from tests.e2e.test_sampling_distribution import P_FAIL
    from tests.runtime.test_cuda_head import device_head_pvalue

    pack = specpack.load(head_dirs[0], device="cuda")
    p = device_head_pvalue(pack, head_dirs, broken)
    assert (p < P_FAIL) if broken else (p > P_FAIL)


REPEATED = "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\n"  # prompt lookup finds several matches: tries of width > 1


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_trees_on_the_gpu_give_the_targets_greedy_tokens(tiny_export, dtype: str) -> None:
    """A tree pack (16 nodes, standard attention) on the CUDA EP: the target alone's tokens through the tree verify
    graph with k 0 (a chain of no nodes), chains, n-gram tries sized by the policy and fixed sizes; the cache's
    accepted path moved on the device (kv_compact.onnx); the verify and the compaction captured as CUDA graphs."""
    pack_dir = tiny_export("qwen2", None, k=4, max_len=64, kv_cache="static", drafter="ngram", max_tree_nodes=16,
                           dtype=dtype)
    pack = specpack.load(pack_dir, device="cuda")
    try:
        for prompt in [REPEATED, "def add(a, b):"]:
            alone = pack.generate(prompt, 32, k=0, tree="off").tokens
            for k, tree in ((4, "off"), (None, "off"), (None, "auto"), (None, 8), (None, 16)):
                got = pack.generate(prompt, 32, k=k, drafter="ngram", tree=tree)
                assert got.tokens == alone, (prompt, k, tree)
        report = pack.backend.capture_report()  # type: ignore[attr-defined]
        print(f"trees {dtype}: {report}")
        # both captured: kv_compact.onnx was refused on an H200 while a shape value entered its data (2026-11-28)
        assert report["target"]["refused"] is None and report["target"]["captured_graphs"] > 0, report
        assert report.get("kv_compact", {}).get("refused") is None, report
    finally:
        pack.close()


MODEL_TREE_FORMS = {"fp32": {"dtype": "fp32", "attention": "standard"}, "fp16": {"dtype": "fp16", "attention": "gqa"}}


@pytest.mark.parametrize("form", list(MODEL_TREE_FORMS))
def test_model_trees_on_the_gpu_give_the_targets_greedy_tokens(tiny_export, form: str) -> None:
    """A tree pack with a draft model in its tree form (--draft --max-tree-nodes 16; fp32 standard attention, or fp16
    GroupQueryAttention with the tree's attention_bias in the draft too) on the CUDA EP: the target alone's tokens with
    the draft model's trees (auto and fixed sizes; its expansions pre-captured per W) and its chains through the tree
    form; the draft's greedy session captured (fp16)."""
    pack_dir = tiny_export("qwen2", "noisy", {"head_dim": 16}, k=4, max_len=64, kv_cache="static", max_tree_nodes=16,
                           **MODEL_TREE_FORMS[form])
    pack = specpack.load(pack_dir, device="cuda")
    try:
        accepted = 0
        for prompt in ["def add(a, b):", [5]]:
            alone = pack.generate(prompt, 32, k=0, tree="off").tokens
            for k, tree in ((2, "off"), (None, "auto"), (None, 4), (None, 16)):
                got = pack.generate(prompt, 32, k=k, drafter="model", tree=tree)
                assert got.tokens == alone, (prompt, k, tree)
                accepted += got.stats["accepted"]
        report = pack.backend.capture_report()  # type: ignore[attr-defined]
        print(f"model trees {form}: accepted {accepted}, {report}")
        assert accepted > 0
        if MODEL_TREE_FORMS[form]["dtype"] == "fp16":  # the fp32 standard form's capture is not asserted (above)
            assert report["draft"]["capture"] and report["draft"]["refused"] is None, report
        assert report.get("kv_compact", {}).get("refused") is None, report
    finally:
        pack.close()


HEAD_TREE_FORMS = {"fp32": {"dtype": "fp32", "attention": "standard"}, "fp16": {"dtype": "fp16", "attention": "standard"},
                   "builder-fp16": {"dtype": "fp16", "head_dim": 16, "graphs": "builder", "execution_provider": "cuda"}}


@pytest.mark.parametrize("form", list(HEAD_TREE_FORMS))
def test_head_trees_on_the_gpu_give_the_targets_greedy_tokens(tiny_head_pack, form: str) -> None:
    """A head tree pack (--draft-head --max-tree-nodes 16; torch graphs with standard attention, or the model
    builder's) on the CUDA EP: the target alone's tokens with the head's trees (auto and fixed sizes; the greedy tree
    runs captured per (C, W), the features rows moved by kv_compact.onnx) and its chains through the tree form."""
    if HEAD_TREE_FORMS[form].get("graphs") == "builder":
        pytest.importorskip("onnxruntime_genai")
    pack_dir = tiny_head_pack("qwen2", kv_cache="static", max_tree_nodes=16, **HEAD_TREE_FORMS[form])[0]
    pack = specpack.load(pack_dir, device="cuda")
    try:
        for prompt in ["def add(a, b):", [5]]:
            alone = pack.generate(prompt, 32, k=0, tree="off").tokens
            for k, tree in ((2, "off"), (None, "auto"), (None, 4), (None, 16)):
                got = pack.generate(prompt, 32, k=k, drafter="head", tree=tree)
                assert got.tokens == alone, (prompt, k, tree)
        report = pack.backend.capture_report()  # type: ignore[attr-defined]
        print(f"head trees {form}: {report}")
        if HEAD_TREE_FORMS[form]["dtype"] == "fp16":  # the fp32 standard form's capture is not asserted (above)
            assert report["draft"]["capture"] and report["draft"]["refused"] is None, report
        assert report.get("kv_compact", {}).get("refused") is None, report
    finally:
        pack.close()


@pytest.fixture(scope="module")
def builder_head_dirs(tiny_head_pack) -> tuple[Path, Path, Path]:
    """A head pack on the model builder's fp16 CUDA graphs (GroupQueryAttention: head_dim 16)."""
    pytest.importorskip("onnxruntime_genai")
    return tiny_head_pack("qwen2", kv_cache="static", head_dim=16, graphs="builder", dtype="fp16",
                          execution_provider="cuda")


def test_the_head_on_builder_graphs_drafts_the_targets_greedy_tokens(builder_head_dirs: tuple[Path, Path, Path]
                                                                       ) -> None:
    """The head pack whose target is the model builder's graph (features cache added) on the CUDA EP: the target
    alone's tokens at every k, both graphs captured."""
    pack = specpack.load(builder_head_dirs[0], device="cuda")
    try:
        long_ids = np.random.default_rng(4).integers(0, pack.tokenizer.vocab_size - 8, 60).tolist()
        accepted = 0
        for prompt in ["def add(a, b):", [5], long_ids]:
            alone = pack.generate(prompt, 40, k=0).tokens
            for k in (1, 4, None):
                got = pack.generate(prompt, 40, k=k, drafter="head")
                assert got.tokens == alone, (prompt, k)
                accepted += got.stats["accepted"]
        report = pack.backend.capture_report()  # type: ignore[attr-defined]
        print(f"builder head fp16: {report}, accepted {accepted}")
        assert accepted > 0 and report["target"]["capture"] and report["draft"]["capture"], report
    finally:
        pack.close()
