"""Operator: a burst of ScheduledPublish objects, each due the moment it is created.

The real ``schedlock operator`` (its ServiceAccount bound to exactly the chart's rules, no
webhook) and 2 sidecars run against the test kube-apiserver and PostgreSQL.  Objects are
created by 16 client threads as fast as the API server takes them; for each object:

* ``cr_to_watched_ms``: from its create call returning to the object arriving on a watch (what
  the API server's watch delivery alone takes: the operator's own watch is no faster);
* ``cr_to_row_ms``: from its create call returning to its row's ``created_at``;
* ``cr_to_delivered_ms``: to the app receiving it;
* ``cr_to_published_ms``: to ``status.phase == Published`` arriving on a watch of the objects.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg

from bench import kube_client
from bench.context import Context
from bench.stats import summarize
from bench.systems import cpu_seconds
from schedlock.core.identities import rfc3339
from testbed.kube import KubeAPIServer
from testbed.operators import OperatorProcess, install_crd, operator_kubeconfig
from testbed.rows import fetch
from testbed.sidecars import ReceiverProcess, SidecarGroup, parse_metrics

NAMESPACE = "bench-operator"
GROUP, VERSION, PLURAL = "schedlock.dev", "v1", "scheduledpublishes"
CLIENT_THREADS = 16


def _api(kubeconfig: str) -> Any:
    api = kube_client.api_client(kubeconfig, pool_size=CLIENT_THREADS + 2)
    return kube_client.module("client").CustomObjectsApi(api)


@dataclass(eq=False)
class PublishedWatch:
    """Records when each object's status first shows phase Published, from a watch.

    A stream that breaks is resumed from the last resourceVersion seen (``restarts``)."""

    api: Any
    namespace: str = NAMESPACE
    watch: Any = None
    published: dict[str, float] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)
    phases: dict[str, str] = field(default_factory=dict)
    resource_version: str | None = None
    restarts: int = 0
    stopped: threading.Event = field(default_factory=threading.Event)

    def start(self) -> PublishedWatch:
        threading.Thread(target=self._run, name="published-watch", daemon=True).start()
        return self

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                self._follow()
            except Exception:  # a broken stream (or the API server stopping at the end)
                if self.stopped.is_set():
                    return
                self.restarts += 1
                time.sleep(0.2)

    def _follow(self) -> None:
        self.watch = kube_client.module("watch").Watch()
        kwargs: dict[str, Any] = {"timeout_seconds": 3600, "allow_watch_bookmarks": False}
        if self.resource_version is not None:
            kwargs["resource_version"] = self.resource_version
        for event in self.watch.stream(
            self.api.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, **kwargs
        ):
            obj = event["object"]
            meta = obj["metadata"]
            self.resource_version = meta.get("resourceVersion") or self.resource_version
            self.seen.setdefault(meta["uid"], time.time())
            phase = (obj.get("status") or {}).get("phase") or ""
            self.phases[meta["uid"]] = phase
            if phase == "Published":
                self.published.setdefault(meta["uid"], time.time())
            if self.stopped.is_set():
                return

    def stop(self) -> None:
        self.stopped.set()
        if self.watch is not None:
            self.watch.stop()


def _rows(url: str) -> dict[str, float]:
    rows = fetch(
        url,
        "SELECT uid, extract(epoch FROM created_at)::float8 FROM schedlock_publishes "
        "WHERE namespace = %s",
        NAMESPACE,
    )
    return {str(uid): float(at) for uid, at in rows}


def _wait(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.25)


def run(ctx: Context) -> None:
    p = ctx.profile
    kube = ctx.env.start_kube()
    install_crd(kube)
    kube.kubectl("create", "namespace", NAMESPACE, check=False)
    dbname = ctx.env.new_database("operator")
    url = ctx.env.url(dbname)
    workdir = ctx.env.workdir / dbname
    receiver = ReceiverProcess(workdir / "receiver").start()
    sidecars = SidecarGroup(
        workdir / "sidecars", url, namespace=NAMESPACE, replicas=2, receiver=receiver
    )
    operator = OperatorProcess(
        workdir / "operator",
        url,
        operator_kubeconfig(kube),
        # BENCH_OPERATOR_LOG_LEVEL=debug shows kopf's every step (where the time goes)
        extra_env={"SCHEDLOCK_LOG_LEVEL": os.environ.get("BENCH_OPERATOR_LOG_LEVEL", "info")},
    )
    watch: PublishedWatch | None = None
    try:
        sidecars.start()
        operator.start()
        api = _api(str(kube.admin_kubeconfig))
        watch = PublishedWatch(api).start()
        time.sleep(0.5)  # the watch is established before the first create
        created: dict[str, float] = {}

        def create(number: int) -> None:
            at = rfc3339(datetime.now(UTC), "microseconds")
            body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ScheduledPublish",
                "metadata": {"name": f"burst-{number:05d}", "namespace": NAMESPACE},
                "spec": {"target": "demo", "publishAt": at, "payload": {"n": number}},
            }
            obj = api.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
            created[obj["metadata"]["uid"]] = time.time()

        ctx.say(f"operator: creating {p.operator_objects} ScheduledPublish objects")
        assert operator.process is not None
        processes = {"operator": operator.process.pid, "client": os.getpid(), **kube.pids}
        cpu0 = _cpu(processes)
        requests0 = apiserver_requests(kube)
        t0 = time.time()
        with ThreadPoolExecutor(CLIENT_THREADS) as pool:
            list(pool.map(create, range(p.operator_objects)))
        apply_s = time.time() - t0
        deadline = t0 + p.operator_cap_s
        _wait(lambda: len(_rows(url)) >= len(created), deadline - time.time())
        ingest_cpu = {k: v - cpu0[k] for k, v in _cpu(processes).items()}
        _wait(lambda: len(watch.published) >= len(created), deadline - time.time())
        cutoff = time.time()
        cpu = _cpu(processes)["operator"] - cpu0["operator"]
        requests = apiserver_requests(kube)
        requests.subtract(requests0)
        rows = _rows(url)
        ingest_s = max(rows.values(), default=t0) - t0
        arrivals = {uid: e.arrival for uid, e in _first(receiver).items()}
        result: dict[str, Any] = {}
        for key, seen in (
            ("cr_to_watched_ms", dict(watch.seen)),
            ("cr_to_row_ms", rows),
            ("cr_to_delivered_ms", arrivals),
            ("cr_to_published_ms", dict(watch.published)),
        ):
            values = [(seen[uid] - at) * 1000 for uid, at in created.items() if uid in seen]
            missing = [(cutoff - at) * 1000 for uid, at in created.items() if uid not in seen]
            result[key] = summarize(values + missing, censored=len(missing))
        result.update(
            objects=len(created),
            apply_s=round(apply_s, 2),
            creates_per_s=round(len(created) / apply_s, 1) if apply_s > 0 else None,
            sidecars=2,
            client_threads=CLIENT_THREADS,
            webhook=False,
            # CPU the operator process used from the first create to the last Published, as a
            # share of one core: near 100 % means the (single-threaded) operator is the bottleneck
            operator_cpu_percent=round(cpu / (cutoff - t0) * 100, 1),
            burst_s=round(cutoff - t0, 2),
            # where the time goes until the last row: how fast the operator turned objects
            # into rows, and the CPU (% of one core) each process used meanwhile — the API
            # server, etcd, the creating client and the operator share the machine's cores
            ingest_s=round(ingest_s, 2),
            rows_per_s=round(len(rows) / ingest_s, 1) if ingest_s > 0 else None,
            operator_cpu_ms_per_object=round(cpu / max(1, len(created)) * 1000, 1),
            ingest_cpu_percent={
                name: round(used / ingest_s * 100, 1) if ingest_s > 0 else None
                for name, used in ingest_cpu.items()
            },
            # status.phase of every object at the end, from the watch (all Published when the
            # pipeline kept up); and how often the watch stream had to be resumed
            final_phases=dict(collections.Counter(watch.phases.get(uid, "") for uid in created)),
            watch_restarts=watch.restarts,
            # where the time goes: handler runs kopf retried (e.g. "too many clients" when
            # every upsert opens its own connection), and requests the API server refused with
            # 429 (API Priority and Fairness) during the run
            handler_retries=_handler_retries(operator.log_text()),
            # API requests per object by verb and resource (the creates, the operator's
            # finalizer and status PATCHes, GETs and Events, the watch's own list), which is
            # what the API server spends its CPU on
            apiserver_requests_per_object={
                key: round(count / max(1, len(created)), 2)
                for key, count in sorted(requests.items())
                if count >= len(created) / 20
            },
            apiserver_rejected=_apiserver_rejected(kube),
        )
        items = api.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"]
        result["reassert"] = reassert_cost(url, items)
        ctx.results["operator"] = result
        ctx.say(
            "operator: cr_to_row p99 {} ms, cr_to_published p99 {} ms".format(
                result["cr_to_row_ms"]["p99"], result["cr_to_published_ms"]["p99"]
            )
        )
    finally:
        if watch is not None:
            watch.stop()
        operator.stop()
        sidecars.stop()


def reassert_cost(url: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator's re-assertion pass (its own code, in this process) over real objects
    (``items``, as listed): with every row in place (one comparison query, nothing written),
    then with every row deleted (each object's row written again: a Published one restored in
    its recorded outcome, none fired; a Scheduled one upserted)."""
    from schedlock.operator.reassert import Reasserter, snapshot
    from schedlock.store import open_store

    objects = [snapshot(item) for item in items]

    async def passes() -> dict[str, Any]:
        store = open_store(url, application_name="bench-reassert", pool_size=4)
        reasserter = Reasserter(store, lambda: objects, interval=30, wanted=lambda _uid: True)
        try:
            steady = [await reasserter.once() for _ in range(3)]
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("DELETE FROM schedlock_publishes WHERE scheduler = 'publish'")
            restore = await reasserter.once()
            after = await reasserter.once()
        finally:
            await store.close()
        n = max(1, len(objects))
        best = min(r.seconds for r in steady)
        return {
            "objects": len(objects),
            "compared": steady[0].compared,
            "steady_pass_ms": round(best * 1000, 1),
            "steady_us_per_object": round(best / n * 1e6, 1),
            "steady_writes": steady[-1].upserted + steady[-1].restored,
            "all_rows_lost_pass_ms": round(restore.seconds * 1000, 1),
            "all_rows_lost_us_per_object": round(restore.seconds / n * 1e6, 1),
            "restored_terminal": restore.restored,
            "upserted": restore.upserted,
            "writes_after_restore": after.upserted + after.restored,
        }

    with ThreadPoolExecutor(1) as pool:  # the bench itself may run inside an event loop
        return pool.submit(lambda: asyncio.run(passes())).result()


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) or 0.0 for name, pid in pids.items()}


def _handler_retries(log: str) -> dict[str, int]:
    reasons: collections.Counter[str] = collections.Counter()
    for line in log.splitlines():
        if "failed temporarily" not in line:
            continue
        try:
            message = str(json.loads(line).get("msg", ""))
        except ValueError:
            message = line
        reason = message.split("failed temporarily:", 1)[-1].strip()
        reasons[reason.rsplit(":", 1)[-1].strip()[:80] or reason[:80]] += 1
    return dict(reasons)


def apiserver_requests(kube: KubeAPIServer) -> collections.Counter[str]:
    """apiserver_request_total summed by ``VERB resource[/subresource]``, from /metrics."""
    text = kube.kubectl("get", "--raw", "/metrics", check=False).stdout
    counts: collections.Counter[str] = collections.Counter()
    for name, value in parse_metrics(text).items():
        if not name.startswith("apiserver_request_total{"):
            continue
        labels = dict(
            part.split("=", 1) for part in name[name.index("{") + 1 : -1].split(",") if "=" in part
        )
        label = {k: v.strip('"') for k, v in labels.items()}
        resource = label.get("resource", "")
        if label.get("subresource"):
            resource += "/" + label["subresource"]
        counts[f"{label.get('verb', '?')} {resource}"] += int(value)
    return counts


def _apiserver_rejected(kube: KubeAPIServer) -> dict[str, float]:
    """apiserver_flowcontrol_rejected_requests_total by priority level, from /metrics."""
    text = kube.kubectl("get", "--raw", "/metrics", check=False).stdout
    rejected: collections.Counter[str] = collections.Counter()
    for name, value in parse_metrics(text).items():
        if name.startswith("apiserver_flowcontrol_rejected_requests_total{"):
            level = name.split('priority_level="', 1)[-1].split('"', 1)[0]
            rejected[level] += int(value)
    return dict(rejected)


def _first(receiver: ReceiverProcess) -> dict[str, Any]:
    from testbed.deliveries import DeliveryLog

    return DeliveryLog(receiver.log_path).first_arrivals()
