"""Configuration files of the node's containerd (with its CNI network), kubelet and kube-proxy.

Each goes under the workdir and keeps its component off host-wide defaults: containerd's root,
state and sockets, kubelet's directories and resolv.conf, kube-proxy's conntrack sysctls.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from testbed.kube import KubeAPIServer, _free_ports
from testbed.node.plan import (
    BRIDGE,
    CLUSTER_DOMAIN,
    CNI_BIN_DIR,
    DNS_SERVICE_IP,
    HOST_IP,
    POD_CIDR,
)


def containerd_config(
    workdir: Path, containerd_dir: Path, socket: Path, sandbox_image: str
) -> Path:
    """containerd's config.toml (root, state and sockets of its own; the CNI bridge network)."""
    d = containerd_dir
    for sub in ("root", "state", "opt"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    socket.parent.mkdir(parents=True, exist_ok=True)
    cni_conf = workdir / "cni" / "net.d"
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
                    "dataDir": str(workdir / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    (cni_conf / "10-schedlock.conflist").write_text(json.dumps(conflist, indent=2))
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    config = f"""version = 2
root = "{d / "root"}"
state = "{d / "state"}"
# Snapshotters this node does not use would only probe the host at start.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"

[{cri}]
  sandbox_image = "{sandbox_image}"
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


def kubelet_config(
    api: KubeAPIServer, workdir: Path, kubelet_dir: Path, socket: Path, node_name: str
) -> Path:
    """kubelet's KubeletConfiguration, with a serving cert for HOST_IP issued by API's CA."""
    (port,) = _free_ports(1)
    serving_cert, serving_key = api.issue_cert(
        "kubelet-serving",
        f"system:node:{node_name}",
        "system:nodes",
        server_hosts=[HOST_IP, node_name, "127.0.0.1"],
    )
    kubelet_dir.mkdir(parents=True, exist_ok=True)
    resolv = kubelet_dir / "resolv.conf"
    resolv.write_text("# no host resolvers: pods resolve cluster names only\n")
    endpoint = f"unix://{socket}"
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
        "containerRuntimeEndpoint": endpoint,
        "imageServiceEndpoint": endpoint,
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,
        "podLogsDir": str(workdir / "pod-logs"),
        "volumePluginDir": str(workdir / "volume-plugins"),
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
    path = workdir / "kubelet.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def kube_proxy_config(workdir: Path, kubeconfig: Path, node_name: str) -> Path:
    """kube-proxy's KubeProxyConfiguration: iptables mode, host sysctls left alone."""
    healthz, metrics = _free_ports(2)
    proxy_config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        "hostnameOverride": node_name,
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
    path = workdir / "kube-proxy.yaml"
    path.write_text(yaml.safe_dump(proxy_config))
    return path
