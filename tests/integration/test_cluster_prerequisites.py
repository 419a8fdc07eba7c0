"""A node that cannot run here says what is missing and how to get it, at once, touching nothing.

The tool cache is pointed at an empty directory, as on a machine where `make tools` never ran:
`check_prerequisites` and `Cluster.start` must name the missing binaries and the command that
builds them, before any process starts or any host state changes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testbed.cluster import Cluster
from testbed.node.errors import ClusterPrerequisiteMissing
from testbed.node.plan import HOST_REGISTRY
from testbed.node.prerequisites import check_prerequisites


def test_missing_node_tools_are_named_with_the_command_that_builds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCHEDLOCK_TOOLS_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ClusterPrerequisiteMissing) as raised:
        check_prerequisites()
    message = str(raised.value)
    for tool in ("kubelet", "kube-proxy", "coredns"):
        assert tool in message, message
    assert "bash hack/tools.sh ensure node" in message


def test_a_cluster_that_cannot_start_fails_fast_and_leaves_no_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCHEDLOCK_TOOLS_CACHE", str(tmp_path / "empty-cache"))
    registered = HOST_REGISTRY.exists()
    node = Cluster(tmp_path / "node")
    # The prerequisite error itself, not a timeout: nothing was started and waited for.
    with pytest.raises(ClusterPrerequisiteMissing, match=re.escape("hack/tools.sh ensure node")):
        node.start()
    assert not node.state_file.exists(), "host state was captured for a node that never ran"
    assert HOST_REGISTRY.exists() == registered
    assert not node.running
