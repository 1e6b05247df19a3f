"""`specpack serve`: an OpenAI-compatible HTTP server over a pack (needs the `serve` extra)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import click

from specpack.cli.errors import user_errors
from specpack.errors import SpecpackError
from specpack.runtime.backend import BACKENDS
from specpack.serve.config import ServeConfig

D = {f.name: f.default for f in fields(ServeConfig)}  # the defaults live in ServeConfig, once


@click.command("serve")
@click.argument("pack", type=click.Path(path_type=Path))
@click.option("--host", default=D["host"], show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=D["port"], show_default=True)
@click.option("--device", type=click.Choice(sorted(BACKENDS)), default=D["device"], show_default=True,
              help="Backend, from the runtime's registry (docs/architecture.md, Backends).")
@click.option("--k", "k", type=int, default=None, help="Drafts per step, 0..k_max (default: the pack's k_max).")
@click.option("--max-queue", type=int, default=D["max_queue"], show_default=True,
              help="Requests that may wait for the decoder; more are answered 429.")
@click.option("--timeout", "timeout_s", type=float, default=D["timeout_s"], show_default=True,
              help="Seconds a request may take, queue wait included; then it is cancelled (504).")
@click.option("--shutdown-grace", "shutdown_grace_s", type=float, default=D["shutdown_grace_s"],
              show_default=True, help="On SIGTERM, seconds in-flight requests get to finish before they are cancelled.")
@click.option("--model-name", default=None, help="The model name clients send (default: the pack directory's name).")
@user_errors
def serve_command(pack: Path, host: str, port: int, device: str, k: int | None, max_queue: int,
                  timeout_s: float, shutdown_grace_s: float, model_name: str | None) -> None:
    """Serve PACK over HTTP: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics."""
    config = ServeConfig(pack, host=host, port=port, device=device, k=k, max_queue=max_queue, timeout_s=timeout_s,
                         shutdown_grace_s=shutdown_grace_s, model_name=model_name)
    try:
        from specpack.serve.server import serve
    except ImportError as err:
        raise SpecpackError("`specpack serve` needs the serve extra", expected="starlette, uvicorn, prometheus-client",
                            found=f"{err.name} is not installed", hint="pip install 'specpack[serve]'") from err
    serve(config)
