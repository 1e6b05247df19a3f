"""`specpack deploy jetson`: the bundle's layout and hashes, its script's dry run, and its refusals."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specpack.cli.main import cli
from specpack.contract.manifest import Manifest, manifest_sha256
from specpack.deploy.jetson import REQUIREMENTS_JETPACK6
from specpack.deploy.trt_build import BuildOptions, build_pack_engines
from specpack.hashing import sha256_file

from .test_trt_build import H200, fake_builder


@pytest.fixture(scope="module")
def bundle(trt_pack: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle of a pack that already holds engines for an H200 (they must not travel)."""
    pack = tmp_path_factory.mktemp("jetson") / "pack"
    shutil.copytree(trt_pack, pack)
    build_pack_engines(pack, BuildOptions(), platform=H200, builder=fake_builder)
    out = pack.parent / "bundle"
    result = CliRunner().invoke(cli, ["deploy", "jetson", str(pack), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _script(bundle: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(bundle / "build_engines.sh"), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_layout_and_hashes(bundle: Path, trt_pack: Path) -> None:
    top = sorted(p.name for p in bundle.iterdir())
    assert top == ["README.md", "SHA256SUMS", "build_engines.sh", "bundle.json", "lib", "pack", "requirements-aarch64.txt"]
    record = json.loads((bundle / "bundle.json").read_text())
    assert record["manifest_sha256"] == manifest_sha256(bundle / "pack")
    assert (record["jetpack"], record["tensorrt_major"], record["python"], record["precision"]) == (6, 10, "3.10", "fp16")
    m = Manifest.read(bundle / "pack")
    assert m.engines == [] and "tensorrt" not in m.backends and not (bundle / "pack" / "engines").exists()
    assert sorted(f.path for f in m.files) == sorted(f.path for f in Manifest.read(trt_pack).files)
    for entry in m.files:  # the graphs, external data and tokenizer, byte for byte
        assert sha256_file(bundle / "pack" / entry.path) == entry.sha256
    sums = dict(reversed(line.split("  ", 1)) for line in (bundle / "SHA256SUMS").read_text().splitlines())
    files = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()} - {"SHA256SUMS"}
    assert set(sums) == files
    assert all(sha256_file(bundle / path) == digest for path, digest in sums.items())
    assert (bundle / "lib/specpack/runtime/backends/tensorrt.py").is_file()
    assert not list((bundle / "lib").rglob("__pycache__"))
    pins = (bundle / "requirements-aarch64.txt").read_text().splitlines()
    assert pins == REQUIREMENTS_JETPACK6.splitlines() and all("==" in line for line in pins)
    assert os.access(bundle / "build_engines.sh", os.X_OK)


def test_dry_run_checks_the_files_and_prints_the_build(bundle: Path) -> None:
    run = _script(bundle, "--dry-run")
    assert run.returncode == 0, run.stderr
    digest = manifest_sha256(bundle / "pack")
    lines = run.stdout.splitlines()
    assert "1. bundle files against SHA256SUMS" in lines and "   ok" in lines
    assert "+ python3 -m venv --system-site-packages .venv" in lines
    assert "+ .venv/bin/python -m pip install --no-deps -r requirements-aarch64.txt" in lines
    assert f"+ .venv/bin/python -m specpack verify pack --manifest-sha256 {digest}" in lines
    assert "+ .venv/bin/python -m specpack build pack --backend tensorrt --precision fp16 --workspace-gb 2" in lines
    assert not (bundle / ".venv").exists()


def test_the_printed_verify_runs_from_the_bundled_sources(bundle: Path) -> None:
    """What step 4 runs, with this machine's Python for the venv's: the bundled specpack verifies the bundled pack."""
    digest = manifest_sha256(bundle / "pack")
    run = subprocess.run([sys.executable, "-m", "specpack", "verify", "pack", "--manifest-sha256", digest], cwd=bundle,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(bundle / "lib")})
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("ok: ") and digest in run.stdout


def test_an_altered_file_stops_the_script(bundle: Path, tmp_path: Path) -> None:
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    with open(copy / "pack" / "verify.onnx.data", "r+b") as f:
        f.write(b"\x00\x01")
    run = _script(copy, "--dry-run")
    assert run.returncode != 0 and "pack/verify.onnx.data: FAILED" in run.stdout + run.stderr
    assert "+ " not in run.stdout  # nothing printed as to be run


@pytest.mark.skipif(platform.machine() == "aarch64", reason="checks the refusal on a machine that is not a Jetson")
def test_on_another_machine_the_script_refuses(bundle: Path) -> None:
    run = _script(bundle)
    assert run.returncode == 2 and "expected an aarch64 Jetson" in run.stderr
    assert not (bundle / ".venv").exists()


def test_cli_refusals(bundle: Path, trt_pack: Path, tmp_path: Path) -> None:
    def invoke(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(cli, ["deploy", "jetson", *args])
        return result.exit_code, result.output

    code, text = invoke(str(trt_pack), "-o", str(bundle))
    assert code == 2 and "already exists" in text and "--overwrite" in text
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("mine")
    code, text = invoke(str(trt_pack), "-o", str(tmp_path / "other"), "--overwrite")
    assert code == 2 and "not a bundle" in text and (tmp_path / "other" / "keep.txt").exists()
    code, text = invoke(str(trt_pack), "-o", str(tmp_path / "b"), "--jetpack", "5")
    assert code == 2 and "'5' is not '6'" in text
    code, text = invoke(str(trt_pack), "-o", str(tmp_path / "b"), "--precision", "fp8")
    assert code == 2 and "fp8" in text
    concat = tmp_path / "concat"
    shutil.copytree(trt_pack, concat)
    data = json.loads((concat / "manifest.json").read_text())
    data["draft"]["graph"]["kv_cache"] = "concat"
    (concat / "manifest.json").write_text(json.dumps(data))
    code, text = invoke(str(concat), "-o", str(tmp_path / "b"))
    assert code == 2 and "not in a form TensorRT engines are built from" in text and "Traceback" not in text
    # the form to export, and that TensorRT is not needed here (the bundle builds on the device)
    assert "--form tensorrt" in text and "TensorRT itself is needed only where the engines are built" in text
    assert not (tmp_path / "b").exists()


def test_overwrite_never_deletes_what_deploy_did_not_write(bundle: Path, trt_pack: Path, tmp_path: Path) -> None:
    def deploy(out: Path) -> tuple[int, str]:
        result = CliRunner().invoke(cli, ["deploy", "jetson", str(trt_pack), "-o", str(out), "--overwrite"])
        return result.exit_code, result.output

    lookalike = tmp_path / "lookalike"  # merely holds files with a bundle's names
    lookalike.mkdir()
    for name in ("bundle.json", "SHA256SUMS", "thesis.tex"):
        (lookalike / name).write_text("{}")
    code, text = deploy(lookalike)
    assert code == 2 and "not a bundle" in text and "Traceback" not in text
    assert sorted(p.name for p in lookalike.iterdir()) == ["SHA256SUMS", "bundle.json", "thesis.tex"]

    mine = tmp_path / "mine"
    shutil.copytree(bundle, mine)
    (mine / "pack" / "notes.txt").write_text("mine")
    code, text = deploy(mine)
    assert code == 2 and "pack/notes.txt" in text and (mine / "pack" / "notes.txt").read_text() == "mine"
    (mine / "pack" / "notes.txt").unlink()
    code, text = deploy(mine)
    assert code == 0, text
    assert (mine / "bundle.json").is_file()


def test_dry_run_prints_commands_that_paste_from_any_folder(bundle: Path, tmp_path: Path) -> None:
    import shlex

    copy = tmp_path / "my bundles:v1" / "bundle"
    shutil.copytree(bundle, copy)
    run = _script(copy, "--dry-run")
    assert run.returncode == 0, run.stderr
    line = next(line for line in run.stdout.splitlines() if " -m specpack generate " in line)
    words = shlex.split(line)
    assert words[0] == f"{copy}/.venv/bin/python" and words[4] == f"{copy}/pack" and words[-1] == "def fib(n):"
    assert "PYTHONPATH" not in (copy / "build_engines.sh").read_text()
