"""pytest fixtures for the real single-node cluster (loaded through `pytest_plugins`).

One cluster serves the whole session: a cold start takes about twelve seconds, and tests
isolate themselves by namespace (`cluster_namespace`) instead. Missing binaries or packages
fail the tests with the command that installs them; they never skip, because a skipped
cluster suite looks green while testing nothing.

Only one cluster can run on a host at a time (kube-proxy's rules and the bridge are
host-wide). A test that needs the host with no cluster on it, to start its own, asks for
`cluster_free_host`: the session cluster, if it was started, is stopped for that test and
started again afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.cluster import Cluster
from testbed.node.errors import ClusterPrerequisiteMissing
from testbed.node.prerequisites import check_prerequisites
from testbed.oci import ImageBuildError, probe_image

__all__ = ["cluster", "cluster_free_host", "cluster_namespace", "probe"]

_SESSION: dict[str, Cluster] = {}


def require_node_prerequisites() -> None:
    """Fail (not skip) the test with one clear line when the node cannot run here."""
    try:
        check_prerequisites()
    except ClusterPrerequisiteMissing as error:
        message = str(error)
    else:
        return
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A started single-node cluster (CoreDNS Ready), shared by the session."""
    require_node_prerequisites()
    node = Cluster(tmp_path_factory.mktemp("cluster"))
    node.start()
    _SESSION["cluster"] = node
    try:
        yield node
    finally:
        _SESSION.pop("cluster", None)
        node.stop()


@pytest.fixture
def cluster_namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace whose default ServiceAccount exists; deleted (not awaited) after."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    cluster.create_namespace(name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def cluster_free_host() -> Iterator[None]:
    """No cluster runs on the host during the test, and none left its changes behind (a run
    killed with its cluster up, on a machine CI shares); the session one comes back after."""
    require_node_prerequisites()
    session = _SESSION.get("cluster")
    if session is not None:
        session.stop()
    try:
        Cluster.reclaim_host()
        yield
    finally:
        if session is not None:
            session.start()


CLUSTER_TESTS = Path(__file__).resolve().parents[1] / "tests" / "cluster"


def _in_cluster_tests(item: pytest.Item | None) -> bool:
    return item is not None and CLUSTER_TESTS in item.path.parents


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the session cluster once the run leaves tests/cluster (after the module fixtures
    built on it are torn down: trylast), so the rest of the suite has the host to itself —
    the node's CPU, and its bridge and rules for tests that start clusters of their own."""
    if _in_cluster_tests(item) and not _in_cluster_tests(nextitem):
        session = _SESSION.pop("cluster", None)
        if session is not None:
            session.stop()


@pytest.fixture(scope="session")
def probe(cluster: Cluster) -> str:
    """The network probe image (``hack/node/probe``), imported into the cluster; its ref."""
    try:
        image = probe_image()
    except ImageBuildError as error:
        message = str(error)
    else:
        cluster.import_image(image.archive)
        return image.ref
    pytest.fail(message, pytrace=False)
