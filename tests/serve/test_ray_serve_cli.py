"""`specpack serve PACK --ray` end to end: its own local Ray cluster, 1 replica, the listening line, an answer, and a
clean stop on SIGTERM (the replica drained, Serve and Ray shut down), with either --pack-delivery (object-store: the
replica's private copy gone after the stop). Slow (~20 s each); skipped without ray[serve]."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from specpack.serve.pack_copy import COPY_NAME

pytest.importorskip("ray.serve", reason="ray[serve] is not installed (the `ray` extra: pip install -e '.[ray]')")
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _copies() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).iterdir() if COPY_NAME.match(p.name)}


@pytest.mark.parametrize("delivery", ["path", "object-store"])
def test_serve_ray_listens_answers_and_stops(tiny_pack: Callable[..., tuple[Path, Path, Path]], tmp_path: Path,
                                             delivery: str) -> None:
    pack_dir, port = tiny_pack("qwen2", "noisy")[0], _free_port()
    log = (tmp_path / "serve.log").open("w")
    specpack = str(Path(sys.executable).parent / "specpack")
    args = ["serve", str(pack_dir), "--ray", "--replicas", "1", "--port", str(port), "--model-name", "tiny",
            "--cpus-per-replica", "0.5", "--pack-delivery", delivery]
    copies = _copies()
    proc = subprocess.Popen([specpack, *args], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while "listening on" not in (text := (tmp_path / "serve.log").read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, text
            time.sleep(0.5)
        assert f"http://127.0.0.1:{port}/v1 (OpenAI base_url), model \"tiny\"" in text and "(Ray Serve, 1 replicas)" in text
        assert ("the pack is in Ray's object store" in text) == (delivery == "object-store"), text
        assert len(_copies() - copies) == (delivery == "object-store")  # the replica's private copy
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as answer:
            assert [m["id"] for m in json.load(answer)["data"]] == ["tiny"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, (tmp_path / "serve.log").read_text()
        assert _copies() <= copies  # removed as the replica shut down
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
