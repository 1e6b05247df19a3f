"""`specpack serve`: an OpenAI-compatible HTTP server over a pack (needs the `serve` extra)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import click

from specpack.cli.errors import user_errors
from specpack.cli.options import drafter_option, k_option, ngram_config, ngram_options, tree_option
from specpack.cli.pack_cmds import PIN_HELP
from specpack.errors import SpecpackError
from specpack.limits import parse_k, parse_tree
from specpack.runtime.backend import BACKENDS
from specpack.serve.config import ServeConfig
from specpack.serve.ray_config import PACK_DELIVERIES, RayScaling, parse_autoscale

D = {f.name: f.default for f in fields(ServeConfig)}  # the defaults live in ServeConfig, once
R = {f.name: f.default for f in fields(RayScaling)}  # and RayScaling's in RayScaling


@click.command("serve")
@click.argument("pack", type=click.Path(path_type=Path))
@click.option("--host", default=D["host"], show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=D["port"], show_default=True)
@click.option("--device", type=click.Choice(sorted(BACKENDS)), default=D["device"], show_default=True,
              help="Backend, from the runtime's registry (docs/architecture.md, Backends).")
@k_option
@tree_option
@drafter_option
@ngram_options
@click.option("--max-queue", type=int, default=D["max_queue"], show_default=True,
              help="Requests that may wait for the decoder; more are answered 429.")
@click.option("--max-batch", type=click.IntRange(1), default=D["max_batch"], show_default=True,
              help="Requests decoded at once, each on a KV cache of its own (continuous batching: docs/batching.md); "
                   "1 decodes them one at a time.")
@click.option("--timeout", "timeout_s", type=float, default=D["timeout_s"], show_default=True,
              help="Seconds a request may take, queue wait included; then it is cancelled (504).")
@click.option("--shutdown-grace", "shutdown_grace_s", type=float, default=D["shutdown_grace_s"],
              show_default=True, help="On SIGTERM, seconds in-flight requests get to finish before they are cancelled.")
@click.option("--model-name", default=None, help="The model name clients send (default: the pack directory's name).")
@click.option("--max-body-bytes", type=int, default=D["max_body_bytes"], show_default=True,
              help="Longest request body accepted; a longer one is answered 413 before it is parsed or tokenized.")
@click.option("--read-timeout", "read_timeout_s", type=float, default=D["read_timeout_s"], show_default=True,
              help="Seconds a request's head, then its body, may take to arrive; then it is answered 408 and closed.")
@click.option("--max-connections", type=int, default=D["max_connections"], show_default=True,
              help="Open connections served at once; more are answered 503 and closed.")
@click.option("--manifest-sha256", default=None, help=PIN_HELP)
@click.option("--ray", "use_ray", is_flag=True, help="Serve from Ray Serve replicas (the ray extra; docs/ray_serve.md): "
              "the same API, each replica pinned to the pack's manifest sha256.")
@click.option("--replicas", type=int, default=None, help=f"With --ray: replicas [default: {R['replicas']}].")
@click.option("--autoscale", default=None, metavar="MIN..MAX",
              help="With --ray: scale between MIN and MAX replicas on ongoing requests (instead of --replicas).")
@click.option("--gpus-per-replica", type=float, default=None,
              help=f"With --ray: GPUs per replica (Ray's num_gpus) [default: {R['gpus_per_replica']:g}].")
@click.option("--cpus-per-replica", type=float, default=None,
              help=f"With --ray: CPUs per replica (Ray's num_cpus) [default: {R['cpus_per_replica']:g}].")
@click.option("--ray-address", default=None,
              help="With --ray: a running Ray cluster (`ray start --head`'s address, or auto) instead of a local one.")
@click.option("--pack-delivery", type=click.Choice(PACK_DELIVERIES), default=None,
              help="With --ray: how replicas get the pack: by its path (every node sees it: shared storage) or "
                   "through Ray's object store (each replica copies it to a private local directory) "
                   f"[default: {R['pack_delivery']}].")
@user_errors
def serve_command(pack: Path, host: str, port: int, device: str, k_text: str, tree_text: str, drafter: str | None,
                  ngram_min: int, ngram_max: int, ngram_width: int, max_queue: int, max_batch: int, timeout_s: float,
                  shutdown_grace_s: float,
                  model_name: str | None, max_body_bytes: int, read_timeout_s: float, max_connections: int,
                  manifest_sha256: str | None, use_ray: bool, replicas: int | None, autoscale: str | None,
                  gpus_per_replica: float | None, cpus_per_replica: float | None, ray_address: str | None,
                  pack_delivery: str | None) -> None:
    """Serve PACK over HTTP: /v1/completions, /v1/chat/completions, /v1/models[/ID], /health, /metrics."""
    config = ServeConfig(pack, host=host, port=port, device=device, k=parse_k(k_text), tree=parse_tree(tree_text),
                         drafter=drafter,
                         ngram=ngram_config(ngram_min, ngram_max, ngram_width), max_queue=max_queue,
                         max_batch=max_batch, timeout_s=timeout_s, shutdown_grace_s=shutdown_grace_s, model_name=model_name,
                         max_body_bytes=max_body_bytes, read_timeout_s=read_timeout_s, max_connections=max_connections,
                         manifest_sha256=manifest_sha256)
    ray_options = {"--replicas": replicas, "--autoscale": autoscale, "--gpus-per-replica": gpus_per_replica,
                   "--cpus-per-replica": cpus_per_replica, "--ray-address": ray_address, "--pack-delivery": pack_delivery}
    if use_ray:
        _serve_on_ray(config, replicas, autoscale, gpus_per_replica, cpus_per_replica, ray_address, pack_delivery)
        return
    if given := [name for name, value in ray_options.items() if value is not None]:
        raise SpecpackError(f"{', '.join(given)} without --ray", expected="--ray with them (Ray Serve replicas)",
                            found=" ".join(given), hint="add --ray, or drop them to serve from this process")
    try:
        from specpack.serve.server import serve
    except ImportError as err:
        raise SpecpackError("`specpack serve` needs the serve extra", expected="starlette, uvicorn, prometheus-client",
                            found=f"{err.name} is not installed", hint="pip install 'specpack[serve]'") from err
    serve(config)  # binds the port, loads the pack (pinned: every file hashed as read), then listens and says where


def _serve_on_ray(config: ServeConfig, replicas: int | None, autoscale: str | None, gpus_per_replica: float | None,
                  cpus_per_replica: float | None, ray_address: str | None, pack_delivery: str | None) -> None:
    """`--ray`: the options checked first, then ray looked for (exit 2 without it), then serve_on_ray."""
    if replicas is not None and autoscale is not None:
        raise SpecpackError("--replicas and --autoscale together", expected="one of them",
                            found=f"--replicas {replicas} --autoscale {autoscale}",
                            hint="--replicas N for a fixed count, --autoscale MIN..MAX to scale on load")
    given: dict[str, Any] = {"replicas": replicas, "gpus_per_replica": gpus_per_replica,
                             "cpus_per_replica": cpus_per_replica, "pack_delivery": pack_delivery}
    scaling = RayScaling(**{name: value for name, value in given.items() if value is not None},  # else its defaults
                         autoscale=parse_autoscale(autoscale), address=ray_address)
    try:
        import ray.serve  # noqa: F401  (only to look for it)

        from specpack.serve.ray_host import serve_on_ray
    except ImportError as err:
        raise SpecpackError("`specpack serve --ray` needs the ray extra", expected="ray[serve] 2.60 installed",
                            found=f"{err.name} is not installed", hint="pip install 'specpack[ray]'") from err
    serve_on_ray(config, scaling)
