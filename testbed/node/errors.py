"""The test node's errors: each message says what failed and carries the logs that explain it."""

from __future__ import annotations


class ClusterError(RuntimeError):
    """The cluster did not come up or a wait timed out; the message has the relevant logs."""


class ClusterPrerequisiteMissing(ClusterError):
    """Something the node needs is not installed; the message says what and how to install it."""


class ClusterBusy(ClusterError):
    """Another cluster already runs on this host (kube-proxy and the bridge are host-wide)."""
