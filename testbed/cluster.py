"""A real single-node Kubernetes cluster for tests, from cached binaries and images built here.

``Cluster(workdir).start()`` runs, each as its own process in its own session with
PR_SET_PDEATHSIG (nothing outlives the test process) and its log under ``workdir/logs``:
etcd + kube-apiserver (``KubeAPIServer`` with ``Node,RBAC`` and ServiceAccount admission),
kube-controller-manager, kube-scheduler, containerd (own root, state, socket and config under
the workdir), kubelet (cgroupfs driver) and kube-proxy (iptables mode), plus CoreDNS as a
Deployment behind the ``kube-dns`` Service. Every component logs in with its own cert signed by
the test CA, under the identity the built-in RBAC roles and the Node authorizer expect. Images
are never pulled: the pause and CoreDNS images are built here (``testbed.oci``) and
imported into containerd, as are the archives passed as ``images``.

Address plan (one node):

- pods: ``10.244.0.0/24`` on the bridge ``schedlock0``. Its gateway ``10.244.0.1`` is created
  here before anything starts; it is ``host_ip``: the node's InternalIP, the API server's
  advertise address, and where pods reach host processes (``expose_host_service``).
- Services: ``10.96.0.0/12``; ``kubernetes`` is ``10.96.0.1`` (-> 10.244.0.1:PORT), ``kube-dns``
  is ``10.96.0.10``; names resolve under ``cluster.local``.
- The API server listens on every address of the host so host clients keep using
  ``https://127.0.0.1:PORT`` (``url``, ``admin_kubeconfig``) and pods use ``10.96.0.1``.
- Nothing in a pod reaches beyond this host: CoreDNS has no ``forward`` plugin, the pods' view
  of the host resolver is an empty file, and a FORWARD rule drops what leaves the bridge for
  another interface.

Host state: the node changes sysctls, iptables/nftables rules, links, mounts, cgroups and a few
host paths. Before changing anything, ``start()`` captures a ``HostState`` into
``workdir/host-state.json`` and registers the run in ``/run/schedlock-cluster.json`` (one
cluster per host at a time; a second ``start()`` while one runs raises ``ClusterBusy``).
``stop()`` puts everything back as captured and removes both files. After a crash, the next
``start()`` (from any workdir) or ``Cluster.cleanup_stale(workdir)`` restores the dead run's
host state from its capture, killing what the run left behind (pods, shims) by process id.

Every wait has a deadline and fails with the tail of the logs that explain it; a missing
binary or package fails up front with ``ClusterPrerequisiteMissing``, naming it and the command
that installs it. This module has no pytest dependency so a dev-stack script can use it too.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.kube import (
    KubeAPIServer,
    KubeManifest,
    KubeToolsMissingError,
    _free_ports,
    _stop_process,
    _tail,
    resolve_tool_dir,
    spawn_process,
)
from testbed.oci import Image, coredns_image, pause_image
from testbed.procs import StartStop

__all__ = [
    "BRIDGE",
    "DNS_SERVICE_IP",
    "HOST_IP",
    "HOST_PATHS",
    "POD_CIDR",
    "SERVICE_CIDR",
    "Cluster",
    "ClusterBusy",
    "ClusterError",
    "ClusterPrerequisiteMissing",
    "HostState",
    "check_prerequisites",
    "host_state_differences",
]

NODE_NAME = "schedlock-node"
BRIDGE = "schedlock0"
POD_CIDR = "10.244.0.0/24"
HOST_IP = "10.244.0.1"
SERVICE_CIDR = "10.96.0.0/12"
KUBERNETES_SERVICE_IP = "10.96.0.1"
DNS_SERVICE_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
CNI_BIN_DIR = Path("/usr/lib/cni")
HOST_REGISTRY = Path("/run/schedlock-cluster.json")
# containerd's sockets when the workdir's path is too long for one (sun_path: 108 bytes, and
# containerd 1.6 refuses more than 104 for its ".ttrpc" socket); one cluster per host anyway.
SHORT_SOCKET_DIR = Path("/run/schedlock-node")
INSTALL_HINT = "bash hack/tools.sh ensure node"

# Host paths a node component may create outside the workdir (containerd 1.6 hard-codes
# /run/containerd/{s,fifo}; kubelet /var/lib/kubelet/device-plugins and /var/log/containers;
# the CNI library /var/lib/cni/results; mount(8) /run/mount; the rest are defaults moved away,
# listed as a guard).
HOST_PATHS = (
    "/run/containerd",
    "/run/mount",
    "/run/netns",
    "/run/kubernetes",
    "/var/lib/cni",
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/var/log/containers",
    "/var/log/pods",
    "/usr/libexec/kubernetes",
    "/etc/kubernetes",
    "/etc/cni",
    "/opt/cni",
    "/opt/containerd",
    str(SHORT_SOCKET_DIR),
    str(HOST_REGISTRY),
)
# Mounts below these (and below the workdir) are the node's: kubelet volumes, containerd
# rootfs overlays and shm, network namespaces.
_MOUNT_ROOTS = ("/run/containerd", "/run/netns", "/var/lib/kubelet", "/var/lib/containerd")
_SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
)
# Whole sysctl directories captured too (writable entries only): forwarding and route_localnet
# per interface, br_netfilter, conntrack tuning.
_SYSCTL_DIRS = ("net/ipv4/conf", "net/ipv6/conf/all", "net/ipv6/conf/default", "net/bridge")
_SYSCTL_GLOBS = ("net/netfilter/nf_conntrack_*",)

_KUBE_TOOLS = (
    "etcd",
    "kube-apiserver",
    "kubectl",
    "kubelet",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-proxy",
    "coredns",
    "crictl",
)
_HOST_TOOLS = (
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "runc",
    "iptables",
    "iptables-save",
    "iptables-restore",
    "ip6tables-save",
    "ip6tables-restore",
    "nft",
    "ip",
    "conntrack",
    "gcc",
)
_CNI_PLUGINS = ("bridge", "host-local", "portmap", "loopback")
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SOCKET_PATH_MAX = 98  # containerd refuses more than 104 bytes for "<socket>.ttrpc"
_POLL_SECONDS = 0.2
_COMMAND_TIMEOUT = 60.0
_LOG_LINES = 30
MNT_DETACH = 2


class ClusterError(RuntimeError):
    """The cluster did not come up or a wait timed out; the message has the relevant logs."""


class ClusterPrerequisiteMissing(ClusterError):
    """Something the node needs is not installed; the message says what and how to install it."""


class ClusterBusy(ClusterError):
    """Another cluster already runs on this host (kube-proxy and the bridge are host-wide)."""


# --------------------------------------------------------------------------- small helpers


def _run(
    args: Sequence[str],
    *,
    input: str | None = None,
    check: bool = True,
    timeout: float = _COMMAND_TIMEOUT,
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        list(args),
        input=input,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={**os.environ, "PATH": _PATH},
    )
    if check and result.returncode != 0:
        raise ClusterError(
            f"`{' '.join(args)}` failed ({result.returncode}):\n{result.stderr}{result.stdout}"
        )
    return result


def _which(tool: str) -> str | None:
    return shutil.which(tool, path=_PATH)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _sysctl_path(key: str) -> Path:
    return Path("/proc/sys") / key.replace(".", "/")


def _write_sysctl(key: str, value: str) -> None:
    with contextlib.suppress(OSError):  # an interface or module gone since the capture
        _sysctl_path(key).write_text(value)


def _unescape(text: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040…)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), text)


def _mountinfo() -> list[tuple[str, str, str, str]]:
    """(mount point, root, fs type, source) of every mount, octal escapes decoded."""
    entries = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        entries.append((_unescape(fields[4]), _unescape(fields[3]), tail[0], tail[1]))
    return entries


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _process_start_time(pid: int) -> str | None:
    """PID's start time; None when there is no such process or it is a zombie (it has exited:
    a killed run's process waits for init to reap it, which may never happen here)."""
    stat = _read(Path(f"/proc/{pid}/stat"))
    if stat is None:
        return None
    fields = stat.rpartition(")")[2].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _alive(pid: int, start_time: str | None) -> bool:
    """Whether PID is still the live process that had START_TIME (pids are reused)."""
    current = _process_start_time(pid)
    return current is not None and current == start_time


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        stat = _read(Path(f"/proc/{pid}/stat"))
        if stat is None:
            break
        pid = int(stat.rpartition(")")[2].split()[1])
    return pids


def _strip_counters(text: str) -> str:
    """Saved rule sets without comment lines and packet/byte counters (they always change)."""
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    text = "\n".join(lines)
    text = re.sub(r"\[\d+:\d+\]", "[0:0]", text)
    return re.sub(r"counter packets \d+ bytes \d+", "counter", text)


# --------------------------------------------------------------------------- host state


@dataclass(frozen=True)
class HostState:
    """What the node changes on the host, captured so that it can be put back exactly."""

    sysctls: dict[str, str]
    """Sysctl values by dotted name (the fixed list plus whole directories, writable only)."""
    iptables: dict[str, str]
    """``iptables-save`` / ``ip6tables-save`` output without comments and counters."""
    nft_tables: list[str]
    """``family name`` of every nftables table (iptables-nft creates tables, never drops)."""
    nft_ruleset: str
    """``nft list ruleset`` without counters."""
    links: dict[str, str]
    """Network interfaces by name, with their kind (``bridge``, ``veth``, "" for plain)."""
    mounts: list[str]
    """``mount-point root fs-type source`` of every mount."""
    cgroups: dict[str, list[str]]
    """Top-level cgroup directories by hierarchy mount point."""
    paths: dict[str, bool]
    """Whether each of ``HOST_PATHS`` exists."""

    @classmethod
    def capture(cls) -> HostState:
        mounts = _mountinfo()
        cgroup_mounts = [point for point, _, fstype, _ in mounts if fstype in ("cgroup", "cgroup2")]
        return cls(
            sysctls=_capture_sysctls(),
            iptables={
                tool: _strip_counters(_run([tool], check=False).stdout)
                for tool in ("iptables-save", "ip6tables-save")
            },
            nft_tables=_nft_tables(),
            nft_ruleset=_strip_counters(_run(["nft", "list", "ruleset"], check=False).stdout),
            links=_links(),
            mounts=sorted(" ".join(entry) for entry in mounts),
            cgroups={point: sorted(_cgroup_children(Path(point))) for point in cgroup_mounts},
            paths={path: os.path.lexists(path) for path in HOST_PATHS},
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HostState:
        return cls(**data)


def host_state_differences(before: HostState, after: HostState) -> list[str]:
    """What differs between two captures, one line each; empty when the host is as it was.

    Sysctls compare on the keys captured BEFORE: a kernel module loaded on the way
    (nf_conntrack) adds keys of its own but changes none.
    """
    diffs = [
        f"sysctl {key}: {value} -> {after.sysctls.get(key)}"
        for key, value in before.sysctls.items()
        if after.sysctls.get(key) != value
    ]
    for name in ("iptables", "links", "cgroups", "paths"):
        old, new = getattr(before, name), getattr(after, name)
        diffs += [
            f"{name} {key}: {old.get(key)!r} -> {new.get(key)!r}"
            for key in sorted(set(old) | set(new))
            if old.get(key) != new.get(key)
        ]
    for name in ("nft_tables", "mounts"):
        old, new = set(getattr(before, name)), set(getattr(after, name))
        diffs += [f"{name} gone: {entry}" for entry in sorted(old - new)]
        diffs += [f"{name} left: {entry}" for entry in sorted(new - old)]
    if before.nft_ruleset != after.nft_ruleset:
        diffs.append(f"nft ruleset:\n{before.nft_ruleset}\n--- now\n{after.nft_ruleset}")
    return diffs


def _capture_sysctls() -> dict[str, str]:
    paths = [_sysctl_path(key) for key in _SYSCTLS]
    root = Path("/proc/sys")
    for directory in _SYSCTL_DIRS:
        paths.extend(p for p in (root / directory).rglob("*") if p.is_file())
    for pattern in _SYSCTL_GLOBS:
        paths.extend(root.glob(pattern))
    values = {}
    for path in paths:
        with contextlib.suppress(OSError):
            if path.stat().st_mode & 0o200:  # read-only entries are state, not settings
                values[".".join(path.relative_to(root).parts)] = path.read_text().strip()
    return values


def _nft_tables() -> list[str]:
    output = _run(["nft", "list", "tables"], check=False).stdout
    return sorted(line.removeprefix("table ").strip() for line in output.splitlines() if line)


def _links() -> dict[str, str]:
    data = json.loads(_run(["ip", "-d", "-j", "link", "show"]).stdout or "[]")
    return {link["ifname"]: link.get("linkinfo", {}).get("info_kind", "") for link in data}


def _cgroup_children(hierarchy: Path) -> list[str]:
    with contextlib.suppress(OSError):
        return [entry.name for entry in hierarchy.iterdir() if entry.is_dir()]
    return []


def _parse_save(text: str) -> dict[str, tuple[dict[str, str], list[str]]]:
    """iptables-save text -> {table: ({chain: policy}, [rule without "-A "])}."""
    tables: dict[str, tuple[dict[str, str], list[str]]] = {}
    chains: dict[str, str] = {}
    rules: list[str] = []
    for line in text.splitlines():
        if line.startswith("*"):
            chains, rules = {}, []
            tables[line[1:]] = (chains, rules)
        elif line.startswith(":"):
            name, policy = line[1:].split()[:2]
            chains[name] = policy
        elif line.startswith("-A "):
            rules.append(line[3:])
    return tables


def _iptables_undo(before: str, now: str) -> str:
    """An ``iptables-restore --noflush`` script that turns rule set NOW back into BEFORE."""
    old, new = _parse_save(before), _parse_save(now)
    script = []
    for table, (chains, rules) in new.items():
        old_chains, old_rules = old.get(table, ({}, []))
        remaining = collections.Counter(old_rules)
        extra = []
        for rule in rules:
            if remaining[rule] > 0:
                remaining[rule] -= 1
            else:
                extra.append(rule)
        added = [chain for chain in chains if chain not in old_chains]
        lines = [f"-D {rule}" for rule in reversed(extra) if rule.split()[0] not in added]
        lines += [f"-F {chain}" for chain in added] + [f"-X {chain}" for chain in added]
        lines += [f"-N {chain}" for chain in old_chains if chain not in chains]
        lines += [f"-A {rule}" for rule, count in remaining.items() for _ in range(count)]
        lines += [
            f"-P {chain} {policy}"
            for chain, policy in old_chains.items()
            if policy != "-" and chains.get(chain, policy) != policy
        ]
        if lines:
            script += [f"*{table}", *lines, "COMMIT"]
    return "\n".join(script) + "\n" if script else ""


def _kill_leftovers(workdir: Path, deadline: float) -> None:
    """SIGKILL, by pid, the processes a node run left: pods (in kubepods cgroups) and anything
    whose command line names the workdir (containerd shims, components of a crashed run)."""
    spare = _ancestors()
    # The shims name containerd's socket, which is not under the workdir when it had to move
    # to SHORT_SOCKET_DIR; they also run in a directory of the workdir's containerd state.
    markers = [f"{workdir}/".encode(), f"{SHORT_SOCKET_DIR}/".encode()]
    victims: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in spare:
            continue
        with contextlib.suppress(OSError):
            args = proc.joinpath("cmdline").read_bytes().split(b"\0")
            named = any(m in arg for m in markers for arg in args)
            if named or str(workdir).encode() in args:
                victims.add(int(proc.name))
                continue
            if os.readlink(proc / "cwd").startswith(f"{workdir}/"):
                victims.add(int(proc.name))
    for point, _, fstype, _ in _mountinfo():
        if fstype not in ("cgroup", "cgroup2"):
            continue
        for procs in Path(point, "kubepods").rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                victims.update(int(pid) for pid in procs.read_text().split())
    victims -= spare
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    while victims and time.monotonic() < deadline:
        for pid in list(victims):
            stat = _read(Path(f"/proc/{pid}/stat"))
            if stat is None or stat.rpartition(")")[2].split()[0] in ("Z", "X"):
                victims.discard(pid)
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)  # ours if the crashed run was this process
        time.sleep(0.05)


def _unmount_below(roots: Sequence[str], before: set[str]) -> None:
    """Detach every mount under ROOTS that the capture did not have, deepest first."""
    libc = ctypes.CDLL(None, use_errno=True)
    points = {point for point, *_ in _mountinfo() if _under(point, roots)}
    for point in sorted(points - before, key=lambda p: p.count("/"), reverse=True):
        libc.umount2(point.encode(), MNT_DETACH)


def _remove_cgroups(before: Mapping[str, Sequence[str]], deadline: float) -> list[str]:
    """rmdir (bottom-up) the top-level cgroups that are new; returns those that stayed."""
    stuck = []
    for hierarchy, children in before.items():
        for name in set(_cgroup_children(Path(hierarchy))) - set(children):
            top = Path(hierarchy, name)
            while True:
                for directory, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
                    with contextlib.suppress(OSError):
                        os.rmdir(directory)
                if not top.exists():
                    break
                if time.monotonic() > deadline:
                    stuck.append(str(top))
                    break
                time.sleep(0.1)
    return stuck


def _restore_host(before: HostState, workdir: Path, timeout: float = 30) -> None:
    """Put the host back as BEFORE: processes, mounts, links, rules, cgroups, paths, sysctls."""
    deadline = time.monotonic() + timeout
    _kill_leftovers(workdir, deadline)
    before_points = {entry.split(" ", 1)[0] for entry in before.mounts}
    _unmount_below([str(workdir), *_MOUNT_ROOTS], before_points)
    for name, kind in _links().items():
        if name not in before.links and kind in ("bridge", "veth"):
            _run(["ip", "link", "delete", name], check=False)
    for save, restore in (
        ("iptables-save", "iptables-restore"),
        ("ip6tables-save", "ip6tables-restore"),
    ):
        now = _strip_counters(_run([save], check=False).stdout)
        script = _iptables_undo(before.iptables.get(save, ""), now)
        if script:
            _run([restore, "-w", "--noflush"], input=script, check=False)
    for table in set(_nft_tables()) - set(before.nft_tables):
        _run(["nft", "delete", "table", *table.split()], check=False)
    stuck = _remove_cgroups(before.cgroups, deadline)
    for path, existed in before.paths.items():
        if not existed and os.path.lexists(path):
            if Path(path).is_dir() and not Path(path).is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                Path(path).unlink(missing_ok=True)
    # ip_forward first: writing it resets every interface's forwarding, which comes after.
    order = lambda key: (key != "net.ipv4.ip_forward", ".all." not in key, key)  # noqa: E731
    for key in sorted(before.sysctls, key=order):
        if _read(_sysctl_path(key)) not in (None, before.sysctls[key]):
            _write_sysctl(key, before.sysctls[key])
    if stuck:
        raise ClusterError(f"cgroups still in use after the node stopped: {', '.join(stuck)}")


# --------------------------------------------------------------------------- prerequisites


def check_prerequisites() -> dict[str, Path]:
    """Check, before touching the host, that everything the node needs is there.

    Returns the paths of the pinned Kubernetes binaries by name; raises
    ``ClusterPrerequisiteMissing`` listing everything that is missing.
    """
    if os.geteuid() != 0:
        raise ClusterPrerequisiteMissing(
            "the test node needs root (kubelet, containerd, iptables, mounts); run as root"
        )
    missing = []
    binaries: dict[str, Path] = {}
    for tool in _KUBE_TOOLS:
        try:
            path = resolve_tool_dir(tool) / tool
        except KubeToolsMissingError as error:
            missing.append(f"{tool} ({error})")
            continue
        if not os.access(path, os.X_OK):
            missing.append(f"{tool} (not at {path})")
        binaries[tool] = path
    missing += [f"{tool} (not on {_PATH})" for tool in _HOST_TOOLS if _which(tool) is None]
    missing += [
        f"CNI plugin {CNI_BIN_DIR / plugin}"
        for plugin in _CNI_PLUGINS
        if not os.access(CNI_BIN_DIR / plugin, os.X_OK)
    ]
    if missing:
        raise ClusterPrerequisiteMissing(
            "the test node is missing: " + "; ".join(missing) + f". Install with `{INSTALL_HINT}`"
        )
    if not Path("/proc/sys/net/bridge/bridge-nf-call-iptables").exists():
        raise ClusterPrerequisiteMissing(
            "the br_netfilter kernel module is not loaded (Service replies between pods on one "
            "bridge need it): run `modprobe br_netfilter`"
        )
    if (
        not Path("/sys/fs/cgroup/memory").is_dir()
        and not Path("/sys/fs/cgroup/cgroup.controllers").exists()
    ):
        raise ClusterPrerequisiteMissing(
            "no cgroup hierarchy with the memory controller is mounted"
        )
    return binaries


# --------------------------------------------------------------------------- manifests


def _coredns_manifests(image: str) -> list[Mapping[str, Any]]:
    """CoreDNS as kubeadm installs it, minus `forward` and `cache`.

    Without `forward` only cluster names resolve and nothing goes upstream; without `cache` a
    name asked for a moment before its Service existed is not answered NXDOMAIN for 30 s.
    """
    labels = {"k8s-app": "kube-dns"}
    corefile = f""".:53 {{
    errors
    health :8080
    ready :8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
}}
"""
    meta = {"name": "coredns", "namespace": "kube-system"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", **meta}],
        },
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"Corefile": corefile}},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {**meta, "labels": labels},
            "spec": {
                "replicas": 1,  # two shared cores: one replica is enough for one node
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "coredns",
                        "priorityClassName": "system-cluster-critical",
                        "dnsPolicy": "Default",
                        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
                        "containers": [
                            {
                                "name": "coredns",
                                "image": image,
                                "imagePullPolicy": "Never",
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                    {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                                ],
                                "readinessProbe": {
                                    "httpGet": {"path": "/ready", "port": 8181},
                                    "periodSeconds": 1,
                                },
                                "livenessProbe": {
                                    "httpGet": {"path": "/health", "port": 8080},
                                    "periodSeconds": 10,
                                    "failureThreshold": 5,
                                },
                                "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
            "spec": {
                "clusterIP": DNS_SERVICE_IP,
                "selector": labels,
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                ],
            },
        },
    ]


# --------------------------------------------------------------------------- the cluster


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

    @property
    def host_ip(self) -> str:
        """The address pods reach host processes at (the bridge's gateway, the node's IP)."""
        return HOST_IP

    @property
    def pod_cidr(self) -> str:
        return POD_CIDR

    @property
    def service_cidr(self) -> str:
        return SERVICE_CIDR

    @property
    def dns_service_ip(self) -> str:
        return DNS_SERVICE_IP

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
            _run([str(proxy), "--cleanup", "--v=0"], check=False, timeout=_remaining(deadline))
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
        if _alive(state["pid"], state["pid_start"]) and state["pid"] != os.getpid():
            raise ClusterBusy(f"the run in {workdir} (pid {state['pid']}) is still alive")
        _restore_host(HostState.from_json(state["host"]), workdir)
        state_file.unlink(missing_ok=True)
        _drop_registry(workdir)
        return True

    # ----------------------------------------------------------------- host claim

    def _claim_host(self) -> None:
        """Refuse a second live cluster, clean up a dead one, then capture the host state."""
        if HOST_REGISTRY.exists():
            owner = json.loads(HOST_REGISTRY.read_text())
            if _alive(owner["pid"], owner["pid_start"]):
                raise ClusterBusy(
                    f"a schedlock test cluster already runs on this host (workdir "
                    f"{owner['workdir']}, pid {owner['pid']}); stop it first"
                )
            stale = Path(owner["workdir"])
            if not Cluster.cleanup_stale(stale):
                # Its workdir is gone: the copy of the capture in the registry still restores.
                _restore_host(HostState.from_json(owner["host"]), stale)
                HOST_REGISTRY.unlink(missing_ok=True)
        Cluster.cleanup_stale(self.workdir)
        state = {
            "workdir": str(self.workdir),
            "pid": os.getpid(),
            "pid_start": _process_start_time(os.getpid()),
            "host": HostState.capture().to_json(),
        }
        text = json.dumps(state, indent=1)
        self.state_file.write_text(text)
        HOST_REGISTRY.write_text(text)

    def _release_host(self, timeout: float) -> None:
        state = json.loads(self.state_file.read_text())
        _restore_host(HostState.from_json(state["host"]), self.workdir, timeout=max(timeout, 10))
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
            "containerd", [str(_which("containerd")), "--config", str(self._containerd_config())]
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
        self.apply(_coredns_manifests(self.coredns_image.ref))
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
        if BRIDGE in _links():
            raise ClusterError(f"interface {BRIDGE} already exists and is not this cluster's")
        prefix = ipaddress.ip_network(POD_CIDR).prefixlen
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        _run(["ip", "addr", "add", f"{HOST_IP}/{prefix}", "dev", BRIDGE])
        _run(["ip", "link", "set", BRIDGE, "up"])
        # Replies from a Service's pod to a pod on the same bridge must pass iptables to be
        # un-NATed (kube-proxy); restored on stop like every other sysctl.
        _write_sysctl("net.bridge.bridge-nf-call-iptables", "1")
        # Pods stay on this host: what would leave the bridge for another interface is dropped.
        _run(
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
        d = self.containerd_dir
        for sub in ("root", "state", "opt"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        self.containerd_socket.parent.mkdir(parents=True, exist_ok=True)
        cni_conf = self.workdir / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        conflist = {
            "cniVersion": "1.0.0",
            "name": "schedlock",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR, "gateway": HOST_IP}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.workdir / "cni" / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (cni_conf / "10-schedlock.conflist").write_text(json.dumps(conflist, indent=2))
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        assert self.pause_image is not None
        config = f"""version = 2
root = "{d / "root"}"
state = "{d / "state"}"
# Snapshotters this node does not use would only probe the host at start.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{self.containerd_socket}"

[ttrpc]
  address = "{self.containerd_socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"

[{cri}]
  sandbox_image = "{self.pause_image.ref}"
  # No CAP_SYS_RESOURCE here: a negative oom_score_adj would fail every sandbox in runc.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  # No systemd as PID 1: cgroupfs, as kubelet's driver.
  SystemdCgroup = false
  Root = "{d / "runc"}"

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{cni_conf}"
  max_conf_num = 1
"""
        path = d / "config.toml"
        path.write_text(config)
        return path

    def _start_node_components(self) -> None:
        api = self.api
        _, sa_private = api.service_account_key_paths
        kcm = api.client_kubeconfig("kube-controller-manager", "system:kube-controller-manager")
        self._spawn(
            "kube-controller-manager",
            [
                str(self._binaries["kube-controller-manager"]),
                f"--kubeconfig={kcm}",
                "--secure-port=0",
                "--leader-elect=false",
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
                "--v=1",
            ],
        )
        scheduler = api.client_kubeconfig("kube-scheduler", "system:kube-scheduler")
        self._spawn(
            "kube-scheduler",
            [
                str(self._binaries["kube-scheduler"]),
                f"--kubeconfig={scheduler}",
                "--secure-port=0",
                "--leader-elect=false",
                "--v=1",
            ],
        )
        kubelet_config = self._kubelet_config()
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
        healthz, metrics = _free_ports(2)
        proxy_config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(proxy_kubeconfig)},
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            "hostnameOverride": self.node_name,
            "healthzBindAddress": f"127.0.0.1:{healthz}",
            "metricsBindAddress": f"127.0.0.1:{metrics}",
            # Zero leaves the host's conntrack sysctls alone.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
                "udpTimeout": "0s",
                "udpStreamTimeout": "0s",
            },
            # Without localhost NodePorts kube-proxy has no reason to set route_localnet.
            "iptables": {"localhostNodePorts": False},
            "oomScoreAdj": 0,
        }
        path = self.workdir / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(proxy_config))
        self._spawn("kube-proxy", [str(self._binaries["kube-proxy"]), f"--config={path}", "--v=1"])

    def _kubelet_config(self) -> Path:
        api = self.api
        (port,) = _free_ports(1)
        serving_cert, serving_key = api.issue_cert(
            "kubelet-serving",
            f"system:node:{self.node_name}",
            "system:nodes",
            server_hosts=[HOST_IP, self.node_name, "127.0.0.1"],
        )
        self.kubelet_dir.mkdir(parents=True, exist_ok=True)
        resolv = self.kubelet_dir / "resolv.conf"
        resolv.write_text("# no host resolvers: pods resolve cluster names only\n")
        socket = f"unix://{self.containerd_socket}"
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": HOST_IP,
            "port": port,
            "readOnlyPort": 0,
            "healthzPort": 0,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(api.ca_path)},
            },
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(serving_cert),
            "tlsPrivateKeyFile": str(serving_key),
            "containerRuntimeEndpoint": socket,
            "imageServiceEndpoint": socket,
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "makeIPTablesUtilChains": False,
            "podLogsDir": str(self.workdir / "pod-logs"),
            "volumePluginDir": str(self.workdir / "volume-plugins"),
            "clusterDNS": [DNS_SERVICE_IP],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(resolv),
            "oomScoreAdj": 0,
            # Never evict or garbage-collect the imported images for a nearly full test disk.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
                "imagefs.inodesFree": "1%",
            },
            "serializeImagePulls": False,
            "staticPodPath": "",
        }
        path = self.workdir / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    # ----------------------------------------------------------------- processes

    def _spawn(self, name: str, args: list[str]) -> None:
        component = self._components[name]
        component.proc = spawn_process(
            args, component.log, cwd=self.workdir, env={**os.environ, "PATH": _PATH}
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
        self, *args: str, check: bool = True, timeout: float = _COMMAND_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        return _run(
            ["ctr", "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args],
            check=check,
            timeout=timeout,
        )

    def _crictl(
        self, *args: str, check: bool = True, timeout: float = _COMMAND_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        endpoint = f"unix://{self.containerd_socket}"
        return _run(
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
            describe=lambda: (
                self.kubectl(
                    "describe", "pod", name, "-n", namespace, check=False, timeout=20
                ).stdout
            ),
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
        self.apply(
            [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"ports": [{"port": port, "targetPort": target, "protocol": "TCP"}]},
                },
                {
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSlice",
                    "metadata": {
                        "name": f"{name}-host",
                        "namespace": namespace,
                        "labels": {
                            "kubernetes.io/service-name": name,
                            # Not the endpointslice controller's: it leaves this one alone.
                            "endpointslice.kubernetes.io/managed-by": "schedlock-testbed",
                        },
                    },
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": [HOST_IP], "conditions": {"ready": True}}],
                    "ports": [{"port": target, "protocol": "TCP"}],
                },
            ]
        )
        self.wait_service_routable(namespace, name)
        return f"{name}.{namespace}.svc.{CLUSTER_DOMAIN}"

    def wait_service_routable(self, namespace: str, name: str, timeout: float = 30) -> None:
        """Wait until kube-proxy routes Service NAMESPACE/NAME to at least one endpoint.

        Until then a connection is refused (kube-proxy rejects Services without endpoints),
        so a test that just created a Service waits here instead of retrying.
        """
        marker = f'--comment "{namespace}/{name}'

        def routed() -> bool:
            rules = _run(["iptables-save", "-t", "nat"]).stdout.splitlines()
            return any(
                line.startswith("-A KUBE-SVC-") and marker in line and "-j KUBE-SEP-" in line
                for line in rules
            )

        self._wait(
            time.monotonic() + timeout,
            f"kube-proxy to route Service {namespace}/{name}",
            routed,
            ["kube-proxy", "kube-controller-manager"],
            describe=lambda: (
                self.kubectl(
                    "get", "service,endpointslices", "-n", namespace, "-o", "wide", check=False
                ).stdout
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
