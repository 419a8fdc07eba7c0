"""A real Prometheus for tests: given scrape configs and rules, queried over its HTTP API.

``podmonitor_scrape_config`` turns the chart's PodMonitor into the scrape config the
prometheus-operator would generate for it (Kubernetes pod discovery, the same selectors and
relabelling), so a test proves what the chart declares is what gets scraped, without running
the operator.
"""

from __future__ import annotations

import json
import subprocess
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.pg import free_port
from testbed.procs import die_with_parent, terminate
from testbed.sidecars import http_get, wait_for


class PrometheusError(RuntimeError):
    pass


@dataclass
class Prometheus:
    binary: Path
    workdir: Path
    scrape_configs: list[dict[str, Any]]
    rules: str
    scrape_interval: str = "1s"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    def start(self) -> Prometheus:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "rules.yaml").write_text(self.rules)
        config = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": "800ms",
                "evaluation_interval": self.scrape_interval,
            },
            "rule_files": ["rules.yaml"],
            "scrape_configs": self.scrape_configs,
        }
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    str(self.binary),
                    f"--config.file={self.workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                cwd=self.workdir,
                stdout=log,
                stderr=log,
                preexec_fn=die_with_parent(),
            )
        wait_for(
            lambda: self._alive_or_fail() and http_get(f"{self.url}/-/ready")[0] == 200,
            timeout=30,
            interval=0.1,
            what="Prometheus to be ready",
        )
        return self

    def _alive_or_fail(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise PrometheusError(f"prometheus exited: {self.log_path.read_text()}")
        return True

    def api(self, path: str, **params: str) -> Any:
        status, body = http_get(f"{self.url}{path}?{urllib.parse.urlencode(params)}", timeout=5)
        assert status == 200, (path, params, body)
        payload = json.loads(body)
        assert payload["status"] == "success", payload
        return payload["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        return list(data["result"])

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.api("/api/v1/alerts")["alerts"])

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("/api/v1/targets")["activeTargets"])

    def stop(self) -> None:
        terminate(self.process)
        self.process = None


def static_scrape_config(targets: dict[str, int], namespace: str = "default") -> dict[str, Any]:
    """Host processes as targets, labelled as the PodMonitor labels pods (pod, namespace)."""
    return {
        "job_name": "schedlock",
        "honor_labels": True,
        "static_configs": [
            {"targets": [f"127.0.0.1:{port}"], "labels": {"pod": pod, "namespace": namespace}}
            for pod, port in targets.items()
        ],
    }


def _label_name(label: str) -> str:
    """A Kubernetes label as a Prometheus meta label name (``a.b/c-d`` -> ``a_b_c_d``)."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in label)


def podmonitor_scrape_config(
    podmonitor: dict[str, Any], kubeconfig: Path, interval: str | None = None
) -> dict[str, Any]:
    """The scrape config prometheus-operator generates for a PodMonitor with one endpoint.

    Supported: ``selector.matchLabels``, ``namespaceSelector.any``/``matchNames``, and an
    endpoint's ``port`` (by container port name), ``path``, ``interval`` and ``honorLabels``.
    Anything else in the PodMonitor raises, so a chart change this does not understand fails
    the test instead of being silently ignored.
    """
    meta, spec = podmonitor["metadata"], podmonitor["spec"]
    endpoints = spec["podMetricsEndpoints"]
    if len(endpoints) != 1:
        raise PrometheusError(f"one podMetricsEndpoint expected, got {endpoints}")
    endpoint = dict(endpoints[0])
    known = {"port", "path", "interval", "honorLabels"}
    if set(endpoint) - known or set(spec["selector"]) - {"matchLabels"}:
        raise PrometheusError(f"unsupported PodMonitor fields: {spec}")
    sd: dict[str, Any] = {"role": "pod", "kubeconfig_file": str(kubeconfig)}
    namespaces = spec.get("namespaceSelector") or {}
    if not namespaces.get("any"):
        sd["namespaces"] = {"names": list(namespaces.get("matchNames") or [meta["namespace"]])}
    relabel: list[dict[str, Any]] = [
        {
            "source_labels": [f"__meta_kubernetes_pod_label_{_label_name(k)}"],
            "regex": str(v),
            "action": "keep",
        }
        for k, v in spec["selector"].get("matchLabels", {}).items()
    ]
    relabel += [
        {
            "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": str(endpoint["port"]),
            "action": "keep",
        },
        # The operator drops pods that have finished: they can never be scraped again.
        {
            "source_labels": ["__meta_kubernetes_pod_phase"],
            "regex": "(Failed|Succeeded)",
            "action": "drop",
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
    ]
    config: dict[str, Any] = {
        "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/0",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "metrics_path": endpoint.get("path", "/metrics"),
        "kubernetes_sd_configs": [sd],
        "relabel_configs": relabel,
    }
    if interval or endpoint.get("interval"):
        config["scrape_interval"] = interval or endpoint["interval"]
    return config
