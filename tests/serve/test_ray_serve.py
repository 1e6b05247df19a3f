"""The same app on Ray Serve (specpack/serve/ray_app.py): a local Ray cluster of 2 CPUs, the tiny qwen2 pack.

A replica's process killed under load (the default set): the other replica goes on, every request on the dead one
ends with specpack's retryable error (ray_proxy.py), none hangs, and a new replica serves within 30 s. Slow: 2
replicas of --max-batch 2 (built as `serve run` builds them, from_args) answer the official openai client (streamed
or not) with Pack.generate's greedy text, batching, and its errors; a tampered pack is refused by every replica;
autoscaling from 1 to 2 replicas under load and back. The cluster starts once per module (~10 s); skipped without
ray[serve] (`pip install -e '.[ray]'`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from serve_harness import metric

import specpack
from specpack.contract.manifest import manifest_sha256
from specpack.errors import SpecpackError
from specpack.serve.config import ServeConfig
from specpack.serve.pack_copy import COPY_NAME, COPY_PREFIX
from specpack.serve.ray_config import RayScaling

ray = pytest.importorskip("ray", reason="ray[serve] is not installed (the `ray` extra: pip install -e '.[ray]')")
serve = pytest.importorskip("ray.serve", reason="ray is installed without its serve extra")
from specpack.serve.ray_app import DEPLOYMENT_NAME, application, from_args  # noqa: E402  (imports ray)
from specpack.serve.ray_host import init_ray  # noqa: E402
from specpack.serve.ray_objects import put_pack  # noqa: E402

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
    """A local Ray cluster (2 CPUs) with Serve's HTTP proxy on a free port, started as `specpack serve --ray` starts
    it (init_ray: the proxy finishes what a lost replica leaves unanswered)."""
    init_ray(None, num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
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


@pytest.mark.slow
def test_two_replicas_answer_the_openai_client(ray_url: str, pack_dir: Path) -> None:
    # as `serve run specpack.serve.ray_app:from_args pack=... replicas=2` builds it: every value a string
    serve.run(from_args({"pack": str(pack_dir), "model_name": MODEL, "replicas": "2", "max_queue": "8",
                        "max_batch": "2"}), name=APP, route_prefix="/")  # each replica's batching scheduler
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
        long_want = specpack.load(pack_dir)
        want48 = long_want.generate(PROMPT, KILL_TOKENS).text
        long_want.close()
        with ThreadPoolExecutor(8) as pool:  # 4 at a time per replica: steps of 2 rows
            outs = list(pool.map(lambda _: _request(client, "plain"), range(16)))
        assert [(o.text, o.error) for o in outs] == [(want48, None)] * 16
        batched = []
        for _ in range(12):  # /metrics answers for the replica it lands on
            with urllib.request.urlopen(f"{ray_url}/metrics", timeout=10) as answer:
                text = answer.read().decode()
            assert 'specpack_batch_rows_bucket{le="1.0"}' in text  # (metric() reads an absent sample as 0)
            batched.append(metric(text, "specpack_batch_rows_count") - metric(text, 'specpack_batch_rows_bucket{le="1.0"}'))
        assert max(batched) > 0, "no replica decoded a step of 2 requests"
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


@pytest.mark.slow
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


# -- the pack through Ray's object store (--pack-delivery object-store) -------------------------------------------


def _copies(pids: Collection[int] | None = None) -> list[Path]:
    """The replicas' private copies of the pack (pack_copy.materialize: the node's temporary directory, by pid; whole
    or partial), of these processes (None: of any)."""
    return sorted(p for p in Path(tempfile.gettempdir()).iterdir()
                  if (m := COPY_NAME.match(p.name)) and (pids is None or int(m.group(1)) in pids))


def test_a_pack_that_does_not_match_its_pin_is_not_put(ray_url: str, pack_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(SpecpackError, match="not the manifest this pack was pinned to"):
        put_pack(_tampered_copy(pack_dir, tmp_path), manifest_sha256(pack_dir))
    with pytest.raises(SpecpackError, match="the shipped pack is not the pinned one"):
        other = tmp_path / "other"
        shutil.copytree(tmp_path / "pack", other)
        application(ServeConfig(pack_dir, manifest_sha256=manifest_sha256(pack_dir)), RayScaling(),
                    put_pack(other, manifest_sha256(other)))


@pytest.mark.slow
def test_two_replicas_serve_from_the_object_store(ray_url: str, pack_dir: Path, tmp_path: Path) -> None:
    driver_pack = tmp_path / "pack"
    shutil.copytree(pack_dir, driver_pack)
    pin = manifest_sha256(driver_pack)
    shipped = put_pack(driver_pack, pin)
    assert shipped.files[0].path == "manifest.json" and shipped.size > 0
    driver_pack.rename(tmp_path / "moved")  # the replicas have nothing but the objects
    config = ServeConfig(driver_pack, model_name=MODEL, manifest_sha256=pin, max_queue=8)
    serve.run(application(config, RayScaling(replicas=2), shipped), name=APP, route_prefix="/")
    try:
        pids = list(_alive_replicas().values())
        assert len(pids) == 2 and _running() == 2
        copies = _copies(pids)
        assert [c.name.startswith(COPY_PREFIX) for c in copies] == [True, True], copies  # whole copies, one each
        assert all((c / "manifest.json").read_bytes() == (tmp_path / "moved" / "manifest.json").read_bytes()
                   for c in copies)
        with specpack.load(tmp_path / "moved") as reference:
            want = reference.generate(PROMPT, N).text
        client = openai.OpenAI(base_url=f"{ray_url}/v1", api_key="unused", max_retries=0, timeout=60)

        def answers(n: int) -> list[str]:
            with ThreadPoolExecutor(4) as pool:  # concurrent: both replicas take some
                return list(pool.map(lambda _: client.completions.create(
                    model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0).choices[0].text, range(n)))

        assert answers(8) == [want] * 8
        # a replacement copies the pack again (the driver's objects, not its path); the killed one's copy goes
        before = _alive_replicas()
        victim = sorted(before)[0]
        os.kill(before[victim], signal.SIGKILL)
        killed = time.monotonic()
        while not (set(_alive_replicas()) - set(before) and _running() == 2):
            assert time.monotonic() - killed < RECOVERY_S, f"no new replica {RECOVERY_S:g} s after the kill"
            time.sleep(0.2)
        pids = list(_alive_replicas().values())
        assert [c.name.startswith(COPY_PREFIX) for c in _copies(pids)] == [True, True]
        assert _copies([before[victim]]) == []  # removed by the replacement's copy (pack_copy.remove_orphans)
        assert answers(4) == [want] * 4
    finally:
        serve.delete(APP)
    assert _copies(pids) == []  # each replica removed its copy as it shut down


@pytest.mark.slow
def test_a_tampered_object_is_refused_by_every_replica(ray_url: str, pack_dir: Path) -> None:
    pin = manifest_sha256(pack_dir)
    shipped = put_pack(pack_dir, pin)
    victim = max(shipped.files, key=lambda f: f.size)  # a graph's bytes, changed in the object store
    data = bytearray(ray.get(victim.pieces[0]))
    data[len(data) // 2] ^= 1
    bad = dataclasses.replace(victim, pieces=(ray.put(bytes(data)), *victim.pieces[1:]))
    tampered = dataclasses.replace(shipped, files=tuple(bad if f is victim else f for f in shipped.files))
    before = set(_copies())
    with pytest.raises(RuntimeError, match="Deploying application specpack failed"):
        serve.run(application(ServeConfig(pack_dir, model_name=MODEL, manifest_sha256=pin), RayScaling(replicas=2),
                              tampered), name=APP, route_prefix="/")
    deployment = serve.status().applications[APP].deployments[DEPLOYMENT_NAME]
    assert "failed to start" in deployment.message, deployment.message  # every start Ray tried was refused
    assert f"pack file {victim.path} does not match the pinned manifest" in deployment.message, deployment.message
    assert not any("RUNNING" in state for state in _replica_states()), _replica_states()
    assert set(_copies()) <= before  # every refused replica removed its copy
    serve.delete(APP)


# -- a replica killed under load ---------------------------------------------------------------------------------

KILL_TOKENS = 48     # a stream long enough to be in flight when the replica dies
CLIENT_TIMEOUT_S = 20.0  # bounded: a request that hangs fails the test as APITimeoutError
RECOVERY_S = 30.0    # the target: a new replica serves within 30 s of the kill


@dataclass
class Outcome:
    kind: str            # "stream" or "plain"
    start: float         # time.monotonic() when it was sent
    end: float
    text: str            # what arrived (all of it, or the part before the error)
    error: BaseException | None


def _alive_replicas() -> dict[str, int]:
    """{actor id: pid} of the live replica actors, from Ray's actor table (the GCS's; the public state API needs the
    dashboard, which these clusters run without)."""
    from ray._private import state

    return {actor_id: int(actor["Pid"]) for actor_id, actor in state.actors().items()
            if actor["ActorClassName"].startswith("ServeReplica:") and actor["State"] == "ALIVE"}


def _running() -> int:
    return sum(n for state, n in _replica_states().items() if "RUNNING" in state)


def _request(client: openai.OpenAI, kind: str) -> Outcome:
    start, text = time.monotonic(), []  # text: what arrived
    try:
        if kind == "stream":
            for chunk in client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=KILL_TOKENS, temperature=0,
                                                   stream=True):
                text += [c.text for c in chunk.choices]
        else:
            text.append(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=KILL_TOKENS,
                                                  temperature=0).choices[0].text)
    except openai.APIError as err:
        return Outcome(kind, start, time.monotonic(), "".join(text), err)
    return Outcome(kind, start, time.monotonic(), "".join(text), None)


def _retryable(outcome: Outcome) -> bool:
    """specpack's replica-lost error: a 503 before the response started, or the error event of a cut stream."""
    err = outcome.error
    if isinstance(err, openai.APIStatusError):
        return err.status_code == 503 and err.code == "replica_lost" and err.response.headers.get("retry-after") == "1"
    return outcome.kind == "stream" and type(err) is openai.APIError and err.code == "replica_lost"


def test_a_replica_killed_under_load(ray_url: str, pack_dir: Path) -> None:
    serve.run(application(ServeConfig(pack_dir, model_name=MODEL, max_queue=8), RayScaling(replicas=2)), name=APP,
              route_prefix="/")
    try:
        reference = specpack.load(pack_dir)
        want = reference.generate(PROMPT, KILL_TOKENS).text
        reference.close()
        client = openai.OpenAI(base_url=f"{ray_url}/v1", api_key="unused", max_retries=0, timeout=CLIENT_TIMEOUT_S)
        stop = threading.Event()
        outcomes: list[Outcome] = []

        def load(kind: str) -> None:
            while not stop.is_set():
                outcomes.append(_request(client, kind))

        before = _alive_replicas()
        assert len(before) == 2, before
        with ThreadPoolExecutor(5) as pool:  # 3 streams and 2 plain calls at all times, over both replicas
            loads = [pool.submit(load, kind) for kind in ("stream",) * 3 + ("plain",) * 2]
            time.sleep(1.0)
            victim = sorted(before)[0]
            os.kill(before[victim], signal.SIGKILL)
            killed = time.monotonic()
            while sum(o.error is None and o.start > killed for o in outcomes) < 4:  # the other replica goes on
                assert time.monotonic() - killed < CLIENT_TIMEOUT_S, "no request served after the kill"
                time.sleep(0.1)
            replacement_then = set(_alive_replicas()) - set(before)  # (a new replica needs > 2 s to come up)
            stop.set()  # the rest of the cores to the new replica's start
            for f in loads:
                f.result()
        while not (set(_alive_replicas()) - set(before) and _running() == 2):
            assert time.monotonic() - killed < RECOVERY_S, f"no new replica {RECOVERY_S:g} s after the kill"
            time.sleep(0.2)
        recovered = time.monotonic()
        assert not replacement_then, "the requests after the kill were the surviving replica's alone"
        failed = [o for o in outcomes if o.error is not None]
        assert failed, "no request was in flight on the killed replica"  # 5 in flight over 2 replicas: ~2 on each
        assert all(_retryable(o) for o in failed), [(o.kind, repr(o.error)) for o in failed if not _retryable(o)]
        assert all(want.startswith(o.text) for o in failed), "a cut stream's text is the greedy text's start"
        assert all(o.text == want for o in outcomes if o.error is None)
        assert all(o.end - o.start < CLIENT_TIMEOUT_S for o in outcomes)  # none hung
        # Ray's router drops a replica on the first call that finds it dead: only requests in flight at the kill, or
        # sent to it as it died, fail
        assert all(o.start < killed + 1.0 for o in failed), [o.start - killed for o in failed]
        with ThreadPoolExecutor(4) as pool:  # both replicas serve again: the survivor and the new one
            texts = list(pool.map(lambda _: _request(client, "plain"), range(8)))
        assert [(o.text, o.error) for o in texts] == [(want, None)] * 8
        print(f"kill: {len(outcomes)} requests, {len(failed)} failed "
              f"({sorted((o.kind, type(o.error).__name__) for o in failed)}), recovered in {recovered - killed:.1f} s")
    finally:
        serve.delete(APP)


@pytest.mark.slow
def test_autoscaling_from_one_to_two_replicas_under_load_and_back(ray_url: str, pack_dir: Path) -> None:
    # target 1 ongoing request per replica (--max-batch 1); 3 clients streaming at all times need 2 replicas
    scaling = RayScaling(autoscale=(1, 2), upscale_delay_s=1.0, downscale_delay_s=2.0)
    serve.run(application(ServeConfig(pack_dir, model_name=MODEL, max_queue=8), scaling), name=APP, route_prefix="/")
    try:
        reference = specpack.load(pack_dir)
        want = reference.generate(PROMPT, KILL_TOKENS).text
        reference.close()
        client = openai.OpenAI(base_url=f"{ray_url}/v1", api_key="unused", max_retries=0, timeout=CLIENT_TIMEOUT_S)
        assert _running() == 1
        stop = threading.Event()
        outcomes: list[Outcome] = []

        def load() -> None:
            while not stop.is_set():
                outcomes.append(_request(client, "stream"))

        start = time.monotonic()
        with ThreadPoolExecutor(3) as pool:
            loads = [pool.submit(load) for _ in range(3)]
            while _running() < 2:
                assert time.monotonic() - start < 60, "no second replica after 60 s of load"
                time.sleep(0.2)
            up = time.monotonic()
            served = len(outcomes)
            while len(outcomes) < served + 8:  # both replicas under load
                assert time.monotonic() - up < CLIENT_TIMEOUT_S, "no request served with two replicas"
                time.sleep(0.1)
            stop.set()
            for f in loads:
                f.result()
        idle = time.monotonic()
        while _running() > 1 or len(_alive_replicas()) > 1:  # the second one drained and gone
            assert time.monotonic() - idle < 60, "still 2 replicas 60 s after the load stopped"
            time.sleep(0.2)
        down = time.monotonic()
        assert [(o.text, o.error) for o in outcomes] == [(want, None)] * len(outcomes)  # nothing lost either way
        out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=KILL_TOKENS, temperature=0)
        assert out.choices[0].text == want  # the one left serves
        print(f"autoscale: 1 -> 2 after {up - start:.1f} s of load, 2 -> 1 {down - idle:.1f} s after it stopped, "
              f"{len(outcomes)} requests")
    finally:
        serve.delete(APP)
