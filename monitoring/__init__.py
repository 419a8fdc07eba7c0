"""schedlock's monitoring as code: alerts and the Grafana dashboard, one Python source.

Not part of the installed distribution. ``python -m monitoring.generate`` (from the repository
root) writes the files the Helm chart embeds under ``charts/schedlock/files/``:

- ``prometheus-rules.yaml``: a Prometheus rules file (``groups: [...]``), the body of the
  chart's PrometheusRule;
- ``grafana-alerts.yaml``: the same alerts as Grafana-managed rules (alerting provisioning,
  ``apiVersion: 1``);
- ``grafana-dashboard.json``: the "schedlock" dashboard (uid ``schedlock-overview``).

``--check`` exits 1 when a committed file differs from what the generator writes.
``python -m monitoring.grafana_schema`` reads the two Grafana files with Grafana's own typed
models (grafana-foundation-sdk) and fails on a field or value Grafana would not take.
"""
