"""SIGTERM: in-flight requests finish within the grace period, or are cancelled cleanly after it; waiting ones, and
requests still arriving, get 503."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
from conftest import MODEL, Live
from raw_http import answer, closed, connect, is_error_object, post_head
from serve_harness import wait_until

from specpack.serve.app import build_app
from specpack.serve.config import ServeConfig
from specpack.serve.server import serve_in_thread

HERE = Path(__file__).resolve().parent
PROMPT = "def fibonacci(n):\n    "


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server_process(live: Live, delay: float, grace: float, log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, str(HERE / "slow_server.py"), str(live.pack_dir), str(port),
                                 str(delay), str(grace)], stdout=out, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{port}/v1"
        try:
            with openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=5) as probe:
                assert wait_until(lambda: _up(probe), timeout=60), log.read_text()
            yield proc, url
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _up(client: openai.OpenAI) -> bool:
    try:
        client.models.list()
        return True
    except openai.APIConnectionError:
        return False


def test_sigterm_lets_the_running_request_finish_and_refuses_the_waiting(live: Live, tmp_path: Path) -> None:
    want = live.reference.generate(PROMPT, 40).text
    with server_process(live, delay=0.04, grace=30, log=tmp_path / "log") as (proc, url), \
            openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60) as client:
        stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stream=True)
        text = [next(stream).choices[0].text]
        waiting: list[BaseException] = []
        waiter = threading.Thread(target=lambda: _capture(waiting, lambda: client.completions.create(
            model=MODEL, prompt="x", max_tokens=4)))
        waiter.start()
        time.sleep(0.3)  # the second request is queued behind the first
        proc.send_signal(signal.SIGTERM)
        text += [c.choices[0].text for c in stream]
        waiter.join(timeout=30)
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    assert "".join(text) == want  # the in-flight request finished in full
    assert len(waiting) == 1 and isinstance(waiting[0], openai.APIStatusError), waiting
    assert waiting[0].status_code == 503 and waiting[0].code == "shutting_down"
    assert "Traceback" not in (tmp_path / "log").read_text()


def test_sigterm_after_the_grace_period_cancels_the_decode_cleanly(live: Live, tmp_path: Path) -> None:
    with server_process(live, delay=0.05, grace=0, log=tmp_path / "log") as (proc, url), \
            openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60) as client:
        stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=200, stream=True)
        next(stream)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            for _ in stream:
                pass
            raise AssertionError("the stream should end with the shutdown error")
        except openai.APIError as err:  # the error event in the stream, which then ends with [DONE]
            assert "shutting down" in err.message
        assert proc.wait(timeout=20) in (0, -signal.SIGTERM)
        assert time.monotonic() - started < 10  # not the ~10 s the 200 tokens would take
    log = (tmp_path / "log").read_text()
    assert "Traceback" not in log, log


def _capture(sink: list[BaseException], call: Callable[[], object]) -> None:
    try:
        call()
    except Exception as err:
        sink.append(err)


def test_requests_still_arriving_at_shutdown_get_the_503_error_object(live: Live) -> None:
    """The finding: a half-sent request at shutdown got a plain-text 500 (the backstop cancelled its task)."""
    config = ServeConfig(live.pack_dir, model_name=MODEL, shutdown_grace_s=0)
    running = serve_in_thread(build_app(live.pack, config))
    url = running.__enter__()
    body, head = connect(url), connect(url)
    body.sendall(post_head("/v1/completions", 100) + b'{"model": ')
    head.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-")
    time.sleep(0.1)
    started = time.monotonic()
    stopper = threading.Thread(target=running.__exit__, args=(None, None, None))
    stopper.start()
    for sock in (body, head):
        status, _, error = answer(sock)
        assert status == 503 and is_error_object(error) and error["code"] == "shutting_down", (status, error)
        assert closed(sock)
        sock.close()
    stopper.join(timeout=10)
    assert not stopper.is_alive() and time.monotonic() - started < 2
