"""Polygraphy comparisons of each built engine with ONNX Runtime on the same inputs (`specpack build --compare`).

    polygraphy run GRAPH.onnx --onnxrt --input-shapes ... --val-range ... --save-inputs in.json --save-outputs ort.json
    polygraphy run ENGINE.plan --model-type engine --trt --load-inputs in.json --load-outputs ort.json --atol A --rtol R

Polygraphy's "comparing across runs": the second run checks the pack's own engine (not one Polygraphy would
build) against the first run's outputs. Inputs are drawn at the profile's opt shapes, in ranges that keep the
graph meaningful (token ids inside the vocabulary, an all-ones static mask, greedy sampling inputs).
The ONNX Runtime half runs anywhere polygraphy is installed; the TensorRT half has never run here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from specpack import names
from specpack.contract.engines import profile_shapes
from specpack.contract.manifest import EngineEntry, Manifest
from specpack.errors import SpecpackError

TOLERANCES = {"fp32": (1e-4, 1e-4), "fp16": (2e-2, 2e-2), "bf16": (5e-2, 5e-2), "int8": (1e-1, 1e-1), "fp8": (1e-1, 1e-1)}


def polygraphy_executable() -> str | None:
    """`polygraphy` beside this Python (its environment's scripts), else on PATH."""
    beside = Path(sys.executable).parent / "polygraphy"
    return str(beside) if beside.is_file() else shutil.which("polygraphy")


def value_ranges(manifest: Manifest, role: str) -> dict[str, tuple[float, float]]:
    """[low, high] of each input's random values."""
    model = manifest.draft if role == "draft" else manifest.target
    ranges: dict[str, tuple[float, float]] = {
        names.INPUT_IDS: (0, manifest.vocab_size - 1), names.POSITION_IDS: (0, manifest.max_len - 1),
        names.ATTENTION_MASK: (1, 1), names.TEMPERATURE: (0, 0), names.TOP_K: (0, 0), names.TOP_P: (1, 1),
        names.UNIFORM: (0, 1), names.UNIFORMS: (0, 1), names.DRAFT_PROBS: (0, 1)}
    return {s.name: ranges.get(s.name, (-1, 1)) for s in model.graph.inputs}


def _shape_args(flag: str, shapes: dict[str, tuple[int, ...]]) -> list[str]:
    return [flag, *(f"{name}:[{','.join(map(str, shape))}]" for name, shape in shapes.items())]


def onnxrt_command(pack: Path, manifest: Manifest, role: str, work: Path, exe: str = "polygraphy") -> list[str]:
    model = manifest.draft if role == "draft" else manifest.target
    opt = {name: shape[1] for name, shape in profile_shapes(manifest, role).items()}
    val = [f"{name}:[{low},{high}]" for name, (low, high) in value_ranges(manifest, role).items()]
    return [exe, "run", str(pack / model.graph.path), "--onnxrt", *_shape_args("--input-shapes", opt),
            "--val-range", *val, "--save-inputs", str(work / f"{role}-inputs.json"),
            "--save-outputs", str(work / f"{role}-onnxrt.json")]


def trt_command(pack: Path, entry: EngineEntry, work: Path, exe: str = "polygraphy") -> list[str]:
    atol, rtol = TOLERANCES[entry.precision or "fp32"]
    return [exe, "run", str(pack / entry.path), "--model-type", "engine", "--trt",
            "--load-inputs", str(work / f"{entry.role}-inputs.json"),
            "--load-outputs", str(work / f"{entry.role}-onnxrt.json"), "--atol", str(atol), "--rtol", str(rtol)]


def compare_with_polygraphy(pack: Path, entries: list[EngineEntry]) -> None:
    """Run both halves for each engine; a SpecpackError when polygraphy is missing or an engine disagrees."""
    exe = polygraphy_executable()
    if exe is None:
        raise SpecpackError("--compare needs polygraphy", expected="the `polygraphy` command on PATH",
                            found="none", hint="pip install polygraphy (NVIDIA's pip index or PyPI)")
    manifest = Manifest.read(pack)
    work = pack.parent / f".{pack.name}.compare"
    work.mkdir(exist_ok=True)
    try:
        for entry in entries:
            for command in (onnxrt_command(pack, manifest, entry.role, work, exe), trt_command(pack, entry, work, exe)):
                if subprocess.run(command, check=False).returncode != 0:
                    raise SpecpackError(f"polygraphy: the {entry.role} engine does not match ONNX Runtime",
                                        expected="outputs within the tolerances", found=f"`{' '.join(command)}` failed",
                                        hint="read polygraphy's report above; rebuild with --precision fp16 (or fp32 graphs)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
