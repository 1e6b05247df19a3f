"""spec-export --draft-head HEAD --quantize-draft int8 | int4: head_step.onnx's weights weight-only quantized
(MatMulNBits, as a draft model's), recorded in the manifest's head entry. Lossless as any drafter: greedy gives the
target alone's tokens, and sampling with the quantized head has the target's distribution (the chi-square of
tests/e2e/test_sampling_distribution.py; its mutation, a misreported q, is tests/runtime/test_cuda_head.py's: the same
rule reads the q the graph gives, quantized or not; here too, with that head's q tempered (tests/mutations.py's
TemperedQ), the same test rejects).
Other modes are refused for a head (exit 2)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest
from click.testing import CliRunner

import specpack
from specpack.cli.main import cli
from specpack.contract.manifest import Manifest
from specpack.runtime.drafter import HeadDrafter
from specpack.sampling import SamplingParams
from tests.e2e.test_sampling_distribution import P_FAIL, SAMPLES, TargetLogits, draw_samples, partitions, pvalue
from tests.mutations import TemperedQ

PROMPTS = ["def add(a, b):", [5], "import os\nprint("]


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_a_quantized_head_gives_the_target_alones_tokens(tiny_head_pack: Callable[..., tuple[Path, Path, Path]],
                                                        method: str) -> None:
    pack_dir = tiny_head_pack("qwen2", quantize_draft=method)[0]
    head = Manifest.read(pack_dir).head
    assert head is not None and head.quantization is not None and head.quantization.method == method
    graph = onnx.load(str(pack_dir / head.graph.path), load_external_data=False).graph
    assert sum(n.op_type == "MatMulNBits" for n in graph.node) >= 4  # fc, attention, MLP, the subset's lm_head rows
    assert not any(p.name.endswith((".plain.onnx", f".{method}.onnx")) for p in pack_dir.iterdir())  # intermediates
    pack = specpack.load(pack_dir, threads=1)
    try:
        accepted = 0
        for prompt in PROMPTS:
            want = pack.generate(prompt, 24, k=0).tokens
            for k in (1, 3, None):
                got = pack.generate(prompt, 24, k=k, drafter="head")
                assert got.tokens == want, (prompt, k)
                accepted += got.stats["accepted"]
        assert accepted > 0
    finally:
        pack.close()


@pytest.mark.parametrize("broken", [False, True])
def test_sampling_with_a_quantized_head_has_the_targets_distribution(
        tiny_head_pack: Callable[..., tuple[Path, Path, Path]], broken: bool) -> None:
    pack_dir, _, target_dir = tiny_head_pack("qwen2", quantize_draft="int4")
    pack = specpack.load(pack_dir, threads=1)
    try:
        params, k, prompt = SamplingParams(1.0), 3, pack.encode(PROMPTS[0])
        part = partitions(TargetLogits(target_dir, prompt), pack.eos_ids)(params, k + 2)
        drafter: Any = HeadDrafter(lambda: TemperedQ(pack.backend.draft())) if broken else pack.drafters["head"]
        n = SAMPLES // 4 if broken else SAMPLES
        samples = draw_samples(pack, drafter, prompt, params, k, 17, n=n, decided=part.decided)
        assert samples.accepted > n // 50  # the accept path ran
        p = pvalue(part, samples)
        assert (p < P_FAIL) if broken else (p > P_FAIL), p
    finally:
        pack.close()


def test_a_head_takes_weight_only_modes_only(tiny_head_pack: Callable[..., tuple[Path, Path, Path]],
                                             tmp_path: Path) -> None:
    _, head_dir, target_dir = tiny_head_pack("qwen2")
    result = CliRunner().invoke(cli, ["export", "--target", str(target_dir), "--draft-head", str(head_dir),
                                      "--quantize-draft", "fp8", "--calib-prompts", str(tmp_path / "p.jsonl"),
                                      "-o", str(tmp_path / "pack")])
    assert result.exit_code == 2 and "cannot quantize a draft head" in result.output, result.output
    assert not (tmp_path / "pack").exists()

