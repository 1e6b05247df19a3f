"""The tensorrt graph form (`--form tensorrt`) end to end on ONNX Runtime's CPU EP, on tiny packs:

- every node of both graphs passes TensorRT's ONNX operator support (tests/graphs/trt_ops.py), and the ORT
  form's heads do not (the check is not vacuous);
- every input shape is one an optimization profile can express: batch 1, named dynamic dimensions;
- greedy speculative tokens equal transformers' greedy `generate` of the target alone;
- sampled speculative continuations pass a chi-square against the target's exact distribution.

The packs run through tests/static_loop.py (static cache sessions), not runtime/.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import cache
from pathlib import Path

import numpy as np
import onnx
import pytest

from specpack.errors import SpecpackError
from specpack.export.config import ExportConfig
from specpack.graphs import heads, oracle
from specpack.sampling import SamplingParams
from tests.distribution import Continuation, ExactPartition, chi_square_pvalue
from tests.graphs.trt_ops import problems, walk_nodes
from tests.static_loop import StaticPackLoop

PAIRS = [("qwen2", "noisy", {}), ("llama", "small", {"head_dim": 20})]
DYNAMIC_DIMS = {"sequence_length", "max_sequence_length", "k", "k_plus_1"}
PROMPTS = [[3], [5, 17, 42, 9, 100, 7], list(range(20, 80))]
P_FAIL = 1e-3
SAMPLES = 2000
# top-p in CI (its threshold path is the one TensorRT's form changes most); the others marked slow
SETTINGS = [SamplingParams(1.0, top_p=0.8), pytest.param(SamplingParams(1.0), marks=pytest.mark.slow),
            pytest.param(SamplingParams(0.5, top_k=5), marks=pytest.mark.slow)]
K, LENGTH = 3, 2  # drafts per step; continuation tokens binned (the first step verifies all K drafts)

Pair = tuple[str, str, dict[str, int]]


@pytest.fixture(scope="module")
def trt_pack(tiny_pairs: Callable[..., tuple[Path, Path]], tmp_path_factory: pytest.TempPathFactory,
             shared_plain_exports: Callable[[], AbstractContextManager[None]]) -> Callable[[Pair], tuple[Path, Path]]:
    """(family, draft, pair options) -> (tensorrt-form pack, target dir); each model's plain graph exported once for
    this module (test_quantized_tensorrt_form_pack's pack has the same: conftest.py, shared_plain_exports)."""

    @cache
    def make(family: str, draft: str, options: tuple[tuple[str, int], ...]) -> tuple[Path, Path]:
        from specpack.export.pipeline import export_pack

        draft_dir, target_dir = tiny_pairs(family, draft, **dict(options))
        out = tmp_path_factory.mktemp(f"trt-{family}-{draft}") / "pack"
        with shared_plain_exports():
            export_pack(str(draft_dir), str(target_dir), out,
                        ExportConfig(k=8, kv_cache="static", form="tensorrt", isolate=False))
        return out, target_dir

    return lambda pair: make(pair[0], pair[1], tuple(sorted(pair[2].items())))


def _graphs(pack: Path) -> list[onnx.ModelProto]:
    return [onnx.load(str(pack / name), load_external_data=False) for name in ("draft_step.onnx", "verify.onnx")]


@pytest.mark.parametrize("pair", PAIRS, ids=[f"{f}-{d}" for f, d, _ in PAIRS])
def test_every_node_is_supported_by_tensorrt(trt_pack: Callable[[Pair], tuple[Path, Path]], pair: Pair) -> None:
    pack, _ = trt_pack(pair)
    for model in _graphs(pack):
        assert problems(model) == []
        ops = Counter(node.op_type for node, _ in walk_nodes(model.graph))
        assert ops["TopK"] == 1 and ops["Loop"] == 2 and ops["MatMul"] > 0  # heads and the forward are both here
    assert any(n.op_type == "ScatterND" for n, _ in walk_nodes(_graphs(pack)[1].graph))  # the static cache write


def test_onnxruntime_form_heads_fail_the_check() -> None:
    found = problems(heads.verify_head_model(vocab=151_936))
    assert any("DOUBLE" in p for p in found) and any("less than 3840" in p for p in found)
    assert any("`sorted` must be 1" in p for p in found)


@pytest.mark.parametrize("pair", PAIRS[:1], ids=["qwen2-noisy"])
def test_shapes_fit_an_optimization_profile(trt_pack: Callable[[Pair], tuple[Path, Path]], pair: Pair) -> None:
    """Batch 1, every other dimension a number or one of the named dynamic sizes (S, M, k, k + 1)."""
    pack, _ = trt_pack(pair)
    for model in _graphs(pack):
        for value in [*model.graph.input, *model.graph.output]:
            dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]
            assert all((isinstance(d, int) and d > 0) or d in DYNAMIC_DIMS for d in dims), (value.name, dims)
            if len(dims) > 1:
                assert dims[0] == 1, (value.name, dims)
    manifest = json.loads((pack / "manifest.json").read_text())
    for role in ("draft", "target"):
        graph = manifest[role]["graph"]
        assert (graph["kv_cache"], graph["attention"], graph["heads"]) == ("static", "standard", "tensorrt")


def _reference(target_dir: Path, ids: list[int], max_new: int, eos: list[int]) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=max_new, do_sample=False, eos_token_id=eos, pad_token_id=eos[0])
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("pair", PAIRS, ids=[f"{f}-{d}" for f, d, _ in PAIRS])
def test_greedy_equals_target_generate(trt_pack: Callable[[Pair], tuple[Path, Path]], pair: Pair) -> None:
    pack, target_dir = trt_pack(pair)
    loop = StaticPackLoop(pack)
    eos = sorted(loop.eos)
    for prompt in PROMPTS:
        ref = _reference(target_dir, prompt, 30, eos)
        for k in (1, 3, 8):
            assert loop.generate(prompt, 30, k, SamplingParams(0.0)) == ref, (prompt, k)


class MisalignedQ(StaticPackLoop):
    """Broken on purpose: q's rows one draft late (row i holds the distribution draft i + 1 was drawn from), as a
    loop that writes each step's q one row off would pass it to the verify."""

    def _propose(self, ids: list[int], k: int, sampling: dict[str, np.ndarray], rng: np.random.Generator
                 ) -> tuple[list[int], np.ndarray]:
        drafts, q = super()._propose(ids, k, sampling, rng)  # q [1, k, V]
        return drafts, np.concatenate([q[:, 1:], q[:, -1:]], axis=1)


def _trt_form_pvalue(pack: Path, target_dir: Path, params: SamplingParams, loop_type: type[StaticPackLoop]) -> float:
    """SAMPLES continuations of K + 2 tokens (so the first step verifies K drafts), binned by their first LENGTH
    tokens, against exact probabilities from the target's transformers model and the oracle: chi-square p."""
    import torch
    from transformers import AutoModelForCausalLM

    loop = loop_type(pack)
    prompt = PROMPTS[1]
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()

    def next_probs(prefixes: list[Continuation]) -> np.ndarray:
        with torch.inference_mode():
            ids = torch.tensor([[*prompt, *s] for s in prefixes])  # [N, S] equal lengths per level
            logits = model(input_ids=ids).logits[:, -1].float().numpy()  # [N, V]
        return oracle.transform(logits, params)

    partition = ExactPartition.build(next_probs, LENGTH, frozenset(loop.eos), SAMPLES)
    bins = [partition.bin_of(tuple(loop.generate(prompt, K + 2, K, params, seed=i, keep=LENGTH)[:LENGTH]))
            for i in range(SAMPLES)]  # keep: the steps after the first LENGTH tokens would change none of them
    return chi_square_pvalue(bins, partition.probs)


@pytest.mark.parametrize("params", SETTINGS, ids=["T1-p0.8", "T1", "T0.5-k5"])
def test_sampling_matches_target_distribution(trt_pack: Callable[[Pair], tuple[Path, Path]],
                                              params: SamplingParams) -> None:
    p_value = _trt_form_pvalue(*trt_pack(PAIRS[0]), params, StaticPackLoop)
    assert p_value > P_FAIL, f"chi-square p = {p_value:.2e}"


def test_sampling_test_catches_a_misaligned_q(trt_pack: Callable[[Pair], tuple[Path, Path]]) -> None:
    """The chi-square above, at its size and seeds, on a loop that passes q one row off: rejected."""
    p_value = _trt_form_pvalue(*trt_pack(PAIRS[0]), SETTINGS[0], MisalignedQ)
    print(f"misaligned q: p = {p_value:.3g}")
    assert p_value < P_FAIL, f"chi-square p = {p_value:.2e}"


def test_form_options_are_checked() -> None:
    with pytest.raises(SpecpackError, match="static KV cache with standard attention"):
        ExportConfig(kv_cache="concat", form="tensorrt")
    with pytest.raises(SpecpackError, match="static KV cache with standard attention"):
        ExportConfig(kv_cache="static", attention="gqa", form="tensorrt")
    with pytest.raises(SpecpackError, match="invalid --form"):
        ExportConfig(form="tensorrt-llm")
    assert str(ExportConfig(kv_cache="static", form="tensorrt").graph_form(64)) == \
        "static KV cache, standard attention, TensorRT heads"


def test_export_config_applies_its_own_defaults() -> None:
    """The API's ExportConfig takes the CLI's defaults: the static cache where the form or the builder needs it."""
    assert ExportConfig(form="tensorrt").kv_cache == "static"
    assert ExportConfig(graphs="builder").kv_cache == "static"
    assert ExportConfig().kv_cache == "concat"
    assert ExportConfig(kv_cache="static").kv_cache == "static"


def test_cli_form_tensorrt_implies_the_static_cache(tiny_pairs: Callable[..., tuple[Path, Path]], tmp_path: Path) -> None:
    from click.testing import CliRunner

    from specpack.cli.export_cmd import export_command

    draft_dir, target_dir = tiny_pairs("qwen2", "noisy")
    args = ["--draft", str(draft_dir), "--target", str(target_dir), "-o", str(tmp_path / "pack"), "--form", "tensorrt"]
    result = CliRunner().invoke(export_command, [*args, "--kv-cache", "concat"])
    assert result.exit_code == 2 and "static KV cache with standard attention" in result.output
    result = CliRunner().invoke(export_command, [*args, "--attention", "gqa"])
    assert result.exit_code == 2 and "--kv-cache static --attention gqa" in result.output


def test_quantized_tensorrt_form_pack(tiny_pairs: Callable[..., tuple[Path, Path]], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch,
                                      shared_plain_exports: Callable[[], AbstractContextManager[None]]) -> None:
    """An fp8 draft and an int8-sq target in the tensorrt form: every node (Q/DQ included) passes the check, and
    the quantized draft leaves greedy output equal to the (quantized) target's own greedy decoding (k = 0)."""
    from specpack.export.pipeline import export_pack

    monkeypatch.setenv("SPECPACK_CACHE", str(tmp_path / "cache"))
    prompts = tmp_path / "calib.txt"
    prompts.write_text("def add(a, b):\nThe quick brown fox\nimport os\nHello there\n")
    draft_dir, target_dir = tiny_pairs("qwen2", "noisy")
    with shared_plain_exports():  # the fp32 plain graphs of trt_pack's qwen2 pack: quantized and calibrated here
        pack = export_pack(str(draft_dir), str(target_dir), tmp_path / "pack",
                           ExportConfig(k=4, kv_cache="static", form="tensorrt", quantize_draft="fp8",
                                        quantize_target="int8-sq", calib_prompts=str(prompts), calib_samples=4,
                                        isolate=False))
    for model in _graphs(pack):
        assert problems(model) == []
        ops = Counter(node.op_type for node, _ in walk_nodes(model.graph))
        assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] > 0
    manifest = json.loads((pack / "manifest.json").read_text())
    assert (manifest["draft"]["quantization"]["method"], manifest["target"]["quantization"]["method"]) == \
        ("fp8", "int8-sq")
    loop = StaticPackLoop(pack)
    for prompt in PROMPTS:
        alone = loop.generate(prompt, 20, 0, SamplingParams(0.0))  # k = 0: the quantized target by itself
        for k in (1, 4):
            assert loop.generate(prompt, 20, k, SamplingParams(0.0)) == alone, (prompt, k)
