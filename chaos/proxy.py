"""A TCP proxy per sidecar between it and PostgreSQL that can blackhole its traffic.

Every sidecar connects to PostgreSQL through its own :class:`BlackholeProxy` port.  In the
``blackhole`` state the proxy stops moving bytes in both directions but keeps every socket
open, and new connections are accepted but never reach the server: to both ends it looks like
a network partition that drops packets without a FIN or RST.  Nothing times out at the TCP
level (the proxy's own kernel acknowledges everything, so neither side's keepalives fire); the
only ways out are the sidecar's heartbeat deadline and the server's ``idle_session_timeout``
(the lease).  ``heal`` resumes forwarding: bytes held during the partition are delivered then,
as TCP retransmission would, and whatever the server said meanwhile (e.g. "terminating
connection due to idle-session timeout") reaches the client.

A partition can also be one-way: ``to_server`` holds only what the client sends (the server
sees an idle session), ``to_client`` only what the server sends (the server goes on executing
the client's statements while the client hears nothing back).
"""

from __future__ import annotations

import asyncio
import contextlib

CHUNK = 65536


class BlackholeProxy:
    def __init__(self, name: str, upstream_host: str, upstream_port: int) -> None:
        self.name = name
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.port = 0
        self._to_server = asyncio.Event()
        self._to_server.set()
        self._to_client = asyncio.Event()
        self._to_client.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections = 0  # accepted since start, for the report

    @property
    def blackholed(self) -> bool:
        return not (self._to_server.is_set() and self._to_client.is_set())

    async def start(self, port: int = 0) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def blackhole(self, direction: str = "both") -> None:
        if direction not in ("both", "to_server", "to_client"):
            raise ValueError(direction)
        if direction != "to_client":
            self._to_server.clear()
        if direction != "to_server":
            self._to_client.clear()

    def heal(self) -> None:
        self._to_server.set()
        self._to_client.set()

    async def _both_open(self) -> None:
        await self._to_server.wait()
        await self._to_client.wait()

    async def close(self) -> None:
        self.heal()
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(client_w)
        upstream_w: asyncio.StreamWriter | None = None
        try:
            # A partitioned client's connection attempt goes nowhere (like SYNs into the void):
            # it is held here until the partition heals or the client gives up.
            await self._both_open()
            try:
                upstream_r, upstream_w = await asyncio.open_connection(
                    self.upstream_host, self.upstream_port
                )
            except OSError:
                return  # server down: the client sees its connection closed
            self._writers.add(upstream_w)
            await asyncio.gather(
                self._pump(client_r, upstream_w, self._to_server),
                self._pump(upstream_r, client_w, self._to_client),
            )
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in (client_w, upstream_w):
                if w is not None:
                    self._writers.discard(w)
                    w.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gate: asyncio.Event
    ) -> None:
        try:
            while True:
                await gate.wait()
                data = await reader.read(CHUNK)
                if not data:
                    break
                # Bytes read just as the partition began are held, not dropped.
                await gate.wait()
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            # One side is gone: close the other so the peer sees the end (after a heal).
            await gate.wait()
            writer.close()


class ProxyGroup:
    """One client's proxies, one per server (a multi-host URL): partitioned and healed together."""

    def __init__(self, proxies: list[BlackholeProxy]) -> None:
        self.proxies = proxies

    @property
    def blackholed(self) -> bool:
        return any(p.blackholed for p in self.proxies)

    @property
    def connections(self) -> int:
        return sum(p.connections for p in self.proxies)

    async def start(self) -> list[int]:
        return [await p.start() for p in self.proxies]

    def blackhole(self, direction: str = "both") -> None:
        for p in self.proxies:
            p.blackhole(direction)

    def heal(self) -> None:
        for p in self.proxies:
            p.heal()

    async def close(self) -> None:
        for p in self.proxies:
            await p.close()
