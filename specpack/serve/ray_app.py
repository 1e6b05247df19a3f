"""The same OpenAI-compatible app (app.py's build_app) hosted by Ray Serve replicas instead of uvicorn alone.

    client ── Ray Serve's HTTP proxy (routes, queues past max_ongoing_requests, retries nothing mid-stream;
                 │ ray_proxy.py's middleware: a request whose replica died ends with an OpenAI error)
                 │ one of N replicas (actors, each a process; on any node of the cluster)
                 ▼
    PackReplica: __init__   (--pack-delivery object-store: the pack copied from Ray's object store into a private
                            local directory, ray_objects.py) specpack.load(pack or copy, manifest_sha256=PIN)
                            (server.load_pack: every file hashed as read), one token generated, build_app(pack, config)
                 __serve_build_asgi_app__ -> that app: the same routes, errors, streaming, queue and metrics
                 check_health   the pack generates one token while idle, makes progress while busy (probe.py);
                                fails while draining
                 shutdown       Ray stops routing to it and waits up to graceful_shutdown_timeout_s (--shutdown-grace)
                                for in-flight requests; then the app's lifespan closes the decoder (what is left gets a
                                503, in its stream if one started), and the pack is closed (its copy removed)

Every replica is pinned to one manifest sha256 (the one given, else the driver's reading of the pack at deploy
time): a replica that finds another pack, or a file that does not match it, refuses to start.
This module imports ray: only `specpack serve --ray` and `serve run` import it.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ray import serve

from specpack.contract.manifest import manifest_sha256
from specpack.errors import SpecpackError
from specpack.serve.app import build_app
from specpack.serve.config import ServeConfig
from specpack.serve.pack_copy import remove_copy
from specpack.serve.probe import PROBE_EVERY_S, check_pack, generate_one_token
from specpack.serve.ray_config import RayScaling, parse_autoscale
from specpack.serve.ray_objects import ShippedPack, fetch_pack
from specpack.serve.server import load_pack

if TYPE_CHECKING:
    from ray.serve import Application, Deployment
    from starlette.applications import Starlette


DEPLOYMENT_NAME = "specpack"


@serve.deployment(name=DEPLOYMENT_NAME)
@serve.ingress()  # late-bound: the app comes from __serve_build_asgi_app__, once the pack is loaded
class PackReplica:
    def __init__(self, config: ServeConfig, shipped: ShippedPack | None = None) -> None:
        """shipped (--pack-delivery object-store): the pack is copied from Ray's object store into a private local
        directory first, and loaded from there with the same pin."""
        if config.manifest_sha256 is None:  # application() pins it; a replica never loads whatever it finds
            raise SpecpackError("a Ray Serve replica needs a pinned pack", expected="ServeConfig.manifest_sha256 set",
                                found="None", hint="build the deployment with specpack.serve.ray_app.application()")
        self.config = config
        self.copy = fetch_pack(shipped) if shipped is not None else None
        try:
            self.pack = load_pack(config if self.copy is None else dataclasses.replace(config, pack=self.copy))
            generate_one_token(self.pack)  # before any traffic: a pack that cannot generate never takes requests
            self.probed_at = time.monotonic()
            self.api_app = build_app(self.pack, config)  # not `app`: the wrapper's property
        except BaseException:
            self._close()
            raise

    def __serve_build_asgi_app__(self) -> Starlette:
        return self.api_app

    async def check_health(self) -> None:
        """Ray Serve calls this every health_check_period_s; raising marks the replica unhealthy (it is replaced).
        An idle replica generates its token at most every PROBE_EVERY_S (the calls between check the rest)."""
        due = time.monotonic() - self.probed_at >= PROBE_EVERY_S
        if await check_pack(self.pack, self.api_app.state.decoder, generate=due):
            self.probed_at = time.monotonic()

    def __del__(self) -> None:
        """Called by Ray after the app's lifespan shutdown (the decoder closed, its worker joined)."""
        self._close()

    def _close(self) -> None:
        """The pack closed, then its private copy removed (object-store delivery); harmless twice."""
        pack, copy = getattr(self, "pack", None), getattr(self, "copy", None)
        if pack is not None:
            pack.close()
        if copy is not None:
            remove_copy(copy)


def pinned(config: ServeConfig) -> ServeConfig:
    """The config every replica gets: the pack's absolute path (replicas run elsewhere), its manifest sha256 (the
    given pin, else the manifest read now), and the served name fixed now (it comes from the path)."""
    pack = Path(config.pack).resolve()
    pin = config.manifest_sha256 or manifest_sha256(pack)
    return dataclasses.replace(config, pack=pack, manifest_sha256=pin, model_name=config.served_name)


def application(config: ServeConfig, scaling: RayScaling, shipped: ShippedPack | None = None) -> Application:
    """The Ray Serve application of one pack: serve.run(application(...)), or `serve run` through from_args.
    shipped (put_pack's, for --pack-delivery object-store): each replica copies the pack from Ray's object store
    instead of reading config.pack; its pin must be the config's.

    Each replica's sessions get as many intra-op threads as the replica has CPUs (unless config.threads says): Ray
    does not pin an actor to its CPUs, so by default every replica would spin a thread on every core of the node."""
    options = scaling.deployment_options(config.max_batch, config.max_queue, config.shutdown_grace_s)
    if config.threads is None:
        config = dataclasses.replace(config, threads=max(1, int(scaling.cpus_per_replica)))
    config = pinned(config)
    if shipped is not None and shipped.pin != config.manifest_sha256:
        raise SpecpackError("the shipped pack is not the pinned one", expected=f"manifest sha256 {config.manifest_sha256}",
                            found=f"objects of manifest sha256 {shipped.pin}", hint="put_pack the pinned pack")
    deployment = cast("Deployment", PackReplica)  # @serve.deployment made the class a Deployment
    return deployment.options(**options).bind(config, shipped)


# `serve run` / `serve deploy` arguments (docs/ray_serve.md): ServeConfig's fields of these types, and RayScaling's
CONFIG_ARGS = {f.name: f for f in dataclasses.fields(ServeConfig)
               if f.name in ("pack", "device", "model_name", "max_queue", "max_batch", "timeout_s", "shutdown_grace_s",
                             "max_body_bytes", "read_timeout_s", "manifest_sha256")}
SCALING_ARGS = ("replicas", "autoscale", "gpus_per_replica", "cpus_per_replica", "upscale_delay_s", "downscale_delay_s")


def from_args(args: dict[str, Any]) -> Application:
    """Ray Serve's application builder: `import_path: specpack.serve.ray_app:from_args` with `args:` in the config
    file, or `serve run specpack.serve.ray_app:from_args pack=PATH replicas=2`."""
    unknown = sorted(set(args) - set(CONFIG_ARGS) - set(SCALING_ARGS))
    if unknown or "pack" not in args:
        raise SpecpackError("invalid Ray Serve application args", expected="pack (required) and any of "
                            + ", ".join(sorted((set(CONFIG_ARGS) | set(SCALING_ARGS)) - {"pack"})),
                            found=f"unknown {unknown}" if unknown else "no pack")
    config = ServeConfig(**{name: _typed(name, value) for name, value in args.items() if name in CONFIG_ARGS})
    scaling = RayScaling(replicas=int(args.get("replicas", 1)), autoscale=parse_autoscale(args.get("autoscale")),
                         gpus_per_replica=float(args.get("gpus_per_replica", 0)),
                         cpus_per_replica=float(args.get("cpus_per_replica", 1)),
                         upscale_delay_s=_seconds(args.get("upscale_delay_s")),
                         downscale_delay_s=_seconds(args.get("downscale_delay_s")))
    return application(config, scaling)


def _seconds(value: Any) -> float | None:
    return None if value in (None, "") else float(value)


def _typed(name: str, value: Any) -> Any:
    """A config file's or command line's value as the field's type (`serve run` passes key=value as strings)."""
    if name == "pack":
        return Path(value)
    kind = type(CONFIG_ARGS[name].default)
    if kind in (int, float):
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise SpecpackError(f"invalid {name}", expected=kind.__name__, found=repr(value)) from None
    return None if value in (None, "") else str(value)
