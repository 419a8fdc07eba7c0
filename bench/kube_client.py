"""The official Kubernetes Python client, behind one seam: its functions carry no annotations,
so the harness reaches them as ``Any`` here instead of scattering ignores."""

from __future__ import annotations

import importlib
from typing import Any


def module(name: str) -> Any:
    """``kubernetes.<name>`` as an untyped module object."""
    return importlib.import_module(f"kubernetes.{name}")


def api_client(kubeconfig: str, pool_size: int | None = None) -> Any:
    """An ApiClient for ``kubeconfig`` (optionally with a larger connection pool)."""
    client, config = module("client"), module("config")
    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    if pool_size is not None:
        configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


def api_exception() -> type[Exception]:
    exc: type[Exception] = module("client.rest").ApiException
    return exc
