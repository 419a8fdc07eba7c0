"""What the node needs on the host, checked before anything on the host changes."""

from __future__ import annotations

import os
from pathlib import Path

from testbed.kube import KubeToolsMissingError, resolve_tool_dir
from testbed.node.commands import which
from testbed.node.errors import ClusterPrerequisiteMissing
from testbed.node.plan import CNI_BIN_DIR, PATH

INSTALL_HINT = "bash hack/tools.sh ensure node"
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
    missing += [f"{tool} (not on {PATH})" for tool in _HOST_TOOLS if which(tool) is None]
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
