"""`specpack serve --ray` options, checked before Ray starts (no cluster here: fast); ray_config's scaling options."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from specpack.cli.main import cli
from specpack.errors import SpecpackError
from specpack.serve.ray_config import RayScaling, parse_autoscale


def _serve(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["serve", "PACK", *args])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def test_the_cli_does_not_import_ray() -> None:
    code = "import sys, specpack.cli.main; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ray_options_without_ray_exit_2() -> None:
    code, out = _serve("--replicas", "2", "--gpus-per-replica", "1")
    assert code == 2 and "--replicas, --gpus-per-replica without --ray" in out and "hint:" in out, out


def test_pack_delivery_is_a_ray_option_of_two_values() -> None:
    code, out = _serve("--pack-delivery", "object-store")
    assert code == 2 and "--pack-delivery without --ray" in out, out
    code, out = _serve("--ray", "--pack-delivery", "auto")
    assert code == 2 and "'path', 'object-store'" in out, out
    with pytest.raises(SpecpackError, match="invalid --pack-delivery"):
        RayScaling(pack_delivery="s3")


def test_replicas_and_autoscale_together_exit_2() -> None:
    code, out = _serve("--ray", "--replicas", "2", "--autoscale", "1..4")
    assert code == 2 and "--replicas and --autoscale together" in out, out


@pytest.mark.parametrize("args", [["--autoscale", "4"], ["--autoscale", "3..1"], ["--autoscale", "0..0"],
                                  ["--replicas", "0"], ["--gpus-per-replica", "-1"], ["--cpus-per-replica", "0"],
                                  ["--gpus-per-replica", "nan"]])
def test_bad_scaling_values_exit_2(args: list[str]) -> None:
    code, out = _serve("--ray", *args)
    assert code == 2 and f"invalid {args[0]}" in out and "expected:" in out, out


def test_without_ray_installed_exit_2_with_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as where it is not installed
    monkeypatch.setitem(sys.modules, "ray.serve", None)
    code, out = _serve("--ray", "--replicas", "2")
    assert code == 2 and "needs the ray extra" in out and "expected: ray[serve] 2.60" in out, out
    assert "pip install 'specpack[ray]'" in out, out


def test_scaling_options_for_ray_serve() -> None:
    fixed = RayScaling(replicas=3, gpus_per_replica=0.5).deployment_options(max_batch=2, max_queue=8, shutdown_grace_s=5)
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    assert fixed["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0.5}
    assert fixed["max_ongoing_requests"] == 10 and fixed["graceful_shutdown_timeout_s"] == 5
    auto = RayScaling(autoscale=parse_autoscale("0..4")).deployment_options(max_batch=2, max_queue=8, shutdown_grace_s=5)
    assert "num_replicas" not in auto
    assert auto["autoscaling_config"] == {"min_replicas": 0, "max_replicas": 4, "initial_replicas": 1,
                                          "target_ongoing_requests": 2}  # Ray's delays unless given
    quick = RayScaling(autoscale=(1, 2), upscale_delay_s=1, downscale_delay_s=0).deployment_options(1, 0, 5)
    assert quick["autoscaling_config"]["upscale_delay_s"] == 1 and quick["autoscaling_config"]["downscale_delay_s"] == 0
    with pytest.raises(SpecpackError, match="invalid downscale_delay_s"):
        RayScaling(autoscale=(1, 2), downscale_delay_s=-1)
    with pytest.raises(SpecpackError, match=r"MIN\.\.MAX"):
        parse_autoscale("1-4")
