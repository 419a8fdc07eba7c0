"""The "schedlock" Grafana dashboard as code (plain dicts, no grafanalib).

Every panel query filters on the dashboard variables with regex matchers
(``namespace=~"$namespace"``), so "All" (``.*``) and multi-value selections both work, and
every query returns data while sidecars run (tests/e2e/test_prometheus.py checks that against
a real Prometheus).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

UID = "schedlock-overview"
TITLE = "schedlock"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# Lock-key selector: the key metrics carry scheduler, namespace and target.
SEL = 'scheduler=~"$scheduler", namespace=~"$namespace", target=~"$target"'
# Sidecar-wide metrics (database_up, build_info) carry only the scrape's namespace and pod.
SIDECAR_SEL = 'namespace=~"$namespace"'
KEY = "scheduler, namespace, target"
KEY_LEGEND = "{{scheduler}}/{{namespace}}/{{target}}"


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-variable"},
        "refresh": 2,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "sort": 1,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "hide": 0,
        "regex": "",
    }


def variables() -> list[dict[str, Any]]:
    return [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "options": [],
            "refresh": 1,
            "hide": 0,
            "regex": "",
            "includeAll": False,
            "multi": False,
        },
        _variable("namespace", "Namespace", "label_values(schedlock_leader, namespace)"),
        _variable(
            "target",
            "Target",
            'label_values(schedlock_leader{namespace=~"$namespace"}, target)',
        ),
        _variable(
            "scheduler",
            "Scheduler",
            'label_values(schedlock_leader{namespace=~"$namespace", target=~"$target"}, scheduler)',
        ),
    ]


def _target(expr: str, legend: str, ref: str = "A", **extra: Any) -> dict[str, Any]:
    return {
        "datasource": DATASOURCE,
        "expr": expr,
        "legendFormat": legend,
        "range": True,
        "refId": ref,
        **extra,
    }


def _thresholds(*steps: tuple[float | None, str]) -> dict[str, Any]:
    return {"mode": "absolute", "steps": [{"value": v, "color": c} for v, c in steps]}


def _panel(
    kind: str,
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    unit: str = "short",
    custom: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    thresholds: dict[str, Any] | None = None,
    mappings: list[dict[str, Any]] | None = None,
    color: dict[str, Any] | None = None,
) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit, "custom": custom or {}}
    defaults["thresholds"] = thresholds or _thresholds((None, "green"))
    if mappings is not None:
        defaults["mappings"] = mappings
    if color is not None:
        defaults["color"] = color
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options or {},
    }


def _timeseries(
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    unit: str = "short",
    stacked: bool = False,
    bars: bool = False,
    thresholds: dict[str, Any] | None = None,
) -> dict[str, Any]:
    custom: dict[str, Any] = {
        "drawStyle": "bars" if bars else "line",
        "lineWidth": 1,
        "fillOpacity": 30 if (stacked or bars) else 10,
        "showPoints": "auto",
        "spanNulls": False,
        "stacking": {"mode": "normal" if stacked else "none", "group": "A"},
    }
    if thresholds is not None:
        custom["thresholdsStyle"] = {"mode": "line"}
    return _panel(
        "timeseries",
        title,
        description,
        targets,
        unit=unit,
        custom=custom,
        thresholds=thresholds,
        options={
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    )


def _state_timeline(
    title: str,
    description: str,
    target: dict[str, Any],
    states: tuple[tuple[str, str], tuple[str, str]],
    **options: Any,
) -> dict[str, Any]:
    """A 0/1 metric per series as a timeline: STATES are the (text, color) of 0 and of 1."""
    (off, off_color), (on, on_color) = states
    return _panel(
        "state-timeline",
        title,
        description,
        [target],
        options={
            "showValue": "never",
            "mergeValues": True,
            **options,
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False},
        },
        mappings=[
            {
                "type": "value",
                "options": {
                    "0": {"text": off, "color": off_color, "index": 0},
                    "1": {"text": on, "color": on_color, "index": 1},
                },
            }
        ],
        color={"mode": "thresholds"},
        thresholds=_thresholds((None, off_color), (1, on_color)),
    )


def _row(title: str) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def _quantiles(metric: str, window: str, by: str = KEY) -> list[dict[str, Any]]:
    return [
        _target(
            f"histogram_quantile({q}, sum by (le, {by}) "
            f"(rate({metric}_bucket{{{SEL}}}[{window}])))",
            f"p{round(q * 100)} {KEY_LEGEND}",
            ref=ref,
        )
        for q, ref in ((0.5, "A"), (0.99, "B"))
    ]


def panels() -> list[dict[str, Any]]:
    """Panels without ids or positions (``dashboard()`` lays them out)."""
    return [
        _row("Leadership"),
        _state_timeline(
            "Leader by pod",
            "schedlock_leader of every sidecar, per lock key: which pod led when. A gap in a "
            "row is a sidecar that was not scraped (gone, frozen, restarting).",
            _target(
                f"max by ({KEY}, pod) (schedlock_leader{{{SEL}}})",
                f"{KEY_LEGEND} {{{{pod}}}}",
            ),
            (("following", "transparent"), ("leading", "green")),
            rowHeight=0.8,
        ),
        _timeseries(
            "Leaders per key",
            "Sidecars reporting that they lead each key: must be exactly 1. 0 fires "
            "SchedlockLeaderMissing after 1m, more than 1 SchedlockMultipleLeaders.",
            [_target(f"sum by ({KEY}) (schedlock_leader{{{SEL}}})", KEY_LEGEND)],
            thresholds=_thresholds((None, "red"), (1, "green"), (2, "red")),
        ),
        _timeseries(
            "Sidecars per key",
            "Sidecars exporting each key (leader and waiting followers). 0 for a key seen "
            "before fires SchedlockLeaderAbsent.",
            [_target(f"count by ({KEY}) (schedlock_leader{{{SEL}}})", KEY_LEGEND)],
        ),
        _timeseries(
            "Term",
            "Leadership term of each key; it grows by one at every hand-over.",
            [_target(f"max by ({KEY}) (schedlock_term{{{SEL}}})", KEY_LEGEND)],
        ),
        _timeseries(
            "Leadership transitions",
            "Leadership changes by direction: acquired, lost (session died or stepped down), "
            "released (graceful hand-over on SIGTERM).",
            [
                _target(
                    "sum by (scheduler, direction) (increase("
                    f"schedlock_leadership_transitions_total{{{SEL}}}[$__rate_interval]))",
                    "{{scheduler}} {{direction}}",
                )
            ],
            bars=True,
        ),
        _timeseries(
            "Hand-over gap",
            "Leaderless time measured at each takeover (p50, p99): sub-second plus up to one "
            "heartbeat after a crash, the lease after a freeze. Over 15s fires "
            "SchedlockHandoverGapHigh.",
            _quantiles("schedlock_handover_gap_seconds", "$__rate_interval"),
            unit="s",
            thresholds=_thresholds((None, "green"), (15, "red")),
        ),
        _panel(
            "heatmap",
            "Hand-over gap distribution",
            "Hand-overs per gap bucket.",
            [
                _target(
                    "sum by (le) (increase("
                    f"schedlock_handover_gap_seconds_bucket{{{SEL}}}[$__rate_interval]))",
                    "{{le}}",
                    format="heatmap",
                )
            ],
            unit="s",
            options={
                "calculate": False,
                "yAxis": {"unit": "s"},
                "cellGap": 1,
                "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential"},
                "filterValues": {"le": 1e-9},
                "tooltip": {"mode": "single", "yHistogram": True},
            },
        ),
        _panel(
            "stat",
            "Hand-overs in range",
            "Takeovers in the selected time range, per key.",
            [
                _target(
                    "sum by (scheduler, namespace, target) (increase("
                    f"schedlock_handover_gap_seconds_count{{{SEL}}}[$__range]))",
                    KEY_LEGEND,
                    instant=True,
                    range=False,
                )
            ],
            options={
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "colorMode": "value",
                "graphMode": "none",
                "textMode": "value_and_name",
            },
        ),
        _row("Firing"),
        _timeseries(
            "Fire lateness",
            "Time from a row's due time to the request to the app (p50, p99).",
            _quantiles("schedlock_fire_lateness_seconds", "$__rate_interval"),
            unit="s",
        ),
        _timeseries(
            "Fire outcomes",
            "Outcomes per second: published (2xx), retry (scheduled again with backoff), "
            "failed, missed (past the starting deadline). Failed or missed fires "
            "SchedlockFiresFailing.",
            [
                _target(
                    "sum by (scheduler, outcome) (rate("
                    f"schedlock_fires_total{{{SEL}}}[$__rate_interval]))",
                    "{{scheduler}} {{outcome}}",
                )
            ],
            unit="ops",
            stacked=True,
        ),
        _timeseries(
            "Due backlog",
            "Rows due and not finished, as the leader saw them at its last heartbeat.",
            [_target(f"max by ({KEY}) (schedlock_due_backlog{{{SEL}}})", KEY_LEGEND)],
        ),
        _timeseries(
            "Oldest due age",
            "Age of the oldest due, unfinished row at the leader's last heartbeat. Over 60s "
            "for 2m fires SchedlockBacklogOverdue.",
            [_target(f"max by ({KEY}) (schedlock_oldest_due_age_seconds{{{SEL}}})", KEY_LEGEND)],
            unit="s",
            thresholds=_thresholds((None, "green"), (60, "red")),
        ),
        _timeseries(
            "Since the leader's last tick",
            "Seconds since the leader's last heartbeat or loop iteration (heartbeat every 3s "
            "by default).",
            [
                _target(
                    "time() - max by (scheduler, namespace, target) "
                    f"(schedlock_last_tick_timestamp_seconds{{{SEL}}})",
                    KEY_LEGEND,
                )
            ],
            unit="s",
        ),
        _row("Sidecars"),
        _state_timeline(
            "Database connected",
            "schedlock_database_up per sidecar pod of the selected namespaces.",
            _target(f"min by (pod) (schedlock_database_up{{{SIDECAR_SEL}}})", "{{pod}}"),
            (("down", "red"), ("up", "green")),
        ),
        _timeseries(
            "Database sessions",
            "Sessions the sidecars hold on the database, one per sidecar for both keys of its "
            "target: per target the leader and at most SCHEDLOCK_STANDBYS standbys, whatever "
            "the replica count.",
            [
                _target(
                    f"sum by (namespace) (schedlock_database_sessions{{{SIDECAR_SEL}}})",
                    "{{namespace}}",
                )
            ],
            stacked=True,
        ),
        _timeseries(
            "Roles per key",
            "Replicas per role and lock key: leader (1), standby (waits on its own session), "
            "reserve (no session, checks in turns for a free standby place).",
            [
                _target(
                    f"sum by ({KEY}, role) (schedlock_role{{{SEL}}})",
                    f"{KEY_LEGEND} {{{{role}}}}",
                )
            ],
        ),
        _timeseries(
            "Refused connections",
            "Connections the database refused for lack of slots (too many clients), per "
            "sidecar. Sustained for 10m fires SchedlockDatabaseConnectionsRefused.",
            [
                _target(
                    "sum by (pod) (rate(schedlock_database_connections_refused_total"
                    f"{{{SIDECAR_SEL}}}[$__rate_interval]))",
                    "{{pod}}",
                )
            ],
            unit="ops",
        ),
        _timeseries(
            "Versions",
            "Sidecars per schedlock version.",
            [
                _target(
                    f"count by (version) (schedlock_build_info{{{SIDECAR_SEL}}})",
                    "{{version}}",
                )
            ],
            stacked=True,
        ),
        _row("History"),
        _timeseries(
            "Oldest finished row",
            "Age of the database's oldest row per finished state, as the sidecars that contend "
            "for the pruning lease measure it; a running pruner keeps it near the retention. An "
            "hour past it for 30m fires SchedlockHistoryNotPruned.",
            [
                _target(
                    "max by (state) (schedlock_history_oldest_finished_age_seconds"
                    f"{{{SIDECAR_SEL}}})",
                    "{{state}}",
                ),
                _target(
                    f"max by (state) (schedlock_history_retention_seconds{{{SIDECAR_SEL}}} > 0)",
                    "retention {{state}}",
                    ref="B",
                ),
            ],
            unit="s",
        ),
        _timeseries(
            "Rows pruned",
            "Rows the elected pruner deleted, per table.",
            [
                _target(
                    "sum by (table) (rate(schedlock_history_pruned_rows_total"
                    f"{{{SIDECAR_SEL}}}[$__rate_interval]))",
                    "{{table}}",
                )
            ],
            unit="ops",
        ),
        _timeseries(
            "Table size",
            "Size on disk of each schedlock table, indexes and TOAST included (PostgreSQL).",
            [
                _target(
                    f"max by (table) (schedlock_history_table_bytes{{{SIDECAR_SEL}}})",
                    "{{table}}",
                )
            ],
            unit="bytes",
        ),
    ]


# (width, height) per panel kind, laid out left to right in a 24-column grid.
_SIZES = {"row": (24, 1), "state-timeline": (24, 8), "heatmap": (12, 8), "stat": (12, 8)}
_DEFAULT_SIZE = (12, 8)


# Narrower panels, by title (three to a row).
_WIDTHS = {
    "Leaders per key": 8,
    "Sidecars per key": 8,
    "Term": 8,
    "Due backlog": 8,
    "Oldest due age": 8,
    "Since the leader's last tick": 8,
    "Database connected": 16,
    "Versions": 8,
    "Database sessions": 8,
    "Roles per key": 8,
    "Refused connections": 8,
    "Oldest finished row": 8,
    "Rows pruned": 8,
    "Table size": 8,
}


def _layout(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    x = y = row_height = 0
    for panel_id, panel in enumerate(items, start=1):
        w, h = _SIZES.get(panel["type"], _DEFAULT_SIZE)
        w = _WIDTHS.get(panel["title"], w)
        if x + w > 24:
            x, y, row_height = 0, y + row_height, 0
        yield {"id": panel_id, "gridPos": {"h": h, "w": w, "x": x, "y": y}, **panel}
        x += w
        row_height = max(row_height, h)


def dashboard() -> dict[str, Any]:
    return {
        "uid": UID,
        "title": TITLE,
        "description": "schedlock: who leads each lock key, hand-overs, and whether anything "
        "fires late. Alerts and runbooks: docs/operations.md.",
        "tags": ["schedlock"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "links": [
            {
                "title": "Runbooks",
                "type": "link",
                "url": "https://github.com/schedlock/schedlock/blob/main/docs/operations.md",
                "targetBlank": True,
                "icon": "doc",
            }
        ],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                },
            ]
        },
        "templating": {"list": variables()},
        "panels": list(_layout(panels())),
    }


def queries(board: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every panel target, in panel order."""
    board = board or dashboard()
    return [
        (panel["title"], target["expr"])
        for panel in board["panels"]
        for target in panel.get("targets", [])
    ]
