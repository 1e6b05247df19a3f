"""Quantization options: which mode each model gets, and the refusals (bad names, gguf without a GGUF, fp16 on a
CPU without fast fp16 kernels), each a SpecpackError that says what was expected."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from click.testing import CliRunner

from specpack.cli.main import spec_export
from specpack.errors import SpecpackError
from specpack.export.config import ExportConfig
from specpack.runtime import cpu_fp16


def test_default_mode_follows_the_source() -> None:
    config = ExportConfig()
    assert config.quantization("draft", "models/q.Q4_K_M.GGUF") == "gguf"
    assert config.quantization("target", "Qwen/Qwen2.5-0.5B") == "none"
    assert ExportConfig(dequantize=True).quantization("target", "q.gguf") == "none"
    assert ExportConfig(quantize_draft="int4").quantization("draft", "q.gguf") == "int4"
    assert ExportConfig(quantize_target="int8").quantization("draft", "q.gguf") == "gguf"


def test_refusals() -> None:
    with pytest.raises(SpecpackError, match="invalid --quantize-draft") as err:
        ExportConfig(quantize_draft="int3")
    assert "none, int8, int4, gguf" in str(err.value)
    with pytest.raises(SpecpackError, match="contradicts --dequantize"):
        ExportConfig(quantize_target="gguf", dequantize=True)
    with pytest.raises(SpecpackError, match=r"needs a \.gguf target"):
        ExportConfig(quantize_target="gguf").quantization("target", "models/qwen")


def test_cli_refuses_gguf_mode_for_a_model_dir(tiny_pairs: Callable[..., tuple[Path, Path]], tmp_path: Path) -> None:
    draft, target = tiny_pairs("qwen2")
    result = CliRunner().invoke(spec_export, ["--draft", str(draft), "--target", str(target), "-o", str(tmp_path / "p"),
                                              "--quantize-target", "gguf"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--quantize-target gguf needs a .gguf target" in result.output and not (tmp_path / "p").exists()


@pytest.mark.parametrize(("machine", "flags", "refused"), [
    ("x86_64", "flags : fpu avx512f avx512_fp16 amx_tile", True),
    ("aarch64", "Features : fp asimd evtstrm asimdhp", False),
    ("aarch64", "Features : fp asimd evtstrm", True),
])
def test_fp16_on_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, machine: str, flags: str, refused: bool) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor : 0\n{flags}\n")
    monkeypatch.setattr(cpu_fp16.platform, "machine", lambda: machine)
    monkeypatch.setattr(cpu_fp16.sys, "platform", "linux")
    monkeypatch.setattr(cpu_fp16, "Path", lambda _: cpuinfo)
    reason = cpu_fp16.cpu_fp16_refusal()
    assert (reason is not None) == refused
    if refused and machine == "x86_64":
        assert "no fp16 MatMul kernels on x86_64" in str(reason)


def test_fp16_pack_is_refused_on_this_x86_cpu(tiny_pairs: Callable[..., tuple[Path, Path]], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              shared_plain_exports: Callable[[], AbstractContextManager[None]]) -> None:
    import specpack
    from specpack.export.pipeline import export_pack

    monkeypatch.setattr(cpu_fp16.platform, "machine", lambda: "x86_64")
    draft, target = tiny_pairs("qwen2")
    with shared_plain_exports():  # the fp16 draft graph is tests/export/test_torch_export.py's
        export_pack(str(draft), str(target), tmp_path / "fp16", ExportConfig(dtype="fp16", isolate=False, fidelity=False))
    with pytest.raises(SpecpackError, match="this fp16 pack has no fast kernels on this CPU") as err:
        specpack.load(tmp_path / "fp16")
    assert "--quantize-target int4" in str(err.value)


def test_dequantize_without_a_gguf_source_is_refused(tiny_pairs: Callable[..., tuple[Path, Path]],
                                                     tmp_path: Path) -> None:
    """--dequantize means something only for a .gguf source; with none it is refused (exit 2), not ignored."""
    draft, target = tiny_pairs("qwen2")
    out = tmp_path / "p"
    result = CliRunner().invoke(spec_export, ["--draft", str(draft), "--target", str(target), "-o", str(out),
                                              "--dequantize"])
    assert result.exit_code == 2, result.output
    assert "--dequantize applies to .gguf sources only" in result.output and "a .gguf --draft or --target" in result.output
    assert not out.exists()
    ExportConfig(dequantize=True).check_sources("d.gguf", "models/qwen")  # one .gguf source is enough
    ExportConfig(dequantize=True).check_sources(None, "t.GGUF")
    with pytest.raises(SpecpackError, match=r"applies to \.gguf sources only"):
        ExportConfig(dequantize=True).check_sources(None, "models/qwen")
