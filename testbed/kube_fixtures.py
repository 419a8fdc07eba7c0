"""pytest fixtures for the real test API server (loaded through `pytest_plugins`).

One API server serves the whole session: starting one costs seconds, and tests isolate
themselves by namespace (`kube_namespace`) instead.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.kube import KubeAPIServer, KubeToolsMissingError

__all__ = ["kube", "kube_namespace"]


def _new_server(workdir: Path) -> KubeAPIServer:
    """Build the server or fail (outside the except block, so the report shows one message)."""
    try:
        return KubeAPIServer(workdir)
    except KubeToolsMissingError as error:
        message = str(error)
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeAPIServer]:
    """A started etcd + kube-apiserver with RBAC on, shared by the session.

    Missing binaries fail the tests rather than skip them: a skipped integration suite looks
    green while testing nothing.
    """
    server = _new_server(tmp_path_factory.mktemp("kube"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kube_namespace(kube: KubeAPIServer) -> Iterator[str]:
    """A fresh, uniquely named namespace, deleted afterwards.

    The delete is fired without waiting: no namespace controller runs, so the namespace stays
    Terminating forever; its unique name keeps that from mattering.
    """
    name = f"t-{uuid.uuid4().hex[:10]}"
    kube.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        kube.kubectl("delete", "namespace", name, "--wait=false", check=False)
