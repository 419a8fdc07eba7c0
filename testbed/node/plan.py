"""The node's address plan and the fixed places it uses on the host.

- pods: ``POD_CIDR`` on the bridge ``BRIDGE``, whose gateway ``HOST_IP`` is the node's
  InternalIP, the API server's advertise address, and where pods reach host processes.
- Services: ``SERVICE_CIDR``; ``kubernetes`` is ``KUBERNETES_SERVICE_IP``, ``kube-dns`` is
  ``DNS_SERVICE_IP``; names resolve under ``CLUSTER_DOMAIN``.
- Nothing in a pod reaches beyond this host (no CoreDNS ``forward``, an empty resolv.conf, a
  FORWARD rule dropping what leaves the bridge for another interface).
"""

from __future__ import annotations

from pathlib import Path

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
# Host commands run with this PATH, whatever the caller's.
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
