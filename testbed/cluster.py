"""A real single-node Kubernetes cluster for tests, from cached binaries and images built here.

``Cluster(workdir).start()`` runs etcd + kube-apiserver, kube-controller-manager,
kube-scheduler, containerd, kubelet and kube-proxy, each in its own session with
PR_SET_PDEATHSIG (nothing outlives the test process) and its log under ``workdir/logs``, plus
CoreDNS as pods; images are imported, never pulled. Addresses: ``testbed.node.plan``.

Invariants: one cluster per host (``/run/schedlock-cluster.json``; a second ``start()`` raises
``ClusterBusy``); ``start()`` captures the host state before changing anything and ``stop()``
(or, after a crash, the next ``start()`` or ``cleanup_stale``) puts it back
(``testbed.node.host``); every wait has a deadline and fails with the logs that explain it.
No pytest dependency, so the dev stack uses it too.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from testbed import procs
from testbed.kube import (
    KubeAPIServer,
    KubeManifest,
    _stop_process,
    _tail,
    spawn_process,
)
from testbed.node import manifests
from testbed.node.commands import COMMAND_TIMEOUT, run, which
from testbed.node.configs import containerd_config, kube_proxy_config, kubelet_config
from testbed.node.errors import ClusterBusy, ClusterError
from testbed.node.host import HostState, links, restore_host, write_sysctl
from testbed.node.plan import (
    BRIDGE,
    CLUSTER_DOMAIN,
    HOST_IP,
    HOST_REGISTRY,
    KUBERNETES_SERVICE_IP,
    NODE_NAME,
    PATH,
    POD_CIDR,
    SERVICE_CIDR,
    SHORT_SOCKET_DIR,
)
from testbed.node.prerequisites import check_prerequisites
from testbed.oci import Image, coredns_image, pause_image
from testbed.procs import Proc, StartStop

__all__ = ["Cluster"]

_SOCKET_PATH_MAX = 98  # containerd refuses more than 104 bytes for "<socket>.ttrpc"
_POLL_SECONDS = 0.2
_LOG_LINES = 30


@dataclass
class _Component:
    name: str
    log: Path
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class _Timings:
    start: dict[str, float] = field(default_factory=dict)
    stop: float | None = None


class Cluster(StartStop):
    """A single-node Kubernetes cluster on this host; see the module docstring.

    Usage::

        with Cluster(tmp_dir, images=[archive]) as cluster:
            cluster.apply(pod_manifest)
            cluster.wait_pod_ready("default", "web")
            name = cluster.expose_host_service("default", "postgres", 5432)
    """

    def __init__(self, workdir: Path, *, images: Sequence[Path] = ()) -> None:
        self.workdir = Path(workdir).resolve()
        self.images = [Path(image) for image in images]
        self.node_name = NODE_NAME
        self.logs_dir = self.workdir / "logs"
        self.state_file = self.workdir / "host-state.json"
        self.containerd_dir = self.workdir / "containerd"
        self.containerd_socket = self.containerd_dir / "containerd.sock"
        if len(str(self.containerd_socket)) > _SOCKET_PATH_MAX:
            self.containerd_socket = SHORT_SOCKET_DIR / "containerd.sock"
        self.kubelet_dir = self.workdir / "kubelet"
        self.timings = _Timings()
        self.pause_image: Image | None = None
        self.coredns_image: Image | None = None
        self._binaries: dict[str, Path] = {}
        self._api: KubeAPIServer | None = None
        self._components = {
            name: _Component(name, self.logs_dir / f"{name}.log")
            for name in (
                "containerd",
                "kube-controller-manager",
                "kube-scheduler",
                "kubelet",
                "kube-proxy",
            )
        }

    # ----------------------------------------------------------------- properties

    host_ip: ClassVar[str] = HOST_IP
    """The address pods reach host processes at (the bridge's gateway, the node's IP)."""
    pod_cidr: ClassVar[str] = POD_CIDR

    @property
    def api(self) -> KubeAPIServer:
        """The control plane's etcd + kube-apiserver (kubectl, apply, kubeconfigs)."""
        if self._api is None:
            raise ClusterError("the cluster is not started")
        return self._api

    @property
    def url(self) -> str:
        return self.api.url

    @property
    def admin_kubeconfig(self) -> Path:
        return self.api.admin_kubeconfig

    @property
    def pids(self) -> dict[str, int]:
        """PIDs of the running processes by name (etcd, kube-apiserver, kubelet…)."""
        pids = dict(self._api.pids) if self._api is not None else {}
        for component in self._components.values():
            if component.proc is not None and component.proc.poll() is None:
                pids[component.name] = component.proc.pid
        return pids

    @property
    def running(self) -> bool:
        return (
            self._api is not None
            and self._api.running
            and all(c.proc is not None and c.proc.poll() is None for c in self._components.values())
        )

    @property
    def kubectl(self) -> Callable[..., subprocess.CompletedProcess[str]]:
        """The pinned kubectl, as admin unless ``kubeconfig=`` is given (``KubeAPIServer.kubectl``)."""
        return self.api.kubectl

    def apply(
        self, manifest: KubeManifest, kubeconfig: Path | None = None, *, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """`kubectl apply -f -` of a YAML string, one object, or a list of objects."""
        return self.api.apply(manifest, kubeconfig, check=check)

    # ----------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 120) -> None:
        """Start every component, import the images, and wait until CoreDNS is Ready.

        ``timings.start`` records seconds since the call per phase (``node_ready``,
        ``first_pod_ready``…). On any failure everything started is stopped and the host is
        restored before the error propagates.
        """
        if self._api is not None:
            raise ClusterError("the cluster is already started")
        began = time.monotonic()
        self._binaries = check_prerequisites()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._claim_host()
        try:
            self._start(began, began + timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 60) -> None:
        """Stop everything, remove the pods, and restore the host as captured at start.

        Safe to call twice, on a half-started cluster, or on one whose processes died.
        """
        began = time.monotonic()
        deadline = began + timeout
        components = self._components
        # kubelet first, so nothing restarts the containers removed next.
        for name in ("kubelet", "kube-scheduler", "kube-controller-manager"):
            self._stop_component(name)
        containerd = components["containerd"].proc
        if containerd is not None and containerd.poll() is None:
            # Removing the sandboxes through the CRI runs the CNI DEL of each pod: veths, IPAM,
            # portmap and masquerade rules go the way they came.
            self._crictl("rmp", "--all", "--force", check=False, timeout=_remaining(deadline))
        self._stop_component("containerd")
        had_proxy = components["kube-proxy"].proc is not None
        self._stop_component("kube-proxy")
        if had_proxy:
            proxy = self._binaries["kube-proxy"]
            run([str(proxy), "--cleanup", "--v=0"], check=False, timeout=_remaining(deadline))
        if self._api is not None:
            self._api.stop()
            self._api = None
        if self.state_file.exists():
            self._release_host(_remaining(deadline))
        if self.timings.start:
            self.timings.stop = time.monotonic() - began

    @classmethod
    def cleanup_stale(cls, workdir: Path) -> bool:
        """Restore the host after a run in WORKDIR that died without stop(); True if it had to.

        Kills what the run left (pods, shims), unmounts, and undoes its host changes from the
        state it captured at start.
        """
        workdir = Path(workdir).resolve()
        state_file = workdir / "host-state.json"
        if not state_file.exists():
            return False
        state = json.loads(state_file.read_text())
        if _owner(state).alive() and state["pid"] != os.getpid():
            raise ClusterBusy(f"the run in {workdir} (pid {state['pid']}) is still alive")
        restore_host(HostState.from_json(state["host"]), workdir)
        state_file.unlink(missing_ok=True)
        _drop_registry(workdir)
        return True

    # ----------------------------------------------------------------- host claim

    @classmethod
    def reclaim_host(cls) -> bool:
        """Refuse while a live cluster holds the host; undo a dead one's changes (a run killed
        with its cluster up: pods, bridge, rules, sysctls). True if there was one to undo."""
        if not HOST_REGISTRY.exists():
            return False
        owner = json.loads(HOST_REGISTRY.read_text())
        if _owner(owner).alive():
            raise ClusterBusy(
                f"a schedlock test cluster already runs on this host (workdir "
                f"{owner['workdir']}, pid {owner['pid']}); stop it first"
            )
        stale = Path(owner["workdir"])
        if not cls.cleanup_stale(stale):
            # Its workdir is gone: the copy of the capture in the registry still restores.
            restore_host(HostState.from_json(owner["host"]), stale)
            HOST_REGISTRY.unlink(missing_ok=True)
        return True

    def _claim_host(self) -> None:
        """Refuse a second live cluster, clean up a dead one, then capture the host state."""
        Cluster.reclaim_host()
        Cluster.cleanup_stale(self.workdir)
        state = {
            "workdir": str(self.workdir),
            "pid": os.getpid(),
            # A string, as every earlier version wrote it: a run of another checkout must
            # still see this one alive (an int never equals its string start time).
            "pid_start": str(procs.start_time(os.getpid())),
            "host": HostState.capture().to_json(),
        }
        text = json.dumps(state, indent=1)
        self.state_file.write_text(text)
        HOST_REGISTRY.write_text(text)

    def _release_host(self, timeout: float) -> None:
        state = json.loads(self.state_file.read_text())
        restore_host(HostState.from_json(state["host"]), self.workdir, timeout=max(timeout, 10))
        self.state_file.unlink(missing_ok=True)
        _drop_registry(self.workdir)

    # ----------------------------------------------------------------- start phases

    def _mark(self, phase: str, began: float) -> None:
        self.timings.start[phase] = round(time.monotonic() - began, 2)

    def _start(self, began: float, deadline: float) -> None:
        self.timings = _Timings()
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        for component in self._components.values():
            component.log.unlink(missing_ok=True)
        # Runtime state of an earlier run is stale; containerd's root (the image store) is
        # kept, so a second start in the same workdir skips the imports.
        for stale in (self.kubelet_dir, self.containerd_dir / "state", self.workdir / "cni"):
            shutil.rmtree(stale, ignore_errors=True)
        self.pause_image = pause_image()
        self.coredns_image = coredns_image(self._binaries["coredns"])
        self._mark("images_built", began)
        self._setup_network()
        self._spawn(
            "containerd", [str(which("containerd")), "--config", str(self._containerd_config())]
        )
        api = KubeAPIServer(
            self.workdir / "control-plane",
            etcd_bin=self._binaries["etcd"],
            apiserver_bin=self._binaries["kube-apiserver"],
            kubectl_bin=self._binaries["kubectl"],
            bind_address="0.0.0.0",
            advertise_address=HOST_IP,
            extra_sans=[
                HOST_IP,
                KUBERNETES_SERVICE_IP,
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                f"kubernetes.default.svc.{CLUSTER_DOMAIN}",
            ],
            service_cluster_ip_range=SERVICE_CIDR,
            authorization_modes=("Node", "RBAC"),
            service_account_admission=True,
            extra_args=[
                "--enable-admission-plugins=NodeRestriction",
                "--kubelet-preferred-address-types=InternalIP",
            ],
        )
        # One directory for every component's log.
        api.etcd_log, api.apiserver_log = (
            self.logs_dir / "etcd.log",
            self.logs_dir / "kube-apiserver.log",
        )
        self._api = api
        api.start(timeout=_remaining(deadline))
        self._mark("apiserver_ready", began)
        self._wait(deadline, "containerd", self._containerd_ready, ["containerd"])
        self._start_node_components()
        for image in (self.pause_image, self.coredns_image):
            self._import(image.archive, image.ref)
        for archive in self.images:
            self.import_image(archive)
        self._mark("images_imported", began)
        self.apply(manifests.coredns(self.coredns_image.ref))
        self._wait(deadline, f"node {self.node_name} Ready", self._node_ready, ["kubelet"])
        self._mark("node_ready", began)
        self._wait(
            deadline,
            "the default ServiceAccount",
            lambda: (
                self.api.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0]
                == 200
            ),
            ["kube-controller-manager"],
        )
        self._mark("default_service_account", began)
        self._wait(
            deadline,
            "CoreDNS Ready",
            lambda: self._pods_ready("kube-system", "k8s-app=kube-dns"),
            ["kubelet", "containerd", "kube-scheduler", "kube-proxy"],
            describe=lambda: self._describe_pods("kube-system"),
        )
        self._mark("first_pod_ready", began)

    def _setup_network(self) -> None:
        """The bridge with the gateway address, before the API server advertises it."""
        if BRIDGE in links():
            raise ClusterError(f"interface {BRIDGE} already exists and is not this cluster's")
        prefix = ipaddress.ip_network(POD_CIDR).prefixlen
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        run(["ip", "addr", "add", f"{HOST_IP}/{prefix}", "dev", BRIDGE])
        run(["ip", "link", "set", BRIDGE, "up"])
        # Replies from a Service's pod to a pod on the same bridge must pass iptables to be
        # un-NATed (kube-proxy); restored on stop like every other sysctl.
        write_sysctl("net.bridge.bridge-nf-call-iptables", "1")
        # Pods stay on this host: what would leave the bridge for another interface is dropped.
        run(
            [
                "iptables",
                "-w",
                "-I",
                "FORWARD",
                "1",
                "-i",
                BRIDGE,
                "!",
                "-o",
                BRIDGE,
                "-m",
                "comment",
                "--comment",
                "schedlock test node: pods reach this host only",
                "-j",
                "DROP",
            ]
        )

    def _containerd_config(self) -> Path:
        assert self.pause_image is not None
        return containerd_config(
            self.workdir, self.containerd_dir, self.containerd_socket, self.pause_image.ref
        )

    def _kubelet_config_file(self) -> Path:
        return kubelet_config(
            self.api, self.workdir, self.kubelet_dir, self.containerd_socket, self.node_name
        )

    def _spawn_controller(self, name: str, user: str, *flags: str) -> None:
        """A control-plane component of the one node: its own kubeconfig, no serving port and
        no leader election (one replica)."""
        kubeconfig = self.api.client_kubeconfig(name, user)
        self._spawn(
            name,
            [
                str(self._binaries[name]),
                f"--kubeconfig={kubeconfig}",
                "--secure-port=0",
                "--leader-elect=false",
                *flags,
                "--v=1",
            ],
        )

    def _start_node_components(self) -> None:
        api = self.api
        _, sa_private = api.service_account_key_paths
        self._spawn_controller(
            "kube-controller-manager",
            "system:kube-controller-manager",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={sa_private}",
            f"--root-ca-file={api.ca_path}",
            f"--cluster-signing-cert-file={api.ca_path}",
            f"--cluster-signing-key-file={api.ca_key_path}",
            f"--flex-volume-plugin-dir={self.workdir / 'flexvolume'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # Each controller logs in as its own ServiceAccount, and at the default 20
            # requests/s those logins alone delay the first ServiceAccount by seconds.
            "--kube-api-qps=200",
            "--kube-api-burst=400",
        )
        self._spawn_controller("kube-scheduler", "system:kube-scheduler")
        kubelet_config = self._kubelet_config_file()
        node_kubeconfig = api.client_kubeconfig(
            "kubelet", f"system:node:{self.node_name}", "system:nodes"
        )
        self._spawn(
            "kubelet",
            [
                str(self._binaries["kubelet"]),
                f"--config={kubelet_config}",
                f"--kubeconfig={node_kubeconfig}",
                f"--root-dir={self.kubelet_dir}",
                f"--hostname-override={self.node_name}",
                f"--node-ip={HOST_IP}",
                "--v=1",
            ],
        )
        proxy_kubeconfig = api.client_kubeconfig("kube-proxy", "system:kube-proxy")
        path = kube_proxy_config(self.workdir, proxy_kubeconfig, self.node_name)
        self._spawn("kube-proxy", [str(self._binaries["kube-proxy"]), f"--config={path}", "--v=1"])

    # ----------------------------------------------------------------- processes

    def _spawn(self, name: str, args: list[str]) -> None:
        component = self._components[name]
        component.proc = spawn_process(
            args, component.log, cwd=self.workdir, env={**os.environ, "PATH": PATH}
        )

    def _stop_component(self, name: str) -> None:
        component = self._components[name]
        if component.proc is not None:
            _stop_process(component.proc)
            component.proc = None

    def _logs(self, names: Iterable[str]) -> str:
        parts = [
            f"--- tail of {self._components[n].log}\n{_tail(self._components[n].log, _LOG_LINES)}"
            for n in names
        ]
        return "\n".join(parts)

    def _wait(
        self,
        deadline: float,
        what: str,
        probe: Callable[[], bool],
        logs: Sequence[str],
        *,
        describe: Callable[[], str] | None = None,
    ) -> None:
        """Poll PROBE until true; fail at once if a component died, with logs on timeout."""
        while True:
            for component in self._components.values():
                if component.proc is not None and component.proc.poll() is not None:
                    raise ClusterError(
                        f"{component.name} exited with code {component.proc.returncode} while "
                        f"waiting for {what}\n{self._logs([component.name])}"
                    )
            with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
                if probe():
                    return
            if time.monotonic() > deadline:
                detail = describe() if describe is not None else ""
                raise ClusterError(f"timed out waiting for {what}\n{detail}\n{self._logs(logs)}")
            time.sleep(_POLL_SECONDS)

    def _ctr(
        self, *args: str, check: bool = True, timeout: float = COMMAND_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        return run(
            ["ctr", "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args],
            check=check,
            timeout=timeout,
        )

    def _crictl(
        self, *args: str, check: bool = True, timeout: float = COMMAND_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        endpoint = f"unix://{self.containerd_socket}"
        return run(
            [
                str(self._binaries["crictl"]),
                "--runtime-endpoint",
                endpoint,
                "--image-endpoint",
                endpoint,
                *args,
            ],
            check=check,
            timeout=max(timeout, 1),
        )

    def _containerd_ready(self) -> bool:
        return self._ctr("version", check=False, timeout=5).returncode == 0

    # ----------------------------------------------------------------- API probes

    def _get(self, path: str) -> dict[str, Any] | None:
        status, body = self.api.request("GET", path)
        return json.loads(body) if status == 200 else None

    def _node_ready(self) -> bool:
        node = self._get(f"/api/v1/nodes/{self.node_name}")
        return node is not None and _condition(node, "Ready")

    def _pods_ready(self, namespace: str, selector: str) -> bool:
        pods = self._get(f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")
        items = [] if pods is None else pods["items"]
        return bool(items) and all(_condition(pod, "Ready") for pod in items)

    def _kubectl_says(self, *args: str, timeout: float = 120) -> Callable[[], str]:
        """For ``_wait(describe=…)``: what ``kubectl ARGS`` prints, whatever its exit status."""
        return lambda: self.kubectl(*args, check=False, timeout=timeout).stdout

    def _describe_pods(self, namespace: str) -> str:
        result = self.kubectl("describe", "pods", "-n", namespace, check=False, timeout=20)
        return "\n".join(result.stdout.splitlines()[-40:])

    def wait_pod_ready(self, namespace: str, name: str, timeout: float = 60) -> dict[str, Any]:
        """Wait until pod NAMESPACE/NAME is Ready and return it; on timeout raise with the
        pod's description and the kubelet's log."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        found: dict[str, Any] = {}

        def ready() -> bool:
            pod = self._get(path)
            if pod is not None:
                found.update(pod)
            return pod is not None and _condition(pod, "Ready")

        self._wait(
            time.monotonic() + timeout,
            f"pod {namespace}/{name} Ready",
            ready,
            ["kubelet", "containerd"],
            describe=self._kubectl_says("describe", "pod", name, "-n", namespace, timeout=20),
        )
        return found

    def create_namespace(self, name: str, timeout: float = 30) -> None:
        """Create namespace NAME and wait for its ``default`` ServiceAccount.

        The controller-manager creates that ServiceAccount a moment after the namespace, and
        until it exists the ServiceAccount admission plugin rejects every pod there.
        """
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        path = f"/api/v1/namespaces/{name}/serviceaccounts/default"
        self._wait(
            time.monotonic() + timeout,
            f"the default ServiceAccount of namespace {name}",
            lambda: self.api.request("GET", path)[0] == 200,
            ["kube-controller-manager"],
        )

    # ----------------------------------------------------------------- images & services

    def _import(self, archive: Path, ref: str | None = None) -> str:
        if ref is not None and ref in self._ctr("images", "ls", "-q").stdout.split():
            return ref  # containerd's root survives restarts: warm starts skip the import
        output = self._ctr("images", "import", str(archive), timeout=300).stdout
        names = re.findall(r"unpacking (\S+) \(sha256:", output)
        if ref is not None:
            return ref
        if names:
            return str(names[0])
        return _archive_name(archive)

    def import_image(self, archive: Path) -> str:
        """Import an OCI or docker archive into the node's containerd; returns its name.

        Pods use it with ``imagePullPolicy: Never`` (or ``IfNotPresent``): nothing is pulled.
        """
        return self._import(Path(archive))

    def expose_host_service(
        self, namespace: str, name: str, port: int, target_port: int | None = None
    ) -> str:
        """Make ``host_ip:TARGET_PORT`` (default PORT) a Service NAME:PORT in NAMESPACE.

        A Service without selector plus an EndpointSlice pointing at the host, so pods reach a
        host process (PostgreSQL, a recorder) by name; the host process must listen on
        ``host_ip`` (or all addresses). Returns the Service's DNS name.
        """
        target = target_port if target_port is not None else port
        self.apply(manifests.host_service(namespace, name, port, target))
        self.wait_service_routable(namespace, name)
        return f"{name}.{namespace}.svc.{CLUSTER_DOMAIN}"

    def wait_service_routable(self, namespace: str, name: str, timeout: float = 30) -> None:
        """Wait until kube-proxy routes Service NAMESPACE/NAME to at least one endpoint.

        Until then a connection is refused (kube-proxy rejects Services without endpoints),
        so a test that just created a Service waits here instead of retrying.
        """
        marker = f'--comment "{namespace}/{name}'

        def routed() -> bool:
            rules = run(["iptables-save", "-t", "nat"]).stdout.splitlines()
            return any(
                line.startswith("-A KUBE-SVC-") and marker in line and "-j KUBE-SEP-" in line
                for line in rules
            )

        self._wait(
            time.monotonic() + timeout,
            f"kube-proxy to route Service {namespace}/{name}",
            routed,
            ["kube-proxy", "kube-controller-manager"],
            describe=self._kubectl_says(
                "get", "service,endpointslices", "-n", namespace, "-o", "wide"
            ),
        )


def _condition(obj: Mapping[str, Any], kind: str) -> bool:
    conditions = obj.get("status", {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def _remaining(deadline: float) -> float:
    return max(deadline - time.monotonic(), 1.0)


def _archive_name(archive: Path) -> str:
    """The image name an OCI archive's index.json carries (when ctr printed none)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ClusterError(f"{archive} has no index.json")
        index = json.load(member)
    for manifest in index.get("manifests", []):
        annotations = manifest.get("annotations", {})
        for key in ("io.containerd.image.name", "org.opencontainers.image.ref.name"):
            if key in annotations:
                return str(annotations[key])
    raise ClusterError(f"{archive} names no image")


def _drop_registry(workdir: Path) -> None:
    with contextlib.suppress(OSError, ValueError, KeyError):
        if json.loads(HOST_REGISTRY.read_text())["workdir"] == str(workdir):
            HOST_REGISTRY.unlink()


def _owner(state: Mapping[str, Any]) -> Proc:
    """The process that claimed the host in STATE (a host-state or registry file)."""
    return Proc("cluster", int(state["pid"]), int(state["pid_start"]))
