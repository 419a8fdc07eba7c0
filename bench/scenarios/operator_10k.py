"""The operator at 10,000 objects: a restart, one re-assertion pass, a burst on top.

The real ``schedlock operator`` (under the chart's least-privilege ServiceAccount, no webhook,
no sidecars: every object is due a day later, so nothing fires and the rows and statuses the
operator wrote stay what they are) against the test kube-apiserver and PostgreSQL:

1. ``objects`` ScheduledPublish objects across ``namespaces`` namespaces, created by 16 client
   threads; the run waits until every one has its row and a status for its generation
   (``ingest``: how long that took, the operator's CPU per object);
2. the operator is stopped (SIGTERM) and started again (a new process): ``resume`` is from the
   spawn to steady state — ``/readyz`` answers 200 and the process has then been idle (under
   ``IDLE_PERCENT`` of a core) for ``IDLE_WINDOW_S``, that window excluded — with the API
   writes the restart cost (``apiserver_request_total``: POST/PUT/PATCH/DELETE of
   ScheduledPublish objects, their status and Events, until ``WRITE_SETTLE_S`` after steady
   state; target 0, every row and status already agree), the rows it wrote
   (``pg_stat_user_tables``), its CPU and its RSS (peak ``VmHWM``, and ``VmRSS`` once steady);
3. ``burst`` new objects across the namespaces with the others present: ``cr_to_row_ms`` from
   each create call returning to its row's ``created_at``;
4. the re-assertion (``schedlock.operator.reassert.Reasserter.once``, the operator's own code,
   in this process) over every object as listed from the API: ``steady_pass_ms``, one
   comparison with nothing to write (best of 3), then a pass with every row lost.

The objects are left in the API server (they hold the operator's finalizer and no operator
runs any more: deleting them would wait for ever); no later scenario watches them.  Objects an
earlier scenario of the same run left there (``operator``'s burst, with its own operator's
finalizer) are removed before the first operator starts (``cleared``): the operators here watch
the whole cluster, and would otherwise take them over — write their rows into this database,
patch their statuses, and count as restart writes and present objects.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from bench import kube_client
from bench.context import Context
from bench.scenarios.operator import apiserver_requests, reassert_cost
from bench.stats import summarize
from bench.systems import cpu_seconds, rss_mb
from schedlock.core.identities import rfc3339
from schedlock.operator.handlers import ANNOTATIONS_PREFIX, FINALIZER
from testbed.operators import OperatorProcess, install_crd, operator_kubeconfig
from testbed.rows import fetch
from testbed.sidecars import http_get

GROUP, VERSION, PLURAL = "schedlock.dev", "v1", "scheduledpublishes"
NAMESPACE_PREFIX = "bench-op10k-"
CLIENT_THREADS = 16
LAST_HANDLED = f"{ANNOTATIONS_PREFIX}/last-handled-configuration"
IDLE_PERCENT = 5.0  # % of one core: the operator counts as idle below it
IDLE_WINDOW_S = 3.0  # … for this long (a re-assertion pass or a sweep is milliseconds)
WRITE_SETTLE_S = 5.0  # API writes are counted until this long after steady state
SAMPLE_S = 0.25
# what a restart may write, by `verb resource` of apiserver_request_total
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")
WRITE_RESOURCES = ("scheduledpublishes", "scheduledpublishes/status", "events")


def _namespaces(count: int) -> list[str]:
    return [f"{NAMESPACE_PREFIX}{i:03d}" for i in range(count)]


def _writes(requests: collections.Counter[str]) -> dict[str, int]:
    """The API writes among ``requests`` that a restart must not make."""
    out: dict[str, int] = {}
    for key, count in requests.items():
        verb, _, resource = key.partition(" ")
        if verb in WRITE_VERBS and resource in WRITE_RESOURCES and count:
            out[key] = count
    return out


def _row_stats(url: str) -> dict[str, int]:
    rows = fetch(
        url,
        "SELECT sum(n_tup_ins), sum(n_tup_upd), sum(n_tup_del) FROM pg_stat_user_tables "
        "WHERE relname IN ('schedlock_publishes', 'schedlock_schedules')",
    )
    inserted, updated, deleted = rows[0]
    return {
        "inserted": int(inserted or 0),
        "updated": int(updated or 0),
        "deleted": int(deleted or 0),
    }


def _row_times(url: str) -> dict[str, float]:
    rows = fetch(
        url,
        "SELECT uid, extract(epoch FROM created_at)::float8 FROM schedlock_publishes "
        "WHERE namespace LIKE %s",
        NAMESPACE_PREFIX + "%",
    )
    return {str(uid): float(at) for uid, at in rows}


def _list_all(api: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"limit": 2000}
        if token:
            kwargs["_continue"] = token
        page = api.list_cluster_custom_object(GROUP, VERSION, PLURAL, **kwargs)
        items += page["items"]
        token = page["metadata"].get("continue")
        if not token:
            return items


def _clear(api: Any) -> int:
    """Remove every ScheduledPublish in the API server, finalizers and all (no operator runs
    yet to honour them): how many there were."""
    items = _list_all(api)

    def remove(o: dict[str, Any]) -> None:
        namespace, name = o["metadata"]["namespace"], o["metadata"]["name"]
        api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        api.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"finalizers": []}}
        )

    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        list(pool.map(remove, items))
    if not _wait(lambda: not _list_all(api), 60):
        raise RuntimeError("operator_10k: objects of an earlier scenario would not go")
    return len(items)


def _handled(items: list[dict[str, Any]]) -> int:
    """Objects the operator is done with: the status observes the generation, and the
    handler's patch of the object (our finalizer, kopf's last-handled annotation) is in too —
    an operator stopped between the two leaves the object to the next one's create handler."""
    return sum(
        1
        for o in items
        if (o.get("status") or {}).get("observedGeneration") == o["metadata"].get("generation")
        and FINALIZER in (o["metadata"].get("finalizers") or [])
        and LAST_HANDLED in (o["metadata"].get("annotations") or {})
    )


def _wait(predicate: Callable[[], bool], timeout: float, interval: float = 1.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


class Creator:
    """Creates objects from ``CLIENT_THREADS`` threads; records when each create returned."""

    def __init__(self, api: Any, namespaces: list[str], due: datetime) -> None:
        self.api = api
        self.namespaces = namespaces
        self.due = rfc3339(due, "seconds")
        self.created: dict[str, float] = {}
        self.lock = threading.Lock()

    def create(self, prefix: str, number: int) -> None:
        namespace = self.namespaces[number % len(self.namespaces)]
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ScheduledPublish",
            "metadata": {"name": f"{prefix}-{number:05d}", "namespace": namespace},
            "spec": {"target": "demo", "publishAt": self.due, "payload": {"n": number}},
        }
        obj = self.api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        with self.lock:
            self.created[obj["metadata"]["uid"]] = time.time()

    def run(self, prefix: str, count: int) -> dict[str, float]:
        before = set(self.created)
        with ThreadPoolExecutor(CLIENT_THREADS) as pool:
            list(pool.map(lambda n: self.create(prefix, n), range(count)))
        return {uid: at for uid, at in self.created.items() if uid not in before}


def _resume(operator: OperatorProcess, cap_s: float) -> dict[str, Any]:
    """Spawn the operator and follow it to steady state (see the module's doc)."""
    t0 = time.monotonic()
    operator.spawn()
    assert operator.process is not None
    pid = operator.process.pid
    ready_at: float | None = None
    samples: list[tuple[float, float]] = []  # (monotonic, cpu seconds)
    peak_rss = 0.0
    steady_at: float | None = None
    while time.monotonic() - t0 < cap_s and operator.alive():
        now, cpu = time.monotonic(), cpu_seconds(pid) or 0.0
        samples.append((now, cpu))
        peak_rss = max(peak_rss, rss_mb(pid) or 0.0)
        if ready_at is None:
            if http_get(f"http://127.0.0.1:{operator.health_port}/readyz", timeout=1)[0] == 200:
                ready_at = now
        else:
            # the window starts at the latest sample at least IDLE_WINDOW_S old, after ready
            older = [s for s in samples if ready_at <= s[0] <= now - IDLE_WINDOW_S]
            if older:
                start = older[-1]
                busy = (cpu - start[1]) / (now - start[0]) * 100
                if busy < IDLE_PERCENT:
                    steady_at = start[0]
                    break
        time.sleep(SAMPLE_S)
    end = steady_at if steady_at is not None else time.monotonic()
    cpu_at_end = next((c for t, c in samples if t >= end), samples[-1][1] if samples else 0.0)
    return {
        "resume_s": round(end - t0, 2),
        "capped": steady_at is None,
        "ready_s": round(ready_at - t0, 2) if ready_at is not None else None,
        "resume_cpu_s": round(cpu_at_end, 2),
        "peak_rss_mb": round(max(peak_rss, rss_mb(pid, "VmHWM") or 0.0), 1),
        "steady_rss_mb": rss_mb(pid),
    }


def run(ctx: Context) -> None:
    p = ctx.profile
    count, burst = p.operator_10k_objects, p.operator_10k_burst
    namespaces = _namespaces(p.operator_10k_namespaces)
    kube = ctx.env.start_kube()
    install_crd(kube)
    for namespace in namespaces:
        kube.kubectl("create", "namespace", namespace, check=False)
    dbname = ctx.env.new_database("operator_10k")
    url = ctx.env.url(dbname)
    workdir = ctx.env.workdir / dbname
    kubeconfig = operator_kubeconfig(kube)
    env = {"SCHEDLOCK_LOG_LEVEL": os.environ.get("BENCH_OPERATOR_LOG_LEVEL", "info")}
    first = OperatorProcess(workdir / "operator", url, kubeconfig, extra_env=env)
    second = OperatorProcess(workdir / "operator-resumed", url, kubeconfig, extra_env=env)
    api = kube_client.module("client").CustomObjectsApi(
        kube_client.api_client(str(kube.admin_kubeconfig), pool_size=CLIENT_THREADS + 2)
    )
    creator = Creator(api, namespaces, datetime.now(UTC) + timedelta(days=1))
    result: dict[str, Any] = {"objects": count, "namespaces": len(namespaces)}
    try:
        result["cleared"] = _clear(api)
        if result["cleared"]:
            ctx.say(f"operator_10k: removed {result['cleared']} objects an earlier scenario left")
        first.start()
        assert first.process is not None
        ctx.say(f"operator_10k: creating {count} objects in {len(namespaces)} namespaces")
        t0 = time.time()
        cpu0 = cpu_seconds(first.process.pid) or 0.0
        created = creator.run("obj", count)
        apply_s = time.time() - t0
        done = _wait(
            lambda: len(_row_times(url)) >= count and _handled(_list_all(api)) >= count,
            p.operator_10k_cap_s,
            interval=2.0,
        )
        result["ingest"] = {
            "apply_s": round(apply_s, 2),
            "creates_per_s": round(len(created) / apply_s, 1) if apply_s > 0 else None,
            "all_handled": done,
            "handled_s": round(time.time() - t0, 1),
            "operator_cpu_ms_per_object": round(
                ((cpu_seconds(first.process.pid) or 0.0) - cpu0) / max(1, count) * 1000, 2
            ),
            "rss_mb": rss_mb(first.process.pid),
        }
        ctx.say(f"operator_10k: ingest {result['ingest']}")
        first.stop()

        requests0, rows0 = apiserver_requests(kube), _row_stats(url)
        resumed = _resume(second, p.operator_10k_cap_s)
        time.sleep(WRITE_SETTLE_S)
        requests = apiserver_requests(kube)
        requests.subtract(requests0)
        rows1 = _row_stats(url)
        writes = _writes(requests)
        result["resume"] = {
            **resumed,
            "api_writes": sum(writes.values()),
            "api_writes_by_kind": writes,
            # every request of the restart (the listing, the watches, the login…)
            "api_requests": {k: v for k, v in sorted(requests.items()) if v > 0},
            "row_writes": {k: rows1[k] - rows0[k] for k in rows0},
        }
        ctx.say(f"operator_10k: resume {result['resume']}")

        items = _list_all(api)
        ctx.say(f"operator_10k: a burst of {burst} objects with {len(items)} present")
        assert second.process is not None
        cpu0 = cpu_seconds(second.process.pid) or 0.0
        t0 = time.time()
        fresh = creator.run("burst", burst)
        burst_apply_s = time.time() - t0
        _wait(
            lambda: len(set(fresh) & set(_row_times(url))) >= len(fresh),
            p.operator_10k_cap_s,
            interval=0.5,
        )
        cutoff = time.time()
        rows = _row_times(url)
        values = [(rows[uid] - at) * 1000 for uid, at in fresh.items() if uid in rows]
        missing = [(cutoff - at) * 1000 for uid, at in fresh.items() if uid not in rows]
        result["burst"] = {
            "objects": len(fresh),
            "present": len(items),
            "apply_s": round(burst_apply_s, 2),
            "cr_to_row_ms": summarize(values + missing, censored=len(missing)),
            "operator_cpu_ms_per_object": round(
                ((cpu_seconds(second.process.pid) or 0.0) - cpu0) / max(1, len(fresh)) * 1000, 2
            ),
            "rss_mb": rss_mb(second.process.pid),
        }
        ctx.say(f"operator_10k: burst {result['burst']}")
        result["reassert"] = reassert_cost(url, _list_all(api))
        ctx.say(f"operator_10k: re-assertion {result['reassert']}")
        result["targets"] = TARGETS
        ctx.results["operator_10k"] = result
    finally:
        first.stop()
        second.stop()


TARGETS = {
    "resume_s": 60,
    "api_writes": 0,
    "rss_mb": 300,
    "steady_pass_ms": 2000,
    "burst_p99_ms": 2000,
}
