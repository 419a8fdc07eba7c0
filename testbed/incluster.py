"""schedlock in a real cluster, installed the way users install it.

Used by the cluster tests (``tests/cluster``), ``make dev-up`` and the bench's ``cluster``
scenario, so all three run exactly the same product:

- **images** — ``hack/images.sh`` builds the project's two images from its own Dockerfile (the
  operator's, the default target, and the sidecar's, target ``schedlock-sidecar``) and the
  demo app's image; all are imported into the node's containerd (never pulled).
- **database** — a PostgreSQL on the host that listens on loopback *and* on the node bridge's
  gateway address.  Pods reach it as any app reaches a managed database: by a Service name
  (a selector-less Service whose endpoint is the host), with a password.
- **chart** — ``helm install schedlock charts/schedlock`` with the local images.
- **apps** — demo app Deployments that opt in to injection.  Every delivery the app receives
  is forwarded to a :class:`Recorder` on the host before the app answers 200, so what reached
  an app survives the deletion of its pod (and with it, its logs).

Delivery records and their verdicts (lost, failed, duplicated, late) are computed here, once,
for the tests and the bench.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import secrets
import shutil
import subprocess
import tarfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg

from schedlock.operator.injection import LABEL_INJECT, LABEL_INJECT_VALUE
from schedlock.store import LockKey
from testbed import pg
from testbed.cluster import Cluster
from testbed.deliveries import Delivery
from testbed.helm import CHART, Helm
from testbed.leaders import leader
from testbed.procs import output
from testbed.sidecars import wait_for

REPO = Path(__file__).resolve().parents[1]
IMAGES_SH = REPO / "hack" / "images.sh"

RELEASE = "schedlock"
RELEASE_NAMESPACE = "schedlock-system"
DATABASE_SECRET = "schedlock-database"
DATABASE_SERVICE = "postgres"
DATABASE_PORT = 5432
DATABASE_NAME = "schedlock"
DATABASE_ROLE = "schedlock"
INJECTED_LABEL = "schedlock.dev/injected"

Manifest = dict[str, Any]


# --------------------------------------------------------------------------- images


@dataclass(frozen=True)
class Image:
    """An image built here: its reference and the OCI archive containerd imports."""

    ref: str
    archive: Path

    def chart_values(self) -> dict[str, str]:
        """The chart's ``image`` values that install this image from the node's store."""
        repository, _, tag = self.ref.rpartition(":")
        return {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"}

    def sizes(self) -> tuple[int, int]:
        """(compressed, unpacked) bytes: what a node pulls (the manifest's config and layers)
        and what the layers hold unpacked (what ``docker images`` shows as the size)."""
        with tarfile.open(self.archive) as tar:
            name_of = {m.name.removeprefix("./"): m for m in tar.getmembers()}

            def blob(digest: str) -> Any:
                member = tar.extractfile(name_of["blobs/" + digest.replace(":", "/")])
                assert member is not None, f"{self.archive} lacks {digest}"
                return member

            member = tar.extractfile(name_of["index.json"])
            assert member is not None, f"{self.archive} has no index.json"
            manifest = json.load(blob(json.load(member)["manifests"][0]["digest"]))
            layers = manifest["layers"]
            compressed = int(manifest["config"]["size"]) + sum(int(x["size"]) for x in layers)
            unpacked = 0
            for layer in layers:
                with gzip.open(blob(layer["digest"])) as stream:
                    while chunk := stream.read(1 << 20):
                        unpacked += len(chunk)
        return compressed, unpacked


def _images_sh(*args: str) -> str:
    return output(
        ["bash", str(IMAGES_SH), *args], f"hack/images.sh {' '.join(args)}", cwd=REPO, timeout=3600
    )


def project_image(name: str) -> Image:
    """Build (or reuse from the cache) image NAME (``schedlock``, ``schedlock-sidecar``,
    ``demo-app``).

    The reference is read from the archive itself: asking ``hack/images.sh ref`` afterwards
    could name a newer tree's image if a file changed in between.
    """
    archive = Path(_images_sh("path", name))
    with tarfile.open(archive) as tar:
        name_of = {m.name.removeprefix("./"): m for m in tar.getmembers()}
        member = tar.extractfile(name_of["index.json"])
        assert member is not None, f"{archive} has no index.json"
        index = json.load(member)
    return Image(str(index["manifests"][0]["annotations"]["io.containerd.image.name"]), archive)


@dataclass(frozen=True)
class ProjectImages:
    schedlock: Image  # the operator's (the Dockerfile's default target)
    sidecar: Image  # the injected sidecars' (target schedlock-sidecar)
    demo_app: Image

    @classmethod
    def build(cls) -> ProjectImages:
        return cls(
            project_image("schedlock"),
            project_image("schedlock-sidecar"),
            project_image("demo-app"),
        )

    def import_into(self, cluster: Cluster) -> None:
        for image in (self.schedlock, self.sidecar, self.demo_app):
            cluster.import_image(image.archive)


# --------------------------------------------------------------------------- database


class HostDatabase:
    """PostgreSQL on the host, reachable from pods through the Service ``postgres``.

    The bridge's gateway address exists only while the cluster runs, so start this after the
    cluster and stop it before.
    """

    def __init__(self, workdir: Path, cluster: Cluster, namespace: str = RELEASE_NAMESPACE):
        self.cluster = cluster
        self.namespace = namespace
        self.password = secrets.token_hex(12)
        self.server = pg.PostgresServer(
            workdir,
            settings={"listen_addresses": f"127.0.0.1,{cluster.host_ip}"},
            hba=[f"host all all {cluster.pod_cidr} scram-sha-256"],
        )
        self.service_host = ""

    def start(self) -> HostDatabase:
        """Start on a fresh data directory (the role and its password are made anew)."""
        shutil.rmtree(pg.server_dir(self.server.workdir), ignore_errors=True)
        self.server.logfile.unlink(missing_ok=True)
        self.server.start()
        try:
            self.server.psql(f"CREATE ROLE {DATABASE_ROLE} LOGIN PASSWORD '{self.password}'")
            # Its own statement: CREATE DATABASE cannot run inside psql -c's one transaction.
            self.server.psql(f"CREATE DATABASE {DATABASE_NAME} OWNER {DATABASE_ROLE}")
            self.cluster.apply(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
            )
            self.service_host = self.cluster.expose_host_service(
                self.namespace, DATABASE_SERVICE, DATABASE_PORT, self.server.port
            )
        except BaseException:
            self.stop()  # the postmaster outlives whoever started it: never leave it behind
            raise
        return self

    def stop(self) -> None:
        self.server.stop("fast")
        shutil.rmtree(pg.server_dir(self.server.workdir), ignore_errors=True)

    @property
    def host_url(self) -> str:
        """As host processes (tests, the CLI) reach it."""
        return self.server.url(DATABASE_NAME, DATABASE_ROLE, self.password)

    @property
    def cluster_url(self) -> str:
        """As pods reach it: through the Service name, resolved by the cluster DNS."""
        auth = f"{DATABASE_ROLE}:{self.password}"
        return f"postgresql://{auth}@{self.service_host}:{DATABASE_PORT}/{DATABASE_NAME}"

    def secret(self, namespace: str) -> Manifest:
        """The ``schedlock-database`` Secret the operator (release namespace) and the injected
        sidecars (each app namespace) read."""
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": DATABASE_SECRET, "namespace": namespace},
            "stringData": {"url": self.cluster_url},
        }


# --------------------------------------------------------------------------- recorder


class Recorder:
    """An HTTP endpoint on the host collecting every delivery the demo apps forward."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Recorder:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    record = json.loads(self.rfile.read(length))
                except ValueError:
                    self.send_response(400)
                    self.end_headers()
                    return
                with recorder._lock:
                    recorder._records.append(record)
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                del format, args  # one line per delivery would drown the test output

        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="recorder", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        assert self._server is not None, "the recorder is not started"
        return f"http://{self.host}:{self._server.server_address[1]}/record"

    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._records)

    def deliveries(self, prefix: str | None = None) -> list[Delivery]:
        found = [Delivery.from_demo_app(r) for r in self.records()]
        return [d for d in found if prefix is None or d.uid.startswith(prefix)]

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- the product


def demo_app(
    name: str,
    namespace: str,
    image: Image,
    *,
    replicas: int,
    record_url: str = "",
    drain_seconds: float = 0,
    target: str | None = None,
    annotations: Mapping[str, str] | None = None,
    grace_seconds: int = 30,
) -> Manifest:
    """A Deployment of the demo app that opts in to the sidecar, as a user's app would.

    The pod passes Pod Security ``restricted`` (non-root, no privilege escalation, no
    capabilities, RuntimeDefault seccomp) so it runs in namespaces that enforce it.
    """
    labels = {"app.kubernetes.io/name": target or name}
    env = [
        {"name": "PORT", "value": "8080"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "DRAIN_SECONDS", "value": f"{drain_seconds:g}"},
    ]
    if record_url:
        env.append({"name": "RECORD_URL", "value": record_url})
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            # One at a time, a new pod Ready before an old one goes: what users run.
            "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {
                    # The opt-in is the label (the webhook's objectSelector); the rest are
                    # annotations.
                    "labels": {**labels, LABEL_INJECT: LABEL_INJECT_VALUE},
                    "annotations": {
                        # The app says when it cannot take work (503 while draining): the
                        # sidecar hands over then, not after its rows' retries.
                        "schedlock.dev/target-ready-url": "http://127.0.0.1:8080/healthz",
                        **(annotations or {}),
                    },
                },
                "spec": {
                    "terminationGracePeriodSeconds": grace_seconds,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "app",
                            "image": image.ref,
                            "imagePullPolicy": "IfNotPresent",
                            "env": env,
                            "ports": [{"name": "http", "containerPort": 8080}],
                            "readinessProbe": {
                                "httpGet": {"path": "/healthz", "port": "http"},
                                "periodSeconds": 1,
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "resources": {
                                "requests": {"cpu": "10m", "memory": "32Mi"},
                                "limits": {"memory": "64Mi"},
                            },
                        }
                    ],
                },
            },
        },
    }


def restricted_namespace(name: str) -> Manifest:
    """A namespace that enforces, audits and warns about Pod Security ``restricted``."""
    levels = {
        f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "audit", "warn")
    }
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": levels}}


def chart_values(
    images: ProjectImages, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The values a user sets to install from a local image, plus OVERRIDES by dotted path
    (``{"networkPolicy.enabled": True}``); everything else keeps the chart's defaults."""
    sidecar = images.sidecar.chart_values()
    values: dict[str, Any] = {
        "image": images.schedlock.chart_values(),
        "injection": {"sidecar": {"image": {k: sidecar[k] for k in ("repository", "tag")}}},
    }
    for dotted, value in (overrides or {}).items():
        node = values
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return values


@dataclass
class Product:
    """The chart installed into a cluster, plus the demo apps and what they received."""

    cluster: Cluster
    images: ProjectImages
    database: HostDatabase
    helm: Helm
    recorder: Recorder | None = None  # the tests' (the dev stack's app only logs deliveries)
    release: str = RELEASE
    namespace: str = RELEASE_NAMESPACE
    app_namespaces: set[str] = field(default_factory=set)

    # ----------------------------------------------------------------- chart

    def values_file(self, overrides: Mapping[str, Any] | None = None) -> Path:
        path = self.helm.home / "values.json"
        path.write_text(json.dumps(chart_values(self.images, overrides)))
        return path

    def install(
        self, overrides: Mapping[str, Any] | None = None, *, timeout: str = "180s"
    ) -> subprocess.CompletedProcess[str]:
        self.cluster.apply(self.database.secret(self.namespace))
        return self.helm(
            "install", self.release, CHART, "--namespace", self.namespace,
            "--values", self.values_file(overrides), "--wait", "--timeout", timeout,
        )  # fmt: skip

    def upgrade(
        self, overrides: Mapping[str, Any] | None = None, *, timeout: str = "180s"
    ) -> subprocess.CompletedProcess[str]:
        return self.helm(
            "upgrade", self.release, CHART, "--namespace", self.namespace,
            "--values", self.values_file(overrides), "--wait", "--timeout", timeout,
        )  # fmt: skip

    def uninstall(self) -> subprocess.CompletedProcess[str]:
        return self.helm(
            "uninstall", self.release, "--namespace", self.namespace, "--wait", "--timeout", "120s"
        )

    def installed(self) -> bool:
        listed = self.helm("list", "--namespace", self.namespace, "-o", "json")
        return any(r.get("name") == self.release for r in json.loads(listed.stdout or "[]"))

    # ----------------------------------------------------------------- apps

    def deploy_app(
        self, name: str, namespace: str = "default", *, replicas: int = 2, **options: Any
    ) -> Manifest:
        """Apply a demo app (and its namespace's database Secret); wait until it is rolled out."""
        if namespace not in self.app_namespaces:
            self.cluster.apply(self.database.secret(namespace))
            self.app_namespaces.add(namespace)
        if self.recorder is not None:
            options.setdefault("record_url", self.recorder.url)
        manifest = demo_app(name, namespace, self.images.demo_app, replicas=replicas, **options)
        self.cluster.apply(manifest)
        self.rollout_status(name, namespace)
        return manifest

    def rollout_status(self, name: str, namespace: str, timeout: str = "180s") -> None:
        self.cluster.kubectl(
            "rollout", "status", f"deployment/{name}", "-n", namespace, f"--timeout={timeout}",
            timeout=600,
        )  # fmt: skip

    def pods(self, namespace: str, selector: str) -> list[Manifest]:
        out = self.cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
        return list(json.loads(out.stdout)["items"])

    def running_pods(self, namespace: str, selector: str) -> list[Manifest]:
        return [
            p
            for p in self.pods(namespace, selector)
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]

    def leaders(self, namespace: str, app: str, scheduler: str = "publish") -> list[str]:
        """Names of the running pods leading SCHEDULER's key of APP (its pods' target), as the
        database says (``testbed.leaders``; a sidecar's holder name is its pod's name)."""
        name = leader(self.database.host_url, LockKey(scheduler, namespace, app))
        running = self.running_pods(namespace, f"app.kubernetes.io/name={app}")
        return [str(p["metadata"]["name"]) for p in running if p["metadata"]["name"] == name]

    def wait_leader(
        self, namespace: str, app: str, scheduler: str = "publish", timeout: float = 60
    ) -> str:
        leaders = wait_for(
            lambda: self.leaders(namespace, app, scheduler) or None,
            timeout,
            0.2,
            f"a {scheduler} leader among the {app} pods",
        )
        assert len(leaders) == 1, f"more than one leader: {leaders}"
        return str(leaders[0])


@contextlib.contextmanager
def installed_product(
    cluster: Cluster,
    workdir: Path,
    images: ProjectImages | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Iterator[Product]:
    """Images imported, database up, chart installed (``--wait``); everything undone after."""
    images = images or ProjectImages.build()
    images.import_into(cluster)
    database = HostDatabase(workdir / "postgres", cluster).start()
    recorder = Recorder(cluster.host_ip).start()
    helm = Helm(cluster.admin_kubeconfig, workdir / "helm")
    product = Product(cluster, images, database, helm, recorder)
    try:
        product.install(overrides)
        yield product
    finally:
        with contextlib.suppress(Exception):
            if product.installed():
                product.uninstall()
        recorder.stop()
        database.stop()


# --------------------------------------------------------------------------- streams and verdicts


def stream_rows(
    url: str, *, count: int, spacing: float, prefix: str, start_in: float = 1.0, **options: Any
) -> list[str]:
    """COUNT one-shot rows for target ``demo`` due every SPACING s from START_IN s on."""
    from testbed.rows import insert_rows

    return insert_rows(url, count, start_in=start_in, spacing=spacing, prefix=prefix, **options)


def row_outcomes(url: str, prefix: str) -> dict[str, str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT uid, state FROM schedlock_publishes WHERE uid LIKE %s", (prefix + "-%",)
        ).fetchall()
    return {str(uid): str(state) for uid, state in rows}


def wait_settled(url: str, prefix: str, count: int, timeout: float) -> dict[str, str]:
    """Wait until all COUNT rows of PREFIX left ``scheduled``/``firing``; their final states."""

    def settled() -> dict[str, str] | None:
        outcomes = row_outcomes(url, prefix)
        done = [s for s in outcomes.values() if s not in ("scheduled", "firing")]
        return outcomes if len(outcomes) == count and len(done) == count else None

    return dict(wait_for(settled, timeout, 0.2, f"{count} rows {prefix}-* to settle"))


@dataclass(frozen=True)
class StreamVerdict:
    """What happened to a stream of rows across a fault."""

    rows: int
    states: dict[str, int]
    lost: list[str]  # never reached an app
    duplicates: dict[str, int]  # uid -> deliveries, for uids delivered more than once
    late_p50_ms: float
    late_p99_ms: float
    late_max_ms: float
    gap_ms: float  # the longest stretch, around the fault, with due rows and no arrival

    def as_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "states": self.states,
            "lost": len(self.lost),
            "duplicates": len(self.duplicates),
            "late_p50_ms": round(self.late_p50_ms, 1),
            "late_p99_ms": round(self.late_p99_ms, 1),
            "late_max_ms": round(self.late_max_ms, 1),
            "gap_ms": round(self.gap_ms, 1),
        }


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def verdict(
    uids: Sequence[str], outcomes: Mapping[str, str], deliveries: Sequence[Delivery]
) -> StreamVerdict:
    """Judge a stream: every row delivered, counted per state, duplicates and lateness.

    Lateness is that of each row's first arrival; the gap is the longest time between two
    consecutive first arrivals (rows are due every few hundred ms, so anything much longer is
    time without a working leader).
    """
    first: dict[str, Delivery] = {}
    counts: dict[str, int] = {}
    for delivery in sorted(deliveries, key=lambda d: d.arrival):
        counts[delivery.uid] = counts.get(delivery.uid, 0) + 1
        first.setdefault(delivery.uid, delivery)
    states: dict[str, int] = {}
    for uid in uids:
        state = outcomes.get(uid, "missing")
        states[state] = states.get(state, 0) + 1
    late = [first[u].late_seconds * 1000 for u in uids if u in first]
    arrivals = sorted(first[u].arrival for u in uids if u in first)
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    return StreamVerdict(
        rows=len(uids),
        states=states,
        lost=[u for u in uids if u not in first],
        duplicates={u: n for u, n in counts.items() if n > 1 and u in set(uids)},
        late_p50_ms=_quantile(late, 0.5),
        late_p99_ms=_quantile(late, 0.99),
        late_max_ms=max(late, default=0.0),
        gap_ms=max(gaps, default=0.0) * 1000,
    )
