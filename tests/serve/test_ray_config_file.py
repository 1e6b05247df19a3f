"""docs/examples/ray_serve.yaml: valid for Ray Serve's schema, and its args build the app as `serve run` would (no
cluster: fast). Skipped without ray[serve]."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from specpack.contract.manifest import manifest_sha256
from specpack.errors import SpecpackError

pytest.importorskip("ray.serve", reason="ray[serve] is not installed (the `ray` extra: pip install -e '.[ray]')")
import yaml
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
from ray.serve.schema import ServeDeploySchema

from specpack.serve.ray_app import from_args

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "ray_serve.yaml"


def test_the_example_builds_the_app(tiny_pack: Callable[..., tuple[Path, Path, Path]]) -> None:
    config = ServeDeploySchema.model_validate(yaml.safe_load(EXAMPLE.read_text()))
    (entry,) = config.applications
    assert entry.import_path == "specpack.serve.ray_app:from_args"
    pack = tiny_pack("qwen2", "noisy")[0]
    args = {**entry.args, "pack": str(pack), "manifest_sha256": manifest_sha256(pack)}
    app = call_user_app_builder_with_args_if_necessary(from_args, args)
    deployment = app._bound_deployment
    assert deployment._deployment_config.autoscaling_config.max_replicas == 4
    assert deployment.ray_actor_options["num_cpus"] == 2
    served, shipped = app._bound_deployment.init_args
    assert shipped is None  # a config file's pack is read by path (no pack_delivery: docs/ray_serve.md)
    assert served.pack == pack.resolve() and served.manifest_sha256 == manifest_sha256(pack)
    assert served.threads == 2  # cpus_per_replica: a replica's sessions spin no more threads than it has CPUs


def test_unknown_or_missing_args_are_refused() -> None:
    with pytest.raises(SpecpackError, match="unknown \\['replica'\\]") as err:
        from_args({"pack": "p", "replica": 2})
    assert "replicas" in str(err.value)  # the names it takes
    with pytest.raises(SpecpackError, match="no pack"):
        from_args({"replicas": 2})
    with pytest.raises(SpecpackError, match="invalid max_queue"):
        from_args({"pack": "p", "max_queue": "many"})
