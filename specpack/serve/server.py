"""Load a pack and serve it with uvicorn until SIGTERM or SIGINT.

Shutdown (SIGTERM, SIGINT, or leaving serve_in_thread): uvicorn stops accepting connections; the decoder refuses
new requests (503) and aborts the waiting ones (503); requests whose head or body is still arriving get 503 too
(connection.py, body.py); the running decode may finish within `shutdown_grace_s`, after which it is
aborted (a 503, in the stream if one started: the response still ends cleanly). uvicorn waits for the
responses to end (cancelling their tasks only as a backstop, BACKSTOP_S later), the app's lifespan waits for
the worker thread, and the pack is closed.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn

from specpack.errors import SpecpackError
from specpack.limits import check_k
from specpack.serve.app import build_app
from specpack.serve.config import ServeConfig
from specpack.serve.connection import ConnectionLimits, guarded_protocol
from specpack.serve.decoder import Decoder
from specpack.serve.descriptors import AcceptErrorLog, fit_descriptors

if TYPE_CHECKING:
    from specpack.runtime.pack import Pack

BACKSTOP_S = 10  # after the grace period, how long uvicorn waits for responses to end before cancelling them
log = logging.getLogger("specpack.serve")


def load_pack(config: ServeConfig) -> Pack:
    """specpack.load(PACK, device=..., ngram=..., manifest_sha256=...); --k checked against the pack's k_max, --drafter
    against the pack's drafters (a pack of the target alone has no draft model) and --tree against the pack's tree
    verify graph and the drafter, before anything listens."""
    import specpack
    from specpack.runtime.backend import BackendOptions

    pack = specpack.load(config.pack, device=config.device, ngram=config.ngram, manifest_sha256=config.manifest_sha256,
                         options=BackendOptions(slots=config.max_batch, threads=config.threads,  # a KV cache per row
                                                precapture="batcher"))  # every request goes through the batcher
    try:
        if config.k is not None:
            check_k(config.k, pack.manifest.k_max, what="--k")
        pack.check_tree(pack.drafter_named(config.drafter)[0], config.tree)
    except SpecpackError:
        pack.close()
        raise
    return pack


class SpecpackServer(uvicorn.Server):
    """uvicorn's server that drains the decoder as soon as a shutdown begins (a signal, or should_exit), and logs
    accept() failures at the descriptor limit one line at a time (descriptors.py)."""

    def __init__(self, config: uvicorn.Config, decoder: Decoder, grace_s: float, announce: str | None = None) -> None:
        super().__init__(config)
        self.decoder, self.grace_s, self.announce = decoder, grace_s, announce
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started and self.announce:  # listening: what a client needs to know, once
            log.info(self.announce)

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.set_exception_handler(AcceptErrorLog())
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is not None:  # a signal handler: hand the work to the event loop
            self._loop.call_soon_threadsafe(self.decoder.drain, self.grace_s)
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: Any = None) -> None:
        self.decoder.drain(self.grace_s)  # request bodies still arriving get 503 now, not a 500 at the backstop
        await super().shutdown(sockets)


def uvicorn_config(app: Any, config: ServeConfig, **options: Any) -> uvicorn.Config:
    """uvicorn's settings for build_app's app: the guarded h11 protocol (connection.py) with the config's limits,
    specpack's log lines beside uvicorn's, and asyncio's event loop (the one tested; uvicorn's "auto" would take uvloop
    wherever it is installed, as the ray extra installs it)."""
    limits = ConnectionLimits(config.read_timeout_s, config.max_connections)
    level = str(options.get("log_level", "info")).upper()
    return uvicorn.Config(app, http=guarded_protocol(limits), lifespan="on", loop="asyncio", log_config=log_config(level),
                          timeout_graceful_shutdown=math.ceil(config.shutdown_grace_s) + BACKSTOP_S, **options)


def log_config(level: str) -> dict[str, Any]:
    """uvicorn's logging configuration, with the `specpack` logger on its default handler at `level`."""
    from uvicorn.config import LOGGING_CONFIG

    logs = copy.deepcopy(LOGGING_CONFIG)
    logs["loggers"]["specpack"] = {"handlers": ["default"], "level": level, "propagate": False}
    return logs


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening address, bound before uvicorn starts: a bad --host or a port in use is refused with a message
    and exit status 2 (uvicorn would log it and exit with status 1 or 3)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as err:
        raise SpecpackError(f"cannot listen on --host {host}", expected="an address or host name of this machine "
                            "(127.0.0.1, 0.0.0.0, ::, localhost)", found=err.strerror or str(err)) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as err:
        sock.close()
        raise SpecpackError(f"cannot listen on {host}:{port}", expected="a free port on an address of this machine",
                            found=err.strerror or str(err),
                            hint="pick another --port, or stop the process that holds it") from None
    return sock


def serve(config: ServeConfig, pack: Pack | None = None) -> None:
    """Serve the pack (loaded from config.pack unless given); blocks until shutdown, then closes the pack.

    The address is bound first, so a port in use is refused before the pack loads (seconds to minutes)."""
    fit_descriptors(config.max_connections)
    try:
        sock = bind_socket(config.host, config.port)
    except SpecpackError:
        if pack is not None:
            pack.close()
        raise
    try:
        pack = load_pack(config) if pack is None else pack
        try:
            app = build_app(pack, config)
            uv_config = uvicorn_config(app, config, host=config.host, port=config.port, log_level="info")
            SpecpackServer(uv_config, app.state.decoder, config.shutdown_grace_s,
                           announce=listening_line(config, sock.getsockname()[1])).run(sockets=[sock])
        finally:
            pack.close()
    finally:
        sock.close()


def listening_line(config: ServeConfig, port: int) -> str:
    """The line printed once the server listens: its OpenAI base URL and the model name clients send."""
    host = f"[{config.host}]" if ":" in config.host else config.host
    return (f"specpack serve: listening on http://{host}:{port}/v1 (OpenAI base_url), model \"{config.served_name}\"; "
            f"try: curl http://{host}:{port}/v1/models")


@contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve an app (build_app's) from a thread of this process on a free port; yields its URL, stops on exit.

    For tests and benchmarks, and for services that embed the server: no signal handling (uvicorn installs none
    outside the main thread), so the caller stops it by leaving the block (which drains the decoder, as SIGTERM
    does, with the app's --shutdown-grace). The connection limits are the app's config's.
    """
    config: ServeConfig = app.state.config
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    uv_config = uvicorn_config(app, config, log_level="warning")
    uv_config.timeout_graceful_shutdown = 5
    server = SpecpackServer(uv_config, app.state.decoder, config.shutdown_grace_s)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="specpack-serve")
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            sock.close()
            raise SpecpackError("the server did not start", expected="uvicorn started within 60 s",
                                found="a thread that died" if not thread.is_alive() else "still starting")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
