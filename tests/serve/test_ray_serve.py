"""The same app on Ray Serve (specpack/serve/ray_app.py): a local Ray cluster of 2 CPUs, the tiny qwen2 pack.

2 replicas (built as `serve run` builds them, from_args) answer the official openai client (streamed or not) with
Pack.generate's greedy text, and its errors; a tampered pack is refused by every replica. Slow (a Ray cluster starts
in ~10 s); skipped without ray[serve] (`pip install -e '.[ray]'`).
"""

from __future__ import annotations

import json
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

import specpack
from specpack.contract.manifest import manifest_sha256
from specpack.serve.config import ServeConfig
from specpack.serve.ray_config import RayScaling

ray = pytest.importorskip("ray", reason="ray[serve] is not installed (the `ray` extra: pip install -e '.[ray]')")
serve = pytest.importorskip("ray.serve", reason="ray is installed without its serve extra")
from specpack.serve.ray_app import DEPLOYMENT_NAME, application, from_args  # noqa: E402  (imports ray)

pytestmark = pytest.mark.slow
MODEL = "tiny"
APP = "specpack"
PROMPT = "def fibonacci(n):\n    "
N = 16


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def ray_url() -> Iterator[str]:
    """A local Ray cluster (2 CPUs) with Serve's HTTP proxy on a free port."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def pack_dir(tiny_pack: Callable[..., tuple[Path, Path, Path]]) -> Path:
    return tiny_pack("qwen2", "noisy")[0]


def _replica_states() -> dict[str, int]:
    status = serve.status().applications[APP].deployments[DEPLOYMENT_NAME]
    return {str(state): n for state, n in status.replica_states.items()}


def test_two_replicas_answer_the_openai_client(ray_url: str, pack_dir: Path) -> None:
    # as `serve run specpack.serve.ray_app:from_args pack=... replicas=2` builds it: every value a string
    serve.run(from_args({"pack": str(pack_dir), "model_name": MODEL, "replicas": "2", "max_queue": "8"}), name=APP,
              route_prefix="/")
    try:
        assert sum(n for state, n in _replica_states().items() if "RUNNING" in state) == 2
        reference = specpack.load(pack_dir)
        want = reference.generate(PROMPT, N).text
        reference.close()
        client = openai.OpenAI(base_url=f"{ray_url}/v1", api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == [MODEL]

        def complete(_: int) -> str:
            return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0).choices[0].text

        def stream(_: int) -> str:
            chunks = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0, stream=True)
            return "".join(c.choices[0].text for c in chunks if c.choices)

        with ThreadPoolExecutor(4) as pool:  # concurrent: both replicas take some
            texts = list(pool.map(complete, range(4))) + list(pool.map(stream, range(4)))
        assert texts == [want] * 8
        # the same errors as `specpack serve`: an OpenAI error object through Ray's proxy
        with pytest.raises(openai.NotFoundError) as err:
            client.completions.create(model="other", prompt=PROMPT, max_tokens=1)
        assert err.value.code == "model_not_found"
    finally:
        serve.delete(APP)


def _tampered_copy(pack_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "pack"
    shutil.copytree(pack_dir, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["max_len"] = int(manifest["max_len"]) - 1  # another manifest than the pinned one
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def test_a_tampered_pack_is_refused_by_every_replica(ray_url: str, pack_dir: Path, tmp_path: Path) -> None:
    tampered = _tampered_copy(pack_dir, tmp_path)
    config = ServeConfig(tampered, model_name=MODEL, manifest_sha256=manifest_sha256(pack_dir))  # pinned: the original
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="Deploying application specpack failed"):
        serve.run(application(config, RayScaling(replicas=2)), name=APP, route_prefix="/")
    deployment = serve.status().applications[APP].deployments[DEPLOYMENT_NAME]
    assert "failed to start" in deployment.message, deployment.message  # every start Ray tried was refused
    assert "sha256" in deployment.message, deployment.message  # by specpack.load, against the pin
    states: dict[str, Any] = _replica_states()
    assert not any("RUNNING" in state for state in states), states  # no replica serves the tampered pack
    assert time.monotonic() - start < 60
    serve.delete(APP)
