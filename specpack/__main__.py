"""`python -m specpack ...` is the `specpack` command (the Jetson bundle's script runs it this way)."""

from specpack.cli.main import cli

cli(prog_name="specpack")
