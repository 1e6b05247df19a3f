"""The recipe's defaults per device (DistillConfig.for_device: the GPU's recipe, CUDA_RECIPE), a bad --generation-batch
refused, and running out of GPU memory while the target writes data reported as the batch's fault (expected, found,
what to do)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from specpack.cli.main import cli
from specpack.distill.config import CUDA_RECIPE, DistillConfig
from specpack.distill.data import generate
from specpack.errors import SpecpackError


def test_the_defaults_follow_the_device() -> None:
    cpu, cuda = DistillConfig.for_device("cpu"), DistillConfig.for_device("cuda")
    assert cpu == DistillConfig() and cpu.generation_batch == 32 and cpu.self_instruct == 1_024
    assert {name: getattr(cuda, name) for name in CUDA_RECIPE} == CUDA_RECIPE
    assert cuda.generation_batch == 1_024 and cuda.self_instruct == 16_384 and cuda.steps == 4_000
    given = DistillConfig.for_device("cuda", generation_batch=7, self_instruct=0)  # what is given wins
    assert (given.generation_batch, given.self_instruct, given.steps) == (7, 0, 4_000)


@pytest.mark.parametrize("rows", ["0", "-3"])
def test_a_bad_generation_batch_is_refused(tmp_path: Path, rows: str) -> None:
    result = CliRunner().invoke(cli, ["distill", "--target", str(tmp_path / "none"), "-o", str(tmp_path / "h"),
                                      "--device", "cuda", "--generation-batch", rows])
    assert result.exit_code == 2, result.output
    assert "invalid --generation-batch" in result.output and "an integer >= 1" in result.output


def test_the_help_names_both_defaults() -> None:
    text = " ".join(CliRunner().invoke(cli, ["distill", "--help"]).output.split())
    assert "[default: 1,024 on the CPU, 16,384 with --device cuda]" in text
    assert "[default: 2,000 on the CPU, 4,000 with --device cuda]" in text


class _OutOfMemory(torch.nn.Module):
    """generate() as a GPU out of memory answers it."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def generate(self, **_: Any) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")


def test_out_of_memory_names_the_batch() -> None:
    with pytest.raises(SpecpackError) as caught:
        generate(_OutOfMemory(), [[1, 2, 3], [4]], 16, None, eos=0)
    text = str(caught.value)
    assert "out of GPU memory" in text and "2 prompts of up to 3 tokens" in text
    assert "Tried to allocate 20.00 GiB" in text and "lower --generation-batch" in text
