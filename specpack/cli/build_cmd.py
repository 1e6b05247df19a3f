"""`specpack build PACK --backend tensorrt`: engines for this machine's GPU, listed in the pack's manifest."""

from __future__ import annotations

from pathlib import Path

import click

from specpack.cli.errors import user_errors
from specpack.deploy.trt_build import DEFAULT_PRECISION, DEFAULT_WORKSPACE_GB, PRECISIONS

BUILD_BACKENDS = ("tensorrt",)


@click.command("build")
@click.argument("pack", type=click.Path(path_type=Path))
@click.option("--backend", type=click.Choice(BUILD_BACKENDS), required=True, help="What to build engines for.")
@click.option("--precision", type=click.Choice(PRECISIONS), default=DEFAULT_PRECISION, show_default=True,
              help="fp16 | bf16: the builder flag for fp32 graphs; int8 | fp8: the pack's Q/DQ graphs (int8-sq, fp8), "
                   "strongly typed. fp16 / bf16 / Q/DQ graphs are always built strongly typed.")
@click.option("--workspace-gb", "workspace_gb", type=int, default=DEFAULT_WORKSPACE_GB, show_default=True,
              help="GiB of GPU memory the builder may use for its tactics.")
@click.option("--compare", is_flag=True, help="Then compare each engine with ONNX Runtime on the same inputs "
              "(`polygraphy run --onnxrt --trt`; needs polygraphy).")
@user_errors
def build_command(pack: Path, backend: str, precision: str, workspace_gb: int, compare: bool) -> None:
    """Build TensorRT engines from PACK's graphs for this GPU and TensorRT version, into
    PACK/engines/<gpu>-sm<cc>-trt<version>/, and list them (sha256, GPU, TensorRT version) in the manifest."""
    from specpack.deploy.trt_build import BuildOptions, build_pack_engines

    options = BuildOptions(precision=precision, workspace_gb=workspace_gb)  # checked before TensorRT is looked for
    entries = build_pack_engines(pack, options)
    for entry in entries:
        click.echo(f"{entry.role}: {entry.path} ({entry.precision}, {entry.gpu}, compute capability "
                   f"{entry.compute_capability}, TensorRT {entry.tensorrt_version})")
    if compare:
        from specpack.deploy.trt_compare import compare_with_polygraphy

        compare_with_polygraphy(pack, entries)
