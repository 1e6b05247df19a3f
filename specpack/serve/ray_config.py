"""How a pack is replicated on Ray Serve: one frozen dataclass, its defaults in one place (the CLI reads them).

No ray import here: the CLI checks these options before it looks for ray.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from specpack.errors import SpecpackError

MAX_REPLICAS = 1024
AUTOSCALE = re.compile(r"^(\d+)\.\.(\d+)$")
# Ray's controller finds a dead replica only when a health check of it fails: checks every 2 s (Ray's default 10 s)
# start a replacement sooner; an idle replica generates its probe token at most every probe.PROBE_EVERY_S
HEALTH_CHECK_PERIOD_S = 2.0
HEALTH_CHECK_TIMEOUT_S = 30.0  # above probe.PROBE_TIMEOUT_S
# how replicas get the pack (docs/ray_serve.md): its path, seen by every node; or the driver's copy in Ray's object store
PACK_DELIVERIES = ("path", "object-store")


@dataclass(frozen=True)
class RayScaling:
    replicas: int = 1                     # fixed replica count (ignored when autoscale is set)
    autoscale: tuple[int, int] | None = None  # (min, max) replicas, scaled on ongoing requests per replica
    gpus_per_replica: float = 0.0         # Ray's num_gpus per replica actor (a fraction shares a GPU)
    cpus_per_replica: float = 1.0         # Ray's num_cpus per replica actor
    address: str | None = None            # a running cluster (`ray start --head`'s address, or "auto"); None: a local one
    upscale_delay_s: float | None = None  # with autoscale: load above target this long adds a replica (None: Ray's 30 s)
    downscale_delay_s: float | None = None  # ... below target this long removes one (None: Ray's 600 s)
    pack_delivery: str = "path"           # one of PACK_DELIVERIES

    def __post_init__(self) -> None:
        if not 1 <= self.replicas <= MAX_REPLICAS:
            raise SpecpackError("invalid --replicas", expected=f"an integer in 1..{MAX_REPLICAS}", found=str(self.replicas))
        if self.autoscale is not None:
            low, high = self.autoscale
            if not 0 <= low <= high <= MAX_REPLICAS or high < 1:
                raise SpecpackError("invalid --autoscale", expected=f"MIN..MAX with 0 <= MIN <= MAX <= {MAX_REPLICAS}, "
                                    "MAX >= 1", found=f"{low}..{high}")
        if not self.gpus_per_replica >= 0:  # NaN too
            raise SpecpackError("invalid --gpus-per-replica", expected="a number >= 0", found=str(self.gpus_per_replica))
        if not self.cpus_per_replica > 0:
            raise SpecpackError("invalid --cpus-per-replica", expected="a number > 0", found=str(self.cpus_per_replica))
        for name in ("upscale_delay_s", "downscale_delay_s"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise SpecpackError(f"invalid {name}", expected="a number of seconds >= 0", found=str(value))
        if self.pack_delivery not in PACK_DELIVERIES:
            raise SpecpackError("invalid --pack-delivery", expected=" | ".join(PACK_DELIVERIES),
                                found=repr(self.pack_delivery))

    def deployment_options(self, max_batch: int, max_queue: int, shutdown_grace_s: float) -> dict[str, Any]:
        """Ray Serve's deployment options: replicas or autoscaling, the actor's resources, the graceful drain.

        A replica takes at most max_batch + max_queue requests (the decoder's own bound); Ray queues the rest in
        its router, or sends them to another replica. Autoscaling targets max_batch ongoing requests per replica."""
        options: dict[str, Any] = {
            "ray_actor_options": {"num_cpus": self.cpus_per_replica, "num_gpus": self.gpus_per_replica},
            "max_ongoing_requests": max_batch + max_queue,
            "graceful_shutdown_timeout_s": shutdown_grace_s,  # in-flight requests finish, then the decoder aborts the rest
            "graceful_shutdown_wait_loop_s": 0.5,
            "health_check_period_s": HEALTH_CHECK_PERIOD_S,
            "health_check_timeout_s": HEALTH_CHECK_TIMEOUT_S,
        }
        if self.autoscale is None:
            options["num_replicas"] = self.replicas
        else:
            low, high = self.autoscale
            options["autoscaling_config"] = {"min_replicas": low, "max_replicas": high, "initial_replicas": max(low, 1),
                                             "target_ongoing_requests": max_batch}
            for name in ("upscale_delay_s", "downscale_delay_s"):
                if getattr(self, name) is not None:
                    options["autoscaling_config"][name] = getattr(self, name)
        return options


def parse_autoscale(text: str | None) -> tuple[int, int] | None:
    """`--autoscale MIN..MAX` -> (MIN, MAX); None stays None."""
    if text is None:
        return None
    match = AUTOSCALE.match(text.strip())
    if match is None:
        raise SpecpackError("invalid --autoscale", expected="MIN..MAX, e.g. 1..4", found=repr(text))
    return int(match.group(1)), int(match.group(2))
