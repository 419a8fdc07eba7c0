"""What the soak runs: one PostgreSQL, a recording app, three sidecars of one target and, when
the Kubernetes tools are built, kube-apiserver + etcd and the operator.

Every process is a real one started from the main thread (``die_with_parent``: a soak killed
with SIGKILL takes its children with it) and :meth:`SoakStack.stop` ends all of them, however
the run ended.  Sidecars run as the least-privilege role ``schedlock_sidecar`` and the operator
as ``schedlock_operator``, as a production install runs them; the harness migrates as the owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedlock.core.identities import CLI_UID_PREFIX
from schedlock.operator import crd
from schedlock.store import GrantRequest, ScheduleSpec, open_store
from testbed.kube import KubeAPIServer, KubeToolsMissingError, resolve_tool_dir
from testbed.operators import OperatorProcess, install_crd, operator_kubeconfig
from testbed.pg import PostgresServer, server_dir
from testbed.procs import die_with_parent
from testbed.sidecars import ReceiverProcess, SidecarProcess

DATABASE = "soak"
NAMESPACE = "soak"
TARGET = "demo"
SIDECAR_ROLE = "schedlock_sidecar"
OPERATOR_ROLE = "schedlock_operator"
SP_PATH = f"/apis/{crd.GROUP}/{crd.VERSION}/namespaces/{NAMESPACE}/{crd.PLURAL}"


def kube_tools_built() -> bool:
    try:
        for tool in ("etcd", "kube-apiserver", "kubectl"):
            resolve_tool_dir(tool)
    except KubeToolsMissingError:
        return False
    return True


@dataclass
class SoakPostgres(PostgresServer):
    """A PostgresServer whose postmaster dies with the harness."""

    def _preexec(self) -> Callable[[], None] | None:
        return die_with_parent()


@dataclass
class SoakStack:
    rundir: Path
    replicas: int = 3
    sidecar_env: dict[str, str] = field(default_factory=dict)
    operator_env: dict[str, str] = field(default_factory=dict)
    pg: SoakPostgres = field(init=False)
    receiver: ReceiverProcess = field(init=False)
    sidecars: list[SidecarProcess] = field(default_factory=list)
    kube: KubeAPIServer | None = None
    operator: OperatorProcess | None = None

    def __post_init__(self) -> None:
        # The test server's defaults (fsync and synchronous_commit off) are kept: only
        # processes die here, never the machine, and the soak is about growth, not durability.
        self.pg = SoakPostgres(self.rundir / "postgres")
        self.receiver = ReceiverProcess(self.rundir / "receiver")

    @property
    def admin_url(self) -> str:
        return self.pg.url(DATABASE)

    def start(self, *, with_operator: bool) -> None:
        self.pg.start()
        self.pg.psql(f'CREATE DATABASE "{DATABASE}"')
        for role in (SIDECAR_ROLE, OPERATOR_ROLE):
            self.pg.psql(f'CREATE ROLE "{role}" LOGIN')
        asyncio.run(self._migrate())
        self.receiver.start()
        for i in range(self.replicas):
            env = {
                "SCHEDLOCK_DATABASE_URL": self.pg.url(DATABASE, SIDECAR_ROLE),
                "SCHEDLOCK_NAMESPACE": NAMESPACE,
                "SCHEDLOCK_TARGET": TARGET,
                "SCHEDLOCK_TARGET_URL": self.receiver.url,
                "SCHEDLOCK_MIGRATE": "off",
                "SCHEDLOCK_LOG_FORMAT": "json",
                **self.sidecar_env,
            }
            self.sidecars.append(SidecarProcess(f"sidecar-{i}", self.rundir / "sidecars", env))
        for sidecar in self.sidecars:
            sidecar.start()
        for sidecar in self.sidecars:
            sidecar.wait_ready()
        if with_operator:
            self.kube = KubeAPIServer(self.rundir / "kube")
            self.kube.start(timeout=120)
            install_crd(self.kube)
            self.kube.kubectl("create", "namespace", NAMESPACE)
            self.operator = OperatorProcess(
                self.rundir / "operator",
                self.pg.url(DATABASE, OPERATOR_ROLE),
                operator_kubeconfig(self.kube),
                extra_env={"SCHEDLOCK_MIGRATE": "off", **self.operator_env},
                holder="operator",
            ).start()

    async def _migrate(self) -> None:
        store = open_store(self.admin_url, application_name="soak-migrate")
        try:
            await store.migrate()
            await store.grant(GrantRequest(sidecar_role=SIDECAR_ROLE, operator_role=OPERATOR_ROLE))
        finally:
            await store.close()

    def add_schedules(self, count: int) -> None:
        """``count`` recurring schedules firing every second (``@every 1s``), stored the way
        ``schedlock schedule`` stores them."""

        async def add() -> None:
            store = open_store(self.admin_url, application_name="soak-schedules")
            try:
                for i in range(count):
                    uid = f"{CLI_UID_PREFIX}soak-every-{i}"
                    await store.upsert_schedule(
                        ScheduleSpec(
                            namespace=NAMESPACE,
                            name=f"every-{i}",
                            uid=uid,
                            target=TARGET,
                            expression="@every 1s",
                            payload={"schedule": uid},
                            starting_deadline_seconds=30,
                        )
                    )
            finally:
                await store.close()

        asyncio.run(add())

    # -- ScheduledPublish objects, as a user would create them ----------------------------------

    def apply_object(self, name: str, spec: dict[str, Any]) -> bool:
        assert self.kube is not None
        body = {
            "apiVersion": f"{crd.GROUP}/{crd.VERSION}",
            "kind": crd.KIND,
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"target": TARGET, **spec},
        }
        status, _ = self.kube.request("POST", SP_PATH, body)
        return status == 201

    def delete_object(self, name: str) -> None:
        assert self.kube is not None
        self.kube.request("DELETE", f"{SP_PATH}/{name}")

    def object_phases(self) -> dict[str, str]:
        assert self.kube is not None
        status, raw = self.kube.request("GET", SP_PATH)
        if status != 200:
            return {}
        items = json.loads(raw).get("items", [])
        return {
            str(o["metadata"]["name"]): str((o.get("status") or {}).get("phase") or "")
            for o in items
        }

    # -- processes ------------------------------------------------------------------------------

    def processes(self) -> dict[str, int]:
        """name -> pid of every running process of the product and the harness, but PostgreSQL
        (its backends come and go: the sampler reads them from the postmaster's children)."""
        pids = {s.name: s.pid for s in self.sidecars if s.alive()}
        if self.operator is not None and self.operator.alive() and self.operator.process:
            pids["operator"] = self.operator.process.pid
        if self.receiver.process is not None and self.receiver.process.poll() is None:
            pids["receiver"] = self.receiver.process.pid
        if self.kube is not None:
            pids.update(self.kube.pids)
        return pids

    def stop(self) -> None:
        for sidecar in self.sidecars:
            with contextlib.suppress(Exception):
                sidecar.stop()
        if self.operator is not None:
            with contextlib.suppress(Exception):
                self.operator.stop()
        with contextlib.suppress(Exception):
            self.receiver.stop()
        if self.kube is not None:
            with contextlib.suppress(Exception):
                self.kube.stop()
        self.pg.stop("fast")
        shutil.rmtree(server_dir(self.pg.workdir) / "data", ignore_errors=True)
