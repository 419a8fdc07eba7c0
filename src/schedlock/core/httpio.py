"""HTTP/1.1 for the sidecar's few exchanges: its endpoints, its deliveries, its app check.

The sidecar serves three GET endpoints and sends one kind of request to one app, so it speaks
HTTP through h11 (the protocol state machine, no I/O) over asyncio streams instead of a web
framework: a framework's import was a quarter of a sidecar's memory and of its start time
(docs/performance.md, ``footprint``).  h11 parses and frames both directions (chunked bodies,
keep-alive, malformed input), so nothing here parses HTTP by hand.

Invariants:

* Every exchange is bounded: the server reads a request head of at most ``MAX_HEAD_BYTES``
  within ``IDLE_SECONDS`` and ignores request bodies beyond that; the client's caller bounds a
  request in time, and the client reads at most ``read_limit`` bytes of an answer.
* A client connection is reused only after an answer read to its end (at most
  ``reuse_limit`` bytes) on a connection both sides keep alive, and never once the app has
  closed it; anything else closes it.  A request is sent once: never retried here.
* Failures are typed: :class:`CannotConnect` (no connection was made), :class:`Disconnected`
  (the app closed or reset it before the answer ended), :class:`BadAnswer` (not HTTP),
  :class:`TlsFailed` and :class:`CannotSend` (a header that HTTP cannot carry); a timeout is
  the caller's ``TimeoutError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

import h11

MAX_HEAD_BYTES: Final = 16 * 1024
IDLE_SECONDS: Final = 75.0  # a keep-alive connection with no request for this long is closed
CLOSE_SECONDS: Final = 5.0  # how long closing the server waits for its connections to end
READ_CHUNK: Final = 16 * 1024
DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def os_reason(exc: OSError) -> str:
    """An OS error as one short phrase ("connection refused"), not asyncio's long text."""
    if isinstance(exc, socket.gaierror) or not exc.errno:
        return (exc.strerror or str(exc)).lower()
    return os.strerror(exc.errno).lower()


# -- the server -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """What an endpoint answers."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


def text(status: int, line: str) -> Reply:
    return Reply(status, f"{line}\n".encode())


Route = Callable[[], Reply]


class CannotServe(Exception):
    """The HTTP port cannot be bound (in use, not permitted): one line, the process exits 1."""


@dataclass(eq=False)
class Server:
    """A bound listener; :meth:`close` stops it and ends its open connections."""

    listener: asyncio.Server
    port: int
    _connections: dict[asyncio.Task[None], asyncio.StreamWriter]

    async def close(self) -> None:
        self.listener.close()
        for writer in self._connections.values():
            writer.transport.abort()  # its reader ends, and so does the connection's task
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=CLOSE_SECONDS)
        await self.listener.wait_closed()


async def serve(routes: Mapping[str, Route], host: str, port: int) -> Server:
    """Serve GET (and HEAD) on ``routes`` at ``host:port``; port 0 picks one (``Server.port``)."""
    connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connections[task] = writer
        try:
            await _serve_connection(routes, reader, writer)
        finally:
            del connections[task]
            writer.close()

    try:
        listener = await asyncio.start_server(connection, host, port, reuse_address=True)
    except OSError as exc:
        raise CannotServe(f"cannot serve HTTP on {host}:{port}: {os_reason(exc)}") from exc
    bound = int(listener.sockets[0].getsockname()[1]) if listener.sockets else port
    return Server(listener, bound, connections)


async def _serve_connection(
    routes: Mapping[str, Route], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    try:
        while True:
            event = await _next_event(conn, reader, IDLE_SECONDS)
            if not isinstance(event, h11.Request):
                return  # the client closed, or went idle for IDLE_SECONDS
            while not isinstance(
                body := await _next_event(conn, reader, IDLE_SECONDS), h11.EndOfMessage
            ):
                if isinstance(body, h11.ConnectionClosed):
                    return  # a body nobody asked for (h11 frames it, it is dropped), cut short
            reply = _route(routes, event)
            writer.write(_framed(conn, reply, with_body=event.method != b"HEAD"))
            await writer.drain()
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return  # HTTP/1.0 or "Connection: close"
            conn.start_next_cycle()
    except h11.RemoteProtocolError as exc:
        if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            with contextlib.suppress(h11.LocalProtocolError, OSError):
                bad = text(exc.error_status_hint, "bad request")
                writer.write(_framed(conn, bad, with_body=True, close=True))
                await writer.drain()
    except (TimeoutError, OSError):
        pass  # a client that went quiet mid-request or reset: nothing to answer


def _framed(conn: h11.Connection, reply: Reply, *, with_body: bool, close: bool = False) -> bytes:
    """``reply`` as the bytes h11 frames it (no body for a HEAD request)."""
    head = [("Content-Type", reply.content_type), ("Content-Length", str(len(reply.body)))]
    if close:
        head.append(("Connection", "close"))
    data = conn.send(h11.Response(status_code=reply.status, headers=head)) or b""
    if with_body:
        data += conn.send(h11.Data(data=reply.body)) or b""
    return data + (conn.send(h11.EndOfMessage()) or b"")


def _route(routes: Mapping[str, Route], request: h11.Request) -> Reply:
    if request.method not in (b"GET", b"HEAD"):
        return text(405, "method not allowed")
    path = request.target.decode("ascii", "replace").split("?", 1)[0]
    route = routes.get(path)
    return route() if route is not None else text(404, "not found")


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader, seconds: float) -> object:
    """The next h11 event, reading from ``reader`` as needed; ConnectionClosed at the end."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        async with asyncio.timeout(seconds):
            data = await reader.read(READ_CHUNK)
        conn.receive_data(data)  # b"" is the end of the stream


# -- the client -----------------------------------------------------------------------------


class HttpFailure(Exception):
    """A request that got no complete HTTP answer."""


class CannotConnect(HttpFailure):
    """No connection: refused, no route, name unknown.  ``os_error`` says which."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(os_reason(os_error))
        self.os_error = os_error


class Disconnected(HttpFailure):
    """The app closed or reset the connection before its answer ended."""


class BadAnswer(HttpFailure):
    """The app answered something that is not HTTP/1.1."""


class CannotSend(HttpFailure):
    """The request itself is not valid HTTP (a header value with a line break, say)."""


class TlsFailed(HttpFailure):
    """The TLS handshake failed (certificate, protocol): the app is there and answered it."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes  # at most the request's read_limit bytes


@dataclass(eq=False)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    h11: h11.Connection

    def reusable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


@dataclass(eq=False)
class HttpClient:
    """Requests to one origin (``base_url``'s scheme, host and port), at most ``limit`` at once.

    ``keep_alive`` pools up to ``limit`` idle connections; without it every request closes its
    connection (``Connection: close``).
    """

    base_url: str
    user_agent: str
    limit: int = 1
    keep_alive: bool = True
    _idle: deque[_Connection] = field(default_factory=deque, init=False)
    _slots: asyncio.Semaphore = field(init=False)
    _tls: ssl.SSLContext | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        self._scheme = parts.scheme
        self._host = parts.hostname or ""
        self._port = parts.port or DEFAULT_PORTS.get(parts.scheme, 80)
        shown = f"[{self._host}]" if ":" in self._host else self._host
        default = self._port == DEFAULT_PORTS.get(parts.scheme)
        self._authority = shown if default else f"{shown}:{self._port}"
        self._slots = asyncio.Semaphore(self.limit)

    async def close(self) -> None:
        while self._idle:
            self._idle.popleft().close()

    async def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        read_limit: int = 0,
        reuse_limit: int = 0,
    ) -> Answer:
        """Send one request to ``url`` (on this client's origin) and read its answer.

        The answer's body is read up to ``read_limit`` bytes, and to its end when it is at most
        ``reuse_limit`` bytes long, which lets the connection serve the next request.
        """
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = {"Host": self._authority, "User-Agent": self.user_agent, **(headers or {})}
        if method != "GET" or body:
            head["Content-Length"] = str(len(body))
        if not self.keep_alive:
            head["Connection"] = "close"
        try:  # values as UTF-8, as browsers and web frameworks send them
            fields = [(name.encode("ascii"), value.encode()) for name, value in head.items()]
            request = h11.Request(method=method, target=target.encode(), headers=fields)
        except (h11.LocalProtocolError, UnicodeEncodeError) as exc:
            raise CannotSend(f"the request cannot be sent: {exc}") from exc
        async with self._slots:
            connection = await self._connection()
            try:
                answer, reusable = await self._exchange(
                    connection, request, body, read_limit=read_limit, reuse_limit=reuse_limit
                )
            except BaseException:
                connection.close()
                raise
            if reusable and self.keep_alive and connection.reusable():
                connection.h11.start_next_cycle()
                self._idle.append(connection)
            else:
                connection.close()
            return answer

    async def _connection(self) -> _Connection:
        while self._idle:
            idle = self._idle.popleft()
            if idle.reusable():
                return idle
            idle.close()  # the app closed it while it was idle
        tls = self._tls_context() if self._scheme == "https" else None
        try:
            reader, writer = await asyncio.open_connection(
                self._host, self._port, ssl=tls, limit=READ_CHUNK
            )
        except ssl.SSLError as exc:
            raise TlsFailed(f"TLS handshake with {self._authority} failed: {exc}") from exc
        except OSError as exc:
            raise CannotConnect(exc) from exc
        return _Connection(reader, writer, h11.Connection(h11.CLIENT))

    def _tls_context(self) -> ssl.SSLContext:
        # Built on first use only: loading the CA bundle costs memory an http app never needs.
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    async def _exchange(
        self,
        connection: _Connection,
        request: h11.Request,
        body: bytes,
        *,
        read_limit: int,
        reuse_limit: int,
    ) -> tuple[Answer, bool]:
        conn = connection.h11
        data = (conn.send(request) or b"") + (conn.send(h11.Data(data=body)) if body else b"")
        data += conn.send(h11.EndOfMessage()) or b""
        try:
            connection.writer.write(data)
            await connection.writer.drain()
            response = await self._read(connection)
            while isinstance(response, h11.InformationalResponse):  # 100 Continue and the like
                response = await self._read(connection)
            if not isinstance(response, h11.Response):
                raise Disconnected("the app closed the connection before answering")
            chunks, ended = await self._body(connection, response, read_limit, reuse_limit)
        except h11.RemoteProtocolError as exc:
            raise BadAnswer(f"the app's answer is not HTTP/1.1: {exc}") from exc
        except ssl.SSLError as exc:
            raise TlsFailed(f"TLS with {self._authority} failed: {exc}") from exc
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            raise Disconnected(f"the app reset the connection: {exc}") from exc
        answer = Answer(response.status_code, b"".join(chunks)[:read_limit])
        return answer, ended and conn.our_state is h11.DONE and conn.their_state is h11.DONE

    async def _body(
        self, connection: _Connection, response: h11.Response, read_limit: int, reuse_limit: int
    ) -> tuple[list[bytes], bool]:
        """The answer's body: its first ``read_limit`` bytes, read to its end (True) only when
        it ends within ``max(read_limit, reuse_limit)`` bytes."""
        cap = max(read_limit, reuse_limit)
        length = _content_length(response)
        too_long = length is not None and length > cap  # read what is asked, not to the end
        chunks: list[bytes] = []
        got = 0
        while not (too_long and got >= read_limit):
            event = await self._read(connection)
            if isinstance(event, h11.EndOfMessage):
                return chunks, True
            if not isinstance(event, h11.Data):
                raise BadAnswer(f"unexpected {type(event).__name__} in the app's answer")
            chunks.append(bytes(event.data))
            got += len(event.data)
            if got > cap:
                break
        return chunks, False

    async def _read(self, connection: _Connection) -> object:
        conn = connection.h11
        closed = False
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                if closed:  # h11's word for a stream that ended early
                    message = "the app closed the connection before its answer ended"
                    raise Disconnected(message) from exc
                raise
            if event is not h11.NEED_DATA:
                if isinstance(event, h11.ConnectionClosed):
                    raise Disconnected("the app closed the connection before its answer ended")
                return event
            data = await connection.reader.read(READ_CHUNK)
            closed = not data
            conn.receive_data(data)


def _content_length(response: h11.Response) -> int | None:
    for name, value in response.headers:
        if name == b"content-length":
            return int(value)  # h11 checked it is a number
    return None
