"""At the file-descriptor limit the server keeps serving its open connections and logs one line, not a traceback
per failed accept (64 MB of log in 30 s were seen); --max-connections is fitted under the limit at startup."""

from __future__ import annotations

import os
import resource
import socket
import time

import pytest
from conftest import MODEL, Live
from raw_http import address, answer, captured_logs, connect, request

from specpack.errors import SpecpackError
from specpack.serve import descriptors
from specpack.serve.app import build_app
from specpack.serve.config import ServeConfig
from specpack.serve.server import serve_in_thread

WAITING = 6  # connections queued by the kernel while the server has no descriptor to accept them with


def test_at_the_descriptor_limit_one_line_is_logged_and_open_connections_are_served(live: Live) -> None:
    config = ServeConfig(live.pack_dir, model_name=MODEL)
    with serve_in_thread(build_app(live.pack, config)) as url, connect(url) as kept, \
            captured_logs("asyncio", "specpack", "uvicorn.error") as records:
        kept.sendall(request("GET", "/health"))
        assert answer(kept)[0] == 200
        waiting = [socket.socket() for _ in range(WAITING)]  # their descriptors exist before the limit drops
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        lowest_free = os.open(os.devnull, os.O_RDONLY)  # the descriptor the next accept() would get
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # no descriptor left for accept()
        try:
            for sock in waiting:
                sock.setblocking(False)
                sock.connect_ex(address(url))
            time.sleep(0.3)  # accept() fails meanwhile (asyncio retries it every second)
            kept.sendall(request("GET", "/health"))  # an open connection is still answered
            assert answer(kept)[0] == 200
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for sock in waiting:  # accepted once descriptors are back, and answered
            sock.setblocking(True)
            sock.settimeout(5)
            sock.sendall(request("GET", "/health", extra="Connection: close\r\n"))
            assert answer(sock)[0] == 200
            sock.close()
    accept = [r for r in records if "accept" in r.getMessage()]
    assert len(accept) == 1 and "Too many open files" in accept[0].getMessage(), [r.getMessage() for r in records[:3]]
    assert not any(r.exc_info for r in records)


def test_the_soft_limit_is_raised_to_fit_max_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    set_to: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, 4096))
    monkeypatch.setattr(resource, "setrlimit", lambda _, limits: set_to.append(limits))
    assert descriptors.fit_descriptors(1000) == 1000 + descriptors.RESERVE
    assert set_to == [(1000 + descriptors.RESERVE, 4096)]
    assert descriptors.fit_descriptors(100) == 256 and len(set_to) == 1  # already enough: untouched


def test_max_connections_past_the_hard_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, 512))
    with pytest.raises(SpecpackError) as info:
        descriptors.fit_descriptors(1000)
    message = str(info.value)
    assert "--max-connections 1000" in message and "ulimit -n 256" in message
    assert f"--max-connections to {512 - descriptors.RESERVE}" in message
