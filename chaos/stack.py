"""The system under test: PostgreSQL (a primary and its streaming standby), kube-apiserver + etcd,
the operator, two apps, ten sidecars.

Everything runs as a real process started from the main thread with ``die_with_parent`` (a
harness killed with SIGKILL takes its children with it).  Two servers take turns as primary:
the other one is a hot standby streaming from it through a :class:`~chaos.proxy.BlackholeProxy`
(so a fail-over fault can cut replication).  Sidecars and the operator connect with a
multi-host URL (``host1:port1,host2:port2`` with ``target_session_attrs=read-write``, libpq's
own way to find the primary); each sidecar reaches each server through its own proxy.  The
harness and the row writers connect to the current primary directly.  Sidecars run as the
least-privilege role ``schedlock_sidecar`` and the operator as ``schedlock_operator``, the way
a production install runs them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import yaml
from psycopg.rows import TupleRow

from chaos.config import ChaosConfig
from chaos.proxy import BlackholeProxy, ProxyGroup
from schedlock.store import GrantRequest, LockKey, StoreError, open_store
from testbed.kube import KubeAPIServer
from testbed.leaders import leaders_at
from testbed.operators import OperatorProcess, install_crd, operator_kubeconfig
from testbed.pg import PostgresServer, replicate_from, server_dir, wait_streaming
from testbed.procs import die_with_parent
from testbed.sidecars import ReceiverProcess, SidecarProcess

DATABASE = "chaos"
SIDECAR_ROLE = "schedlock_sidecar"
OPERATOR_ROLE = "schedlock_operator"
SCHEDULERS = ("publish", "recurring")
STANDBY_NAME = "standby"  # the standby's application_name, what synchronous_standby_names lists

AConn = psycopg.AsyncConnection[TupleRow]


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


# ------------------------------------------------------------------------------- PostgreSQL


@dataclass
class ChaosPostgres(PostgresServer):
    """PostgresServer whose postmaster dies with the harness, with an async restart."""

    def _preexec(self) -> Callable[[], None] | None:
        return die_with_parent()

    async def astop(self, mode: str) -> None:
        process = self.process
        if process is None:
            return
        sig = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}[mode]
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
        deadline = time.monotonic() + 30
        while process.poll() is None:
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            await asyncio.sleep(0.02)
        self.process = None

    async def astart(self, timeout: float = 30) -> None:
        self._spawn()
        deadline = time.monotonic() + timeout
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.url(), connect_timeout=2)
                await conn.close()
                return
            except psycopg.Error:
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(f"postgres exited at start:\n{self.log_tail()}") from None
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    def cleanup(self) -> None:
        """Stop, and remove the data directory (the log stays in the run directory)."""
        self.stop("immediate")
        shutil.rmtree(server_dir(self.workdir), ignore_errors=True)


def multi_host_url(user: str, dbname: str, ports: list[int]) -> str:
    """libpq's multi-host URL: the first of ``ports`` that is a writable primary."""
    hosts = ",".join(f"127.0.0.1:{port}" for port in ports)
    return f"postgresql://{user}@{hosts}/{dbname}?target_session_attrs=read-write&connect_timeout=2"


# ------------------------------------------------------------------------------- the operator


@dataclass
class ChaosOperator(OperatorProcess):
    """OperatorProcess that starts without blocking the event loop (restarts mid-run:
    ``spawn`` then ``await wait_healthy``)."""

    holder: str = "chaos-operator"

    async def wait_healthy(self, session: aiohttp.ClientSession, timeout: float = 90) -> bool:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.health_port}/healthz"
        while time.monotonic() < deadline and self.alive():
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as response:
                    if response.status == 200:
                        return True
            await asyncio.sleep(0.2)
        return False


# ------------------------------------------------------------------------------- the stack


@dataclass
class Replica:
    name: str
    target: str
    process: SidecarProcess
    proxy: ProxyGroup  # one proxy per server
    down: bool = False  # stopped on purpose by a fault (killed/terminated, not yet restarted)
    frozen: bool = False


class Stack:
    def __init__(self, config: ChaosConfig, rundir: Path) -> None:
        self.config = config
        self.rundir = rundir
        # synchronous_commit stays ON: the test server's default (off) acknowledges commits
        # that an immediate shutdown then loses, which would read as lost rows.  fsync may stay
        # off: only the server process dies here, never the machine.
        self.base_settings = {"synchronous_commit": "on"}
        self.servers = [
            ChaosPostgres(rundir / f"postgres-{n}", settings=dict(self.base_settings))
            for n in ("a", "b")
        ]
        self.primary_index = 0
        self.replication: BlackholeProxy | None = None  # standby -> primary
        self.kube: KubeAPIServer | None = None
        self.operator: ChaosOperator | None = None
        self.receivers: dict[str, ReceiverProcess] = {}
        self.replicas: dict[str, Replica] = {}
        self.http: aiohttp.ClientSession | None = None
        self._admin: AConn | None = None
        self._kube_ssl: ssl.SSLContext | None = None
        self.keys = {
            LockKey(s, config.namespace, t): (t, s) for t in config.targets for s in SCHEDULERS
        }

    # -- the two servers ------------------------------------------------------------------------

    @property
    def pg(self) -> ChaosPostgres:
        """The current primary."""
        return self.servers[self.primary_index]

    @property
    def standby(self) -> ChaosPostgres:
        return self.servers[1 - self.primary_index]

    async def start_standby(self) -> None:
        """(Re)build the non-primary server as a hot standby of the primary (pg_basebackup),
        streaming through a fresh replication proxy, and wait until it has caught up."""
        standby, primary = self.standby, self.pg
        await standby.astop("fast")
        if self.replication is not None:
            await self.replication.close()
        self.replication = BlackholeProxy("replication", "127.0.0.1", primary.port)
        via = await self.replication.start()
        standby.settings = dict(self.base_settings)
        await asyncio.to_thread(
            replicate_from, primary, standby, application_name=STANDBY_NAME, via_port=via
        )
        await standby.astart()
        await asyncio.to_thread(wait_streaming, primary, STANDBY_NAME, 30)

    def promote_standby(self) -> None:
        """The standby becomes the primary (the caller promotes it)."""
        self.primary_index = 1 - self.primary_index

    # -- URLs ---------------------------------------------------------------------------------

    @property
    def admin_url(self) -> str:
        return self.pg.url(DATABASE)

    def sidecar_url(self, proxy_ports: list[int]) -> str:
        return multi_host_url(SIDECAR_ROLE, DATABASE, proxy_ports)

    @property
    def operator_url(self) -> str:
        return multi_host_url(OPERATOR_ROLE, DATABASE, [server.port for server in self.servers])

    # -- synchronous set-up (main thread, before the event loop) ------------------------------

    def start_database(self) -> None:
        self.pg.start()
        self.pg.psql(f'CREATE DATABASE "{DATABASE}"')
        for role in (SIDECAR_ROLE, OPERATOR_ROLE):
            self.pg.psql(f'CREATE ROLE "{role}" LOGIN')

        async def migrate() -> None:
            store = open_store(self.admin_url, application_name="chaos-migrate")
            await store.migrate()
            await store.grant(GrantRequest(sidecar_role=SIDECAR_ROLE, operator_role=OPERATOR_ROLE))
            await store.close()

        asyncio.run(migrate())

    def start_kube(self) -> Path:
        self.kube = KubeAPIServer(self.rundir / "kube")
        self.kube.start(timeout=120)
        install_crd(self.kube)
        self.kube.kubectl("create", "namespace", self.config.namespace)
        return operator_kubeconfig(self.kube)

    def start_receivers(self) -> None:
        for target in self.config.targets:
            self.receivers[target] = ReceiverProcess(self.rundir / f"receiver-{target}").start()

    # -- asynchronous parts --------------------------------------------------------------------

    async def start_sidecars(self) -> None:
        for target in self.config.targets:
            receiver = self.receivers[target]
            for i in range(self.config.replicas):
                name = f"{target}-{i}"
                proxy = ProxyGroup(
                    [BlackholeProxy(name, "127.0.0.1", server.port) for server in self.servers]
                )
                ports = await proxy.start()
                env = {
                    **self.config.sidecar_env(),
                    "SCHEDLOCK_DATABASE_URL": self.sidecar_url(ports),
                    "SCHEDLOCK_TARGET": target,
                    "SCHEDLOCK_TARGET_URL": receiver.url,
                }
                process = SidecarProcess(name, self.rundir / "sidecars", env)
                self.replicas[name] = Replica(name, target, process, proxy)
                process.start()

    def start_operator(self, kubeconfig: Path) -> None:
        self.operator = ChaosOperator(
            self.rundir / "operator",
            self.operator_url,
            kubeconfig,
            extra_env={"SCHEDLOCK_REASSERT_SECONDS": "5", "SCHEDLOCK_MIGRATE": "off"},
        )
        self.operator.spawn()

    async def open_http(self) -> aiohttp.ClientSession:
        if self.http is None:
            self.http = aiohttp.ClientSession()
        return self.http

    async def sidecar_ready(self, replica: Replica) -> bool:
        http = await self.open_http()
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with http.get(
                replica.process.url("/readyz"), timeout=aiohttp.ClientTimeout(total=2)
            ) as response:
                return response.status == 200
        return False

    async def control_app(self, target: str, **settings: Any) -> None:
        http = await self.open_http()
        url = f"http://127.0.0.1:{self.receivers[target].port}/control"
        async with http.post(url, json=settings, timeout=aiohttp.ClientTimeout(total=5)) as r:
            r.raise_for_status()

    # -- the database, seen directly by the harness --------------------------------------------

    async def admin(self) -> AConn:
        if self._admin is None or self._admin.closed or self._admin.broken:
            self._admin = await psycopg.AsyncConnection.connect(
                self.admin_url, autocommit=True, connect_timeout=3, application_name="chaos"
            )
        return self._admin

    async def query(self, sql: str, params: Any = None) -> list[TupleRow]:
        """Run one statement on the harness's own connection; reconnect once if it broke."""
        for attempt in (1, 2):
            try:
                conn = await self.admin()
                cur = await conn.execute(sql, params)
                return await cur.fetchall() if cur.description else []
            except psycopg.OperationalError:
                if self._admin is not None:
                    with contextlib.suppress(Exception):
                        await self._admin.close()
                self._admin = None
                if attempt == 2:
                    raise
        return []

    async def leaders(self) -> dict[LockKey, str]:
        """This run's led keys -> the holder name leading each (``testbed.leaders``, read on
        the current primary)."""
        led = await leaders_at(self.admin_url)
        return {key: name for key, name in led.items() if key in self.keys}

    async def leader_of(self, target: str, scheduler: str, timeout: float = 8.0) -> str | None:
        """The live replica leading the key (not down or frozen), waiting up to ``timeout``."""
        key = LockKey(scheduler, self.config.namespace, target)
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(StoreError):
                name = (await self.leaders()).get(key)
                replica = self.replicas.get(name or "")
                if replica and not (replica.down or replica.frozen) and replica.process.alive():
                    return replica.name
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.1)

    async def keys_led_by(self, holder: str) -> list[str]:
        return sorted(str(key) for key, name in (await self.leaders()).items() if name == holder)

    # -- Kubernetes, as the admin (the harness plays the user creating objects) -----------------

    def kube_ssl(self) -> ssl.SSLContext:
        if self._kube_ssl is None:
            assert self.kube is not None
            config = yaml.safe_load(self.kube.admin_kubeconfig.read_text())
            user = config["users"][0]["user"]
            certdir = self.rundir / "kube" / "harness"
            certdir.mkdir(parents=True, exist_ok=True)
            cert, key = certdir / "admin.crt", certdir / "admin.key"
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            key.chmod(0o600)
            context = ssl.create_default_context(cafile=str(self.kube.ca_path))
            context.load_cert_chain(str(cert), str(key))
            self._kube_ssl = context
        return self._kube_ssl

    async def kube_request(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        assert self.kube is not None
        http = await self.open_http()
        async with http.request(
            method,
            f"{self.kube.url}{path}",
            json=body,
            ssl=self.kube_ssl(),
            timeout=aiohttp.ClientTimeout(total=10),
        ) as response:
            data = await response.json(content_type=None)
            return response.status, data if isinstance(data, dict) else {}

    # -- teardown ------------------------------------------------------------------------------

    def all_processes(self) -> Iterator[subprocess.Popen[bytes]]:
        for replica in self.replicas.values():
            if replica.process.process is not None:
                yield replica.process.process
        if self.operator is not None and self.operator.process is not None:
            yield self.operator.process

    async def stop_async(self) -> dict[str, int | None]:
        """SIGTERM every sidecar (after SIGCONT) and the operator; return exit codes."""
        for proc in self.all_processes():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.terminate()
        deadline = time.monotonic() + 15
        while any(p.poll() is None for p in self.all_processes()):
            if time.monotonic() > deadline:
                for p in self.all_processes():
                    if p.poll() is None:
                        p.kill()
                break
            await asyncio.sleep(0.05)
        codes: dict[str, int | None] = {
            name: r.process.process.wait() if r.process.process else None
            for name, r in self.replicas.items()
        }
        for replica in self.replicas.values():
            await replica.proxy.close()
        if self.replication is not None:
            await self.replication.close()
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await self._admin.close()
        if self.http is not None:
            await self.http.close()
            self.http = None
        return codes

    def stop_sync(self) -> None:
        for proc in self.all_processes():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
                proc.wait()
        # The apps: SIGTERM all at once (aiohttp would wait for hung requests), then SIGKILL.
        receivers = [r.process for r in self.receivers.values() if r.process is not None]
        for proc in receivers:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 2
        for proc in receivers:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.kube is not None:
            self.kube.stop()
        for server in self.servers:
            server.cleanup()
