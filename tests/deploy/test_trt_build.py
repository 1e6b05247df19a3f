"""`specpack build --backend tensorrt` bookkeeping without TensorRT: a fake builder writes the plans, everything
else (integrity first, form and precision checks, profiles, engine folders, the manifest rewrite) is the real code."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from specpack.cli.main import cli
from specpack.contract.engines import Platform, check_buildable, engine_dir, profile_shapes, select_engine
from specpack.contract.integrity import extra_files, verify_pack
from specpack.contract.manifest import Manifest
from specpack.deploy.trt_build import BuildOptions, ModelBuild, build_pack_engines, plan_build
from specpack.deploy.trt_compare import onnxrt_command, polygraphy_executable, trt_command
from specpack.errors import SpecpackError
from specpack.runtime.trt_env import tensorrt_missing

from .manifests import valid_manifest

H200 = Platform("NVIDIA H200", "9.0", "10.13.0.35")
ORIN = Platform("Orin", "8.7", "10.3.0.30")
built: list[tuple[str, dict[str, tuple[tuple[int, ...], ...]], ModelBuild, int]] = []


def fake_builder(graph: Path, plan: Path, profile: dict, build: ModelBuild, workspace_gb: int) -> None:
    built.append((graph.name, profile, build, workspace_gb))
    plan.write_bytes(f"plan of {graph.name} for {build.precision}".encode())


@pytest.fixture()
def pack(trt_pack: Path, tmp_path: Path) -> Path:
    out = tmp_path / "pack"
    shutil.copytree(trt_pack, out)
    built.clear()
    return out


def test_engines_are_listed_hashed_and_checked(pack: Path) -> None:
    entries = build_pack_engines(pack, BuildOptions(workspace_gb=2), platform=H200, builder=fake_builder)
    m = Manifest.read(pack)
    assert [(e.role, e.path) for e in m.engines] == [
        ("draft", "engines/nvidia-h200-sm90-trt10.13.0.35/draft_step.plan"),
        ("target", "engines/nvidia-h200-sm90-trt10.13.0.35/verify.plan")]
    assert m.engines == entries and "tensorrt" in m.backends
    assert {(e.gpu, e.compute_capability, e.tensorrt_version, e.precision) for e in m.engines} == {
        ("NVIDIA H200", "9.0", "10.13.0.35", "fp16")}
    assert {g for g, *_ in built} == {"draft_step.onnx", "verify.onnx"} and {w for *_, w in built} == {2}
    assert all(not b.strongly_typed and b.flag == "fp16" for _, _, b, _ in built)  # fp32 graphs: the fp16 flag
    assert set(verify_pack(pack, m, full=True)) >= {e.path for e in m.engines}  # the engines are hashed like any file
    assert extra_files(pack, m) == []  # no staging folder or temp manifest left behind
    assert select_engine(m, "target", H200).path.endswith("verify.plan")


def test_a_rebuild_replaces_and_another_platform_adds(pack: Path) -> None:
    build_pack_engines(pack, BuildOptions(), platform=H200, builder=fake_builder)
    build_pack_engines(pack, BuildOptions(precision="bf16"), platform=H200, builder=fake_builder)
    build_pack_engines(pack, BuildOptions(), platform=ORIN, builder=fake_builder)
    m = Manifest.read(pack)
    assert sorted((e.gpu, e.role, e.precision) for e in m.engines) == [
        ("NVIDIA H200", "draft", "bf16"), ("NVIDIA H200", "target", "bf16"),
        ("Orin", "draft", "fp16"), ("Orin", "target", "fp16")]
    assert len({f.path for f in m.files}) == len(m.files)
    verify_pack(pack, m, full=True)
    assert extra_files(pack, m) == []
    assert sorted(p.name for p in (pack / "engines").iterdir()) == ["nvidia-h200-sm90-trt10.13.0.35", "orin-sm87-trt10.3.0.30"]


def test_a_failed_build_leaves_the_pack_as_it_was(pack: Path) -> None:
    before = (pack / "manifest.json").read_bytes()

    def failing(graph: Path, plan: Path, profile: dict, build: ModelBuild, workspace_gb: int) -> None:
        if graph.name == "verify.onnx":
            raise SpecpackError("TensorRT could not build an engine from verify.onnx")
        fake_builder(graph, plan, profile, build, workspace_gb)

    with pytest.raises(SpecpackError, match="could not build"):
        build_pack_engines(pack, BuildOptions(), platform=H200, builder=failing)
    assert (pack / "manifest.json").read_bytes() == before
    assert not (pack / "engines").exists() or not any((pack / "engines").iterdir())


def test_altered_graphs_are_never_built(pack: Path) -> None:
    with open(pack / "verify.onnx.data", "r+b") as f:
        f.write(b"\x01\x02")
    with pytest.raises(SpecpackError, match=r"verify\.onnx\.data does not match the manifest"):
        build_pack_engines(pack, BuildOptions(), platform=H200, builder=fake_builder)
    assert built == []


def test_profiles_cover_prefill_steps_and_every_k(trt_pack: Path) -> None:
    m = Manifest.read(trt_pack)  # k_max 4, max_len 64
    target, draft = profile_shapes(m, "target"), profile_shapes(m, "draft")
    assert target["input_ids"] == ((1, 1), (1, 5), (1, 64))
    assert draft["input_ids"] == ((1, 1), (1, 1), (1, 64))
    assert target["draft_probs"] == ((1, 0, m.vocab_size), (1, 4, m.vocab_size), (1, 4, m.vocab_size))
    assert target["uniforms"] == ((1, 1), (1, 5), (1, 5))
    assert target["attention_mask"] == ((1, 64),) * 3
    kv = (1, m.target.kv_heads, 64, m.target.head_dim)
    assert target["past_key_values.0.key"] == (kv, kv, kv)
    assert set(target) == {s.name for s in m.target.graph.inputs}


def test_precision_needs_the_graphs_and_the_gpu_for_it(trt_pack: Path) -> None:
    m = Manifest.read(trt_pack)
    with pytest.raises(SpecpackError, match=r"needs INT8 Q/DQ graphs(.|\n)*--quantize-draft int8-sq"):
        plan_build(m, BuildOptions(precision="int8"), H200)
    with pytest.raises(SpecpackError, match=r"Orin has no FP8 support(.|\n)*compute capability 8.9 or higher"):
        plan_build(m, BuildOptions(precision="fp8"), ORIN)
    with pytest.raises(SpecpackError, match="no BF16 support"):
        plan_build(m, BuildOptions(precision="bf16"), Platform("Tesla T4", "7.5", "10.13.0.35"))
    data = m.model_dump(mode="json", by_alias=True)
    data["draft"]["quantization"] = {"method": "int8-sq"}
    qdq = Manifest.model_validate(data)
    builds = {b.role: b for b in plan_build(qdq, BuildOptions(precision="int8"), ORIN)}
    assert builds["draft"] == ModelBuild("draft", "draft_step.onnx", strongly_typed=True, flag=None, precision="int8")
    assert builds["target"].flag == "fp16" and not builds["target"].strongly_typed
    data["draft"]["quantization"] = {"method": "int4"}
    with pytest.raises(SpecpackError, match=r"quantized for ONNX Runtime(.|\n)*MatMulNBits"):
        plan_build(Manifest.model_validate(data), BuildOptions(), H200)


def test_only_the_static_standard_form_is_built() -> None:
    concat = Manifest.model_validate(valid_manifest())
    with pytest.raises(SpecpackError, match=r"not in a form TensorRT(.|\n)*kv_cache static, attention standard"
                                            r"(.|\n)*--form tensorrt"):
        check_buildable(concat)


def test_engine_dir_names() -> None:
    assert engine_dir(H200) == "engines/nvidia-h200-sm90-trt10.13.0.35"
    rtx = Platform("NVIDIA GeForce RTX 4090 (ES)", "8.9", "10.13")
    assert engine_dir(rtx) == "engines/nvidia-geforce-rtx-4090-es-sm89-trt10.13"


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_cli_errors_exit_2_without_a_traceback(pack: Path, tmp_path: Path) -> None:
    code, text = _cli("build", str(pack), "--backend", "tensorrt", "--workspace-gb", "0")
    assert code == 2 and "invalid --workspace-gb" in text and "Traceback" not in text
    code, text = _cli("build", str(pack), "--backend", "tensorrt", "--precision", "fp9")
    assert code == 2 and "fp9" in text
    code, text = _cli("build", str(tmp_path / "nope"), "--backend", "tensorrt")
    assert code == 2 and "no pack at" in text
    if tensorrt_missing() is not None:
        code, text = _cli("build", str(pack), "--backend", "tensorrt")
        assert code == 2 and "TensorRT is not available" in text and "expected:" in text and "hint:" in text
        assert "Traceback" not in text
    manifest = json.loads((pack / "manifest.json").read_text())
    manifest["target"]["graph"]["kv_cache"] = "concat"
    (pack / "manifest.json").write_text(json.dumps(manifest))
    code, text = _cli("build", str(pack), "--backend", "tensorrt")
    # without TensorRT, a pack of the wrong form is refused for TensorRT first (a re-export would not help here)
    expected = "TensorRT is not available" if tensorrt_missing() is not None else "not in a form TensorRT engines are built from"
    assert code == 2 and expected in text, text
    with pytest.raises(SpecpackError, match="not in a form TensorRT engines are built from"):  # where TensorRT is
        build_pack_engines(pack, BuildOptions(), platform=H200, builder=fake_builder)


def test_polygraphy_commands(pack: Path, tmp_path: Path) -> None:
    """The comparison's ONNX Runtime half runs here (polygraphy --onnxrt); the TensorRT half is only spelled."""
    entries = build_pack_engines(pack, BuildOptions(), platform=H200, builder=fake_builder)
    m = Manifest.read(pack)
    trt = trt_command(pack, entries[1], tmp_path)
    assert trt[:6] == ["polygraphy", "run", str(pack / entries[1].path), "--model-type", "engine", "--trt"]
    assert trt[-4:] == ["--atol", "0.02", "--rtol", "0.02"] and str(tmp_path / "target-onnxrt.json") in trt
    exe = polygraphy_executable()
    if exe is None:
        pytest.skip("polygraphy is not installed")
    command = onnxrt_command(pack, m, "target", tmp_path, exe)
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    outputs = json.loads((tmp_path / "target-onnxrt.json").read_text())
    assert "onnxrt-runner" in json.dumps(outputs)[:2000]
