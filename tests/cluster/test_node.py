"""The test node itself (issue 11): what the cluster tests build on, checked on its own.

A real kubelet runs pods from images built here, native sidecars run, Service names resolve
through CoreDNS, host and pods reach each other, and a start and stop (also one cut short by
a crash) leave the host exactly as it was.

The two host-state tests come first: they need the host without the session cluster, which
is then not started yet (`cluster_free_host` stops and restarts it otherwise).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from testbed.cluster import Cluster
from testbed.node.errors import ClusterBusy
from testbed.node.host import HostState, host_state_differences
from testbed.node.plan import BRIDGE, DNS_SERVICE_IP, HOST_IP

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 120


def _assert_node_changed_the_host(cluster: Cluster) -> None:
    """The comparison after stop() only means something if the node really touched these."""
    during = HostState.capture()
    assert during.links.get(BRIDGE) == "bridge"
    assert "KUBE-SERVICES" in during.iptables["iptables-save"]
    assert any(str(cluster.workdir) in mount for mount in during.mounts)
    assert any("kubepods" in children for children in during.cgroups.values())
    assert during.sysctls["vm.overcommit_memory"] == "1"


def test_start_and_stop_leave_the_host_as_it_was(cluster_free_host: None, tmp_path: Path) -> None:
    before = HostState.capture()
    node = Cluster(tmp_path / "node")
    node.start(timeout=START_TIMEOUT)
    try:
        _assert_node_changed_the_host(node)
    finally:
        node.stop()
    assert host_state_differences(before, HostState.capture()) == []


@pytest.mark.parametrize("cleanup", ["of its workdir", "of the host's registry"])
def test_a_crashed_run_is_cleaned_up(cluster_free_host: None, tmp_path: Path, cleanup: str) -> None:
    """A test process killed with its cluster up leaves pods and shims running; the cleanup
    kills them and restores the host from the state the dead run captured — asked for by
    workdir, or found through the host's registry as the next run (`cluster_free_host`, a
    cluster's start) finds it: CI once shared the machine with a run killed that way."""
    before = HostState.capture()
    workdir = tmp_path / "crashed"
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from testbed.cluster import Cluster\n"
        "Cluster(Path(sys.argv[1])).start()\n"
        "print('ready', flush=True)\n"
        "time.sleep(3600)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(workdir)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        # The child's own start() has a deadline: readline returns "ready" or EOF on failure.
        line = child.stdout.readline()
        assert line.strip() == "ready", child.stderr.read() if child.stderr else ""
        assert (workdir / "host-state.json").exists()
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    if cleanup == "of its workdir":
        assert Cluster.cleanup_stale(workdir)
    else:
        assert Cluster.reclaim_host()
        assert not Cluster.reclaim_host()  # nothing left to undo
    assert not (workdir / "host-state.json").exists()
    assert host_state_differences(before, HostState.capture()) == []


# --------------------------------------------------------------------------- on the session node


def _pod(name: str, image: str, **spec: Any) -> dict[str, Any]:
    container = {
        "name": "probe",
        "image": image,
        "imagePullPolicy": "Never",
        "args": ["serve", ":8080"],
        "ports": [{"containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 1, **spec},
    }


def _run_pod(cluster: Cluster, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    cluster.apply({**pod, "metadata": {**pod["metadata"], "namespace": namespace}})
    return cluster.wait_pod_ready(namespace, pod["metadata"]["name"])


def _exec(cluster: Cluster, namespace: str, pod: str, *args: str) -> str:
    return cluster.kubectl("exec", "-n", namespace, pod, "-c", "probe", "--", *args).stdout


def _service(name: str, port: int, namespace: str) -> dict[str, Any]:
    """Service NAME:PORT in front of the pod labelled app=web (its probe's port 8080)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": port, "targetPort": 8080}]},
    }


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


@pytest.fixture
def host_server() -> Iterator[int]:
    """An HTTP server on the node's host address answering "host"; yields its port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"host\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((HOST_IP, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="host-server", daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_the_node_is_ready(cluster: Cluster) -> None:
    node = json.loads(cluster.kubectl("get", "node", cluster.node_name, "-o", "json").stdout)
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.34.4"
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == cluster.host_ip
    assert cluster.timings.start["first_pod_ready"] > cluster.timings.start["node_ready"]


def test_a_pod_runs_and_becomes_ready(cluster: Cluster, cluster_namespace: str, probe: str) -> None:
    pod = _run_pod(cluster, cluster_namespace, _pod("web", probe))
    assert pod["status"]["phase"] == "Running"
    assert pod["status"]["podIP"].startswith("10.244.0.")
    logs = cluster.kubectl("logs", "-n", cluster_namespace, "web").returncode
    assert logs == 0


def _cluster_ip(cluster: Cluster, namespace: str, service: str) -> str:
    jsonpath = "jsonpath={.spec.clusterIP}"
    return cluster.kubectl("get", "service", service, "-n", namespace, "-o", jsonpath).stdout


def test_service_names_resolve_through_coredns(
    cluster: Cluster, cluster_namespace: str, probe: str
) -> None:
    namespace = cluster_namespace
    _run_pod(cluster, namespace, _pod("web", probe))
    # Not named like the pod: the pod's /etc/hosts maps its own name to its own address.
    cluster.apply(_service("frontend", 80, namespace))
    cluster.wait_service_routable(namespace, "frontend")
    frontend = _cluster_ip(cluster, namespace, "frontend")

    def resolve(name: str) -> list[str]:
        return _exec(cluster, namespace, "web", "/probe", "resolve", name).split()

    assert resolve(f"frontend.{namespace}.svc.cluster.local") == [frontend]
    # The search path of the pod's resolv.conf makes the short names work too.
    assert resolve("frontend") == [frontend]
    assert resolve("kubernetes.default") == ["10.96.0.1"]
    assert _cluster_ip(cluster, "kube-system", "kube-dns") == DNS_SERVICE_IP
    # And the Service answers through kube-proxy, by name, from its own pod (hairpin).
    answer = _exec(cluster, namespace, "web", "/probe", "get", "http://frontend/")
    assert answer == "probe web\n"


def test_host_and_pods_reach_each_other(
    cluster: Cluster, cluster_namespace: str, probe: str, host_server: int
) -> None:
    namespace = cluster_namespace
    pod = _run_pod(cluster, namespace, _pod("web", probe))
    cluster.apply(_service("frontend", 80, namespace))
    cluster.wait_service_routable(namespace, "frontend")

    # host -> pod, directly and through the ClusterIP (kube-proxy's OUTPUT rules)
    assert _get(f"http://{pod['status']['podIP']}:8080/") == "probe web\n"
    assert _get(f"http://{_cluster_ip(cluster, namespace, 'frontend')}/") == "probe web\n"

    # pod -> host, by address and by the name of a Service that points at the host
    name = cluster.expose_host_service(namespace, "recorder", 80, host_server)
    assert name == f"recorder.{namespace}.svc.cluster.local"
    direct = f"http://{cluster.host_ip}:{host_server}/"
    assert _exec(cluster, namespace, "web", "/probe", "get", direct) == "host\n"
    assert _exec(cluster, namespace, "web", "/probe", "get", f"http://{name}/") == "host\n"


def test_a_native_sidecar_runs_next_to_the_app(
    cluster: Cluster, cluster_namespace: str, probe: str
) -> None:
    sidecar = {
        "name": "sidecar",
        "image": probe,
        "imagePullPolicy": "Never",
        "args": ["serve", ":9090"],
        "restartPolicy": "Always",
        "readinessProbe": {"httpGet": {"path": "/", "port": 9090}, "periodSeconds": 1},
    }
    pod = _run_pod(cluster, cluster_namespace, _pod("app", probe, initContainers=[sidecar]))
    statuses = pod["status"]["initContainerStatuses"] + pod["status"]["containerStatuses"]
    assert {s["name"]: (s["ready"], "running" in s["state"]) for s in statuses} == {
        "sidecar": (True, True),
        "probe": (True, True),
    }
    row = cluster.kubectl("get", "pod", "app", "-n", cluster_namespace, "--no-headers").stdout
    assert row.split()[1] == "2/2"
    # The app reaches its sidecar on localhost: one network namespace, as for schedlock.
    assert _exec(
        cluster, cluster_namespace, "app", "/probe", "get", "http://127.0.0.1:9090/"
    ).startswith("probe app")


def test_a_second_cluster_is_refused_while_one_runs(cluster: Cluster, tmp_path: Path) -> None:
    second = Cluster(tmp_path / "second")
    with pytest.raises(ClusterBusy, match=str(cluster.workdir)):
        second.start()
    assert cluster.running
    assert not (tmp_path / "second" / "host-state.json").exists()
