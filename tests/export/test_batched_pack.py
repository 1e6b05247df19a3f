"""spec-export --max-batch: the forms it is refused for (expected / found / hint), its range, and the CLI flag reaching
ExportConfig. The pack it writes is tested end to end in tests/runtime/test_batched_sampling.py and, quantized,
tests/runtime/test_batched_quantized.py (slow: they export)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from specpack.cli.main import spec_export
from specpack.errors import SpecpackError
from specpack.export.config import ExportConfig


@pytest.mark.parametrize(("options", "found"), [
    ({"graphs": "builder"}, "--graphs builder"),
    ({"dtype": "bf16"}, "--dtype bf16"),
    ({"dtype": "fp16", "quantize_target": "int4"}, "--dtype fp16 with --quantize-* int4"),  # fp16: unquantized
    ({"kv_cache": "static", "max_tree_nodes": 8}, "--max-tree-nodes"),
    ({"quantize_target": "fp8"}, "--quantize-* int8-sq / fp8"),  # weight-only modes are exported (int4, int8, gguf)
])
def test_max_batch_refused_for_other_forms(options: dict[str, object], found: str) -> None:
    with pytest.raises(SpecpackError, match="--max-batch cannot be exported") as err:
        ExportConfig(max_batch=4, **options)  # type: ignore[arg-type]
    assert err.value.found == found and err.value.hint


def test_fp16_is_exported_batched_unquantized() -> None:
    """The GPU's batched pack (the cuda backend opens it: tests/runtime/test_cuda_batched.py); a .gguf source's own
    blocks are a quantized fp16 batched graph, refused when its mode is resolved."""
    config = ExportConfig(max_batch=4, dtype="fp16", kv_cache="static")
    assert (config.max_batch, config.dtype) == (4, "fp16")
    with pytest.raises(SpecpackError, match="the fp16 batched graphs are unquantized") as err:
        config.quantization("target", "model.gguf")
    assert err.value.found == "--dtype fp16, target gguf" and err.value.hint


@pytest.mark.parametrize("batch", [-1, 1025, True])
def test_max_batch_out_of_range(batch: object) -> None:
    with pytest.raises(SpecpackError, match="invalid --max-batch"):
        ExportConfig(max_batch=batch)  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["int4", "int8", "gguf"])
def test_weight_only_quantization_is_exported_batched(method: str) -> None:
    config = ExportConfig(max_batch=4, quantize_draft=method, quantize_target=method)
    assert config.max_batch == 4


def test_the_cli_flag_reaches_the_config() -> None:
    result = CliRunner().invoke(spec_export, ["--target", "nowhere", "--drafter", "ngram", "-o", "out",
                                              "--max-batch", "4", "--quantize-target", "int8-sq"])
    assert result.exit_code == 2 and "--max-batch cannot be exported with --quantize-* int8-sq / fp8" in result.output


@pytest.mark.slow
def test_exports_running_at_once_write_the_same_pack(tiny_pairs, tiny_export, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """--jobs 4: the four torch exports of a batched pack (each model, each batched form) run at once, each in its own
    process; every file of the pack is the one the exports one after another write (same sha256 in the manifest)."""
    import json

    from specpack.export.pipeline import export_pack

    draft_dir, target_dir = tiny_pairs("qwen2", "noisy")
    export_pack(str(draft_dir), str(target_dir), tmp_path / "pack", ExportConfig(max_batch=4, jobs=4))
    one_by_one = tiny_export("qwen2", "noisy", max_batch=4)  # test_batched_sampling.py's pack (one export a session)

    def files(pack):  # type: ignore[no-untyped-def]
        return {f["path"]: f["sha256"] for f in json.loads((pack / "manifest.json").read_text())["files"]}

    assert files(tmp_path / "pack") == files(one_by_one) and len(files(one_by_one)) >= 6


@pytest.mark.parametrize("jobs", [0, 17, True])
def test_jobs_out_of_range(jobs: object) -> None:
    with pytest.raises(SpecpackError, match="--jobs out of range"):
        ExportConfig(jobs=jobs)  # type: ignore[arg-type]
