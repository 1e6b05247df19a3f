"""The `specpack` command group and the `spec-export` entry point."""

from __future__ import annotations

import click

from specpack import __version__
from specpack.cli.bench_cmd import bench_command
from specpack.cli.build_cmd import build_command
from specpack.cli.compare_cmd import compare_command
from specpack.cli.deploy_cmd import deploy_command
from specpack.cli.distill_cmd import distill_command
from specpack.cli.errors import debug_option
from specpack.cli.export_cmd import export_command
from specpack.cli.fetch_cmd import fetch_command
from specpack.cli.generate_cmd import generate_command
from specpack.cli.pack_cmds import inspect_command, verify_command
from specpack.cli.serve_cmd import serve_command


@click.group()
@debug_option
@click.version_option(__version__, prog_name="specpack")
def cli() -> None:
    """specpack: compiled speculative decoding (fetch, export, generate, compare, serve, bench, inspect, verify, build,
    deploy, distill).

    Start with `specpack generate PACK --prompt TEXT`; README.md, "After the demo", walks through the rest."""


cli.add_command(export_command)
cli.add_command(generate_command)
cli.add_command(compare_command)
cli.add_command(inspect_command)
cli.add_command(verify_command)
cli.add_command(bench_command)
cli.add_command(fetch_command)
cli.add_command(serve_command)
cli.add_command(build_command)
cli.add_command(deploy_command)
cli.add_command(distill_command)

spec_export = export_command  # `spec-export --draft D --target T -o PACK` is `specpack export`
