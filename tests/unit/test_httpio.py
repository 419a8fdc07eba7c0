"""The sidecar's HTTP over h11, against real sockets: what its server answers, and what its
client reuses, reads and calls a failure (schedlock.core.httpio)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from schedlock.core.httpio import (
    BadAnswer,
    CannotConnect,
    CannotSend,
    CannotServe,
    Disconnected,
    HttpClient,
    Reply,
    TlsFailed,
    serve,
    text,
)
from testbed.certs import serving_cert

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_app(handler: Handler) -> AsyncIterator[tuple[int, list[int]]]:
    """An app written byte by byte; yields its port and a list that counts its connections."""
    connections: list[int] = []
    tasks: set[asyncio.Task[None]] = set()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1]), connections
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))
    return head


def answering(*answers: bytes, then_close: bool = False) -> Handler:
    """An app that answers each request on a connection with the next of ``answers``."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in answers:
            await read_request(reader)
            writer.write(answer)
            await writer.drain()
        if not then_close:
            await reader.read()

    return handler


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def recording(heads: list[bytes]) -> Handler:
    """An app that answers one request per connection with OK and keeps its head."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await read_request(reader))
        writer.write(OK)
        await writer.drain()

    return handler


async def post(
    port: int, client: HttpClient | None = None, *, read_limit: int = 0, reuse_limit: int = 0
) -> bytes:
    client = client or HttpClient(f"http://127.0.0.1:{port}/hook", "test")
    answer = await client.request(
        "POST",
        f"http://127.0.0.1:{port}/hook",
        body=b"{}",
        read_limit=read_limit,
        reuse_limit=reuse_limit,
    )
    return f"{answer.status} ".encode() + answer.body


# -- the client -----------------------------------------------------------------------------


async def test_a_connection_is_reused_after_an_answer_read_to_its_end() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
    async with raw_app(answering(OK, chunked, OK)) as (port, connections):
        client = HttpClient(f"http://127.0.0.1:{port}", "test")
        for _ in range(3):
            assert await post(port, client, read_limit=10) == b"200 ok"
        await client.close()
    assert len(connections) == 1


async def test_a_long_answer_is_read_only_as_far_as_asked_and_its_connection_dropped() -> None:
    long = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100_000
    async with raw_app(answering(long, OK)) as (port, connections):
        client = HttpClient(f"http://127.0.0.1:{port}", "test")
        assert await post(port, client, read_limit=5, reuse_limit=1000) == b"200 xxxxx"
        assert await post(port, client) == b"200 "
        await client.close()
    assert len(connections) == 2


async def test_a_long_answer_is_not_waited_for_beyond_what_is_asked() -> None:
    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 503 No\r\nContent-Length: 100000\r\n\r\nbusy, later")
        await writer.drain()
        await reader.read()  # the rest never comes

    async with raw_app(trickle) as (port, _):
        async with asyncio.timeout(5):
            assert await post(port, read_limit=4, reuse_limit=65536) == b"503 busy"


async def test_an_unframed_long_answer_is_bounded_too() -> None:
    chunk = b"1000\r\n" + b"y" * 0x1000 + b"\r\n"
    endless = b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 64
    async with raw_app(answering(endless)) as (port, _):
        async with asyncio.timeout(5):  # the app never ends it
            assert await post(port, read_limit=3, reuse_limit=8000) == b"500 yyy"


async def test_a_connection_the_app_closed_while_idle_is_not_reused() -> None:
    async with raw_app(answering(OK, then_close=True)) as (port, connections):
        client = HttpClient(f"http://127.0.0.1:{port}", "test")
        assert await post(port, client, reuse_limit=100) == b"200 "
        await asyncio.sleep(0.05)  # the app's FIN arrives
        assert await post(port, client, reuse_limit=100) == b"200 "
        await client.close()
    assert len(connections) == 2


@pytest.mark.parametrize(
    "answer", [b"", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"], ids=["none", "half"]
)
async def test_an_answer_cut_short_is_a_disconnection(answer: bytes) -> None:
    async with raw_app(answering(answer, then_close=True)) as (port, _):
        with pytest.raises(Disconnected, match="closed the connection"):
            await post(port, read_limit=100)


async def test_an_answer_that_is_not_http_is_a_bad_answer() -> None:
    async with raw_app(answering(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")) as (port, _):
        with pytest.raises(BadAnswer, match=r"not HTTP/1\.1"):
            await post(port)


async def test_no_listener_is_cannot_connect_in_few_words() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    with pytest.raises(CannotConnect, match=r"^connection refused$") as raised:
        await post(port)
    assert isinstance(raised.value.os_error, ConnectionRefusedError)


async def test_an_untrusted_certificate_is_a_tls_failure(tmp_path: Path) -> None:
    cert = serving_cert(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert.cert_file, cert.key_file)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=context)
    port = int(server.sockets[0].getsockname()[1])
    try:
        client = HttpClient(f"https://127.0.0.1:{port}", "test")
        with pytest.raises(TlsFailed, match="certificate verify failed"):
            await client.request("POST", f"https://127.0.0.1:{port}/hook", body=b"{}")
    finally:
        server.close()


async def test_at_most_limit_requests_at_once() -> None:
    inflight = 0
    most = 0

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal inflight, most
        while True:
            await read_request(reader)
            inflight += 1
            most = max(most, inflight)
            await asyncio.sleep(0.02)
            inflight -= 1
            writer.write(OK)
            await writer.drain()

    async with raw_app(slow) as (port, _):
        client = HttpClient(f"http://127.0.0.1:{port}", "test", limit=2)
        await asyncio.gather(*(post(port, client) for _ in range(6)))
        await client.close()
    assert most == 2


async def test_without_keep_alive_each_request_says_close_and_gets_its_own_connection() -> None:
    heads: list[bytes] = []
    async with raw_app(recording(heads)) as (port, connections):
        client = HttpClient(f"http://127.0.0.1:{port}/ready", "check", keep_alive=False)
        for _ in range(2):
            assert (await client.request("GET", client.base_url)).status == 200
    assert len(connections) == 2
    assert all(b"\r\nConnection: close\r\n" in head for head in heads)
    assert heads[0].startswith(b"GET /ready HTTP/1.1\r\nHost: 127.0.0.1:")


async def test_header_values_go_as_utf8_and_a_line_break_is_refused_before_sending() -> None:
    heads: list[bytes] = []
    async with raw_app(recording(heads)) as (port, connections):
        client = HttpClient(f"http://127.0.0.1:{port}", "test", keep_alive=False)
        key = {"Idempotency-Key": "weird-üüü/2026"}
        assert (await client.request("POST", client.base_url, headers=key)).status == 200
        with pytest.raises(CannotSend, match="cannot be sent"):
            await client.request("POST", client.base_url, headers={"X-Evil": "a\r\nX-Forged: 1"})
    assert "Idempotency-Key: weird-üüü/2026\r\n".encode() in heads[0]
    assert len(connections) == 1  # the refused request never connected


# -- the server -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def served() -> AsyncIterator[int]:
    server = await serve(
        {"/readyz": lambda: text(503, "not yet"), "/metrics": lambda: Reply(200, b"m 1\n", "x/y")},
        "127.0.0.1",
        0,
    )
    try:
        yield server.port
    finally:
        await server.close()


async def exchange(port: int, *requests: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"".join(requests))
        await writer.drain()
        async with asyncio.timeout(5):
            return await reader.read()  # to the server's close
    finally:
        writer.close()


async def test_the_server_answers_its_routes_on_one_kept_connection() -> None:
    async with served() as port:
        got = await exchange(
            port,
            b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n",
            b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
            b"POST /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
            b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
    statuses = re.findall(rb"HTTP/1.1 (\d{3}) ", got)
    assert statuses == [b"503", b"200", b"200", b"405", b"404"]
    assert b"\r\n\r\nnot yet\n" in got
    assert got.count(b"m 1\n") == 1  # HEAD has no body
    assert b"content-type: x/y" in got.lower()


async def test_a_malformed_request_is_answered_400_and_the_connection_closed() -> None:
    async with served() as port:
        got = await exchange(port, b"GARBAGE\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 400 ")


async def test_a_port_in_use_is_one_line() -> None:
    async with served() as port:
        with pytest.raises(
            CannotServe, match=r"^cannot serve HTTP on 127.0.0.1:\d+: address already in use$"
        ):
            await serve({}, "127.0.0.1", port)


async def test_closing_the_server_ends_its_idle_and_half_sent_connections() -> None:
    server = await serve({"/healthz": lambda: text(200, "ok")}, "127.0.0.1", 0)
    idle = await asyncio.open_connection("127.0.0.1", server.port)
    half = await asyncio.open_connection("127.0.0.1", server.port)
    half[1].write(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
    await half[1].drain()
    await asyncio.sleep(0.05)
    async with asyncio.timeout(2):  # not IDLE_SECONDS
        await server.close()
    for reader, writer in (idle, half):
        assert await reader.read() == b""  # closed, nothing answered
        writer.close()
