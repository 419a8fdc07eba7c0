"""The pinned helm, run as a cluster's admin with a HOME of its own (config, cache, discovery)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from testbed.tools import tool

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "schedlock"


class HelmError(subprocess.CalledProcessError):
    """A helm call failed; str() shows what helm said."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


class Helm:
    """``helm(...)`` runs the pinned helm against KUBECONFIG.

    The HOME is private so no developer's repositories, plugins or cached discovery of some
    earlier API server on a reused port change what a test sees.
    """

    def __init__(self, kubeconfig: Path, home: Path, *, timeout: float = 300) -> None:
        self.kubeconfig = kubeconfig
        self.home = home
        self.timeout = timeout
        home.mkdir(parents=True, exist_ok=True)

    def __call__(self, *args: object, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("HELM_", "KUBECONFIG"))},
            "HOME": str(self.home),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        command = [str(tool("helm")), *(str(a) for a in args), "--kubeconfig", str(self.kubeconfig)]
        result = subprocess.run(
            command, env=env, capture_output=True, text=True, check=False, timeout=self.timeout
        )
        if check and result.returncode != 0:
            raise HelmError(result.returncode, command, result.stdout, result.stderr)
        return result
