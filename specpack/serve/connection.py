"""uvicorn's h11 protocol with the limits a server facing slow or hostile clients needs (docs/serving.md, "Limits").

    connection opened ── more than --max-connections open? ─ yes ─> 503 error object, then closed
        │ no
        ▼
    waiting for a request head ── --read-timeout passes ─> 408 error object (if part of a head came), closed
        │ head complete: the app reads the body (its own --read-timeout, body.py) and answers
        ▼
    answer complete ──> waiting again (uvicorn's keep-alive timeout closes an idle connection sooner)

Also: a protocol error is answered with an error object (uvicorn's is plain text); at shutdown, a partial
request head is answered 503; a client that said `Connection: close` (or spoke HTTP/1.0) and half-closes after its
whole request still gets its answer (any other end of input means the client left: its request is cancelled).
An answer given before the request was read to its end (the protocol's own; the app's 413, 408, 503) is followed
by a lingering close: the sending side is shut, input is discarded, and the socket is closed once the client
closes it or LINGER_S later. Closing with unread input would reset the connection, which can destroy the
answer before the client reads it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from specpack.serve.api_errors import APIError
from specpack.serve.wire import invalid_http, raw_error, request_timeout, shutting_down, too_many_connections

LINGER_S = 2.0  # how long a connection answered by the protocol itself may still send (discarded) input


@dataclass(frozen=True)
class ConnectionLimits:
    read_timeout_s: float   # a request head must arrive within this long of the connection waiting for one
    max_connections: int    # connections served at once; more are answered 503


def guarded_protocol(bound: ConnectionLimits) -> type[GuardedH11Protocol]:
    """The protocol class to hand uvicorn (`uvicorn.Config(http=...)`), bound to these limits."""

    class SpecpackH11Protocol(GuardedH11Protocol):
        limits = bound

    return SpecpackH11Protocol


class RecordingConnection(h11.Connection):
    """h11's connection, keeping the protocol error it raised (uvicorn drops it), so the 400 can say what was wrong."""

    error: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as err:
            self.error = err
            raise


class GuardedH11Protocol(H11Protocol):
    limits: ClassVar[ConnectionLimits]

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.head_limit = config.h11_max_incomplete_event_size or DEFAULT_MAX_INCOMPLETE_EVENT_SIZE  # bytes (16 KiB)
        self.conn = self._h11 = RecordingConnection(h11.SERVER, self.head_limit)
        self.closing = False  # answered by the protocol itself: input is discarded, the connection is not counted
        self._read_timer: asyncio.TimerHandle | None = None

    # --- asyncio's calls -------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn
        super().connection_made(transport)
        served = sum(1 for c in self.connections if not getattr(c, "closing", False))
        if served > self.limits.max_connections:
            self._answer_and_close(too_many_connections(self.limits.max_connections))
        else:
            self._arm()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        super().data_received(data)
        if self._in_request():
            self._disarm()

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio: True keeps the socket open
        """True keeps the connection open to write the answer: only for a whole request whose client said it sends
        nothing more (their_state MUST_CLOSE); otherwise the connection closes and the app sees a disconnect."""
        if not self.closing and self._in_request() and self.conn.their_state is h11.MUST_CLOSE:
            return True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    # --- uvicorn's calls -------------------------------------------------------------------------------------

    def on_response_complete(self) -> None:
        unread = self.conn.their_state is h11.SEND_BODY  # answered before its body was read: 413, 408, 503, 404
        super().on_response_complete()  # may start the next (pipelined) request
        if self.transport.is_closing() or self.closing:
            return
        if unread:  # the client may still be sending a body nobody reads: let it (discarded), then close
            self._linger()
        elif not self._in_request():
            self._arm()

    def send_400_response(self, msg: str) -> None:
        err = self._h11.error
        status = err.error_status_hint if err is not None else 400
        if status == 431:
            reason = f"the request head is larger than {self.head_limit} bytes"
        else:
            reason = str(err)[:200] if err is not None and str(err) else "the request line or headers could not be parsed"
        self._answer_and_close(APIError(status, invalid_http(reason).message, code="invalid_http_request"))

    def shutdown(self) -> None:
        if self.closing:
            self.transport.close()
        elif not self._in_request() and self._partial_head():
            self._answer_and_close(shutting_down())
        else:
            super().shutdown()

    # --- the read timer and the protocol's own answers ---------------------------------------------------------

    def _in_request(self) -> bool:
        """A request head has arrived and its answer is not complete (the app owns the connection)."""
        return self.cycle is not None and not self.cycle.response_complete

    def _partial_head(self) -> bool:
        return self.conn.their_state is h11.IDLE and bool(self.conn.trailing_data[0])

    def _arm(self) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(self.limits.read_timeout_s, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing() or self.closing or self._in_request():
            return
        if self._partial_head():
            self._answer_and_close(request_timeout("head", self.limits.read_timeout_s))
        else:  # idle, or still sending the body of a request already answered: no answer is possible
            self.transport.close()

    def _answer_and_close(self, err: APIError) -> None:
        self.transport.write(raw_error(err))
        self._linger()

    def _linger(self) -> None:
        """Shut our sending side, discard what the client still sends, close when it does or LINGER_S later."""
        self.closing = True
        self._disarm()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)
