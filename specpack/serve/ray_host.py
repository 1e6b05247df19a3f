"""`specpack serve PACK --ray`: deploy the pack's app (ray_app.py) on Ray Serve and hold it until SIGINT or SIGTERM.

    check the address (a port in use: exit 2 before Ray starts) -> pin the pack (its manifest's sha256, read now)
    -> ray.init (a local cluster, its proxies with ray_proxy's middleware; or --ray-address)
    -> --pack-delivery object-store: the pack put into Ray's object store, verified against the pin as read
       (ray_objects.py; a file that does not match: exit 2 before any replica starts)
    -> serve.start (the HTTP proxy on --host:--port)
    -> serve.run (returns once every replica loaded the pack and generated a token; a replica that refuses the pack
       fails the deployment) -> the listening line -> wait for a signal
    -> delete the app (Ray drains each replica: in-flight requests get --shutdown-grace) -> stop Serve, Ray

Imports ray only inside serve_on_ray (the CLI imports this module lazily too).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any, cast

from specpack.errors import SpecpackError
from specpack.serve.config import ServeConfig
from specpack.serve.ray_config import RayScaling
from specpack.serve.ray_proxy import PROXY_CALLBACK, PROXY_CALLBACK_ENV
from specpack.serve.server import bind_socket, listening_line

APP_NAME = "specpack"


def serve_on_ray(config: ServeConfig, scaling: RayScaling) -> None:
    """Serve the pack from Ray Serve replicas until SIGINT or SIGTERM; then drain and stop."""
    import ray
    from ray import serve

    from specpack.serve.ray_app import application, pinned
    from specpack.serve.ray_objects import put_pack

    if config.port == 0:
        raise SpecpackError("--ray needs a fixed --port", expected="a port in 1..65535 (Ray Serve's proxy binds it)",
                            found="0")
    bind_socket(config.host, config.port).close()  # in use, or a bad host: refused now, with a message
    config = pinned(config)  # reads the manifest: a missing or unreadable pack is refused here
    init_ray(scaling.address, include_dashboard=False)
    stop = _stop_on_signals()
    try:
        shipped = None
        if scaling.pack_delivery == "object-store":  # owned by this process: the objects live while it runs
            shipped = put_pack(config.pack, cast(str, config.manifest_sha256))
            print(f"specpack: the pack is in Ray's object store: {shipped.describe()}", file=sys.stderr, flush=True)
        app = application(config, scaling, shipped)
        serve.start(http_options={"host": config.host, "port": config.port})
        try:
            serve.run(app, name=APP_NAME, route_prefix="/")
            count = f"{scaling.autoscale[0]}..{scaling.autoscale[1]}" if scaling.autoscale else str(scaling.replicas)
            print(f"{listening_line(config, config.port)} (Ray Serve, {count} replicas)", file=sys.stderr, flush=True)
            stop.wait()
        finally:
            serve.delete(APP_NAME)  # each replica drains (graceful_shutdown_timeout_s = --shutdown-grace), then closes
    finally:
        if scaling.address is None:  # our own cluster; on a shared one, only our app goes
            serve.shutdown()
            ray.shutdown()


# A local cluster's GCS declares its own (only) node dead after 5 missed health checks of up to 10 s each (Ray's
# defaults): on a busy 2-core machine a starved raylet missed them, every actor died with the node and the cluster
# hung (a CI run, 2026-11-28). One node cannot fail over to another, so a local cluster waits about 3 minutes.
LOCAL_HEALTH_CHECKS = {"health_check_failure_threshold": 60}


def init_ray(address: str | None, **options: Any) -> None:
    """ray.init, with specpack's proxy middleware (ray_proxy.py: a replica lost under a request gives an OpenAI error)
    in the environment of the processes a local cluster starts. Joining a running cluster (address), its proxies
    have the environment of its `ray start`: set RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH there
    (docs/ray_serve.md). An operator's own value of the variable is kept. A local cluster (no address) tolerates
    LOCAL_HEALTH_CHECKS missed health checks of its node."""
    import ray

    os.environ.setdefault(PROXY_CALLBACK_ENV, PROXY_CALLBACK)
    if address is None and not os.environ.get("RAY_ADDRESS"):  # a local cluster of this one node
        options.setdefault("_system_config", LOCAL_HEALTH_CHECKS)
    ray.init(address=address, **options)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handle(sig: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handle)
    return stop
