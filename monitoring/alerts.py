"""schedlock's alerts, defined once and rendered as Prometheus rules and Grafana-managed rules.

Every alert is a *value* query (one series per alert instance, labelled by the lock key or the
sidecar), a comparison and a threshold. Prometheus evaluates ``<value> <op> <threshold>``;
Grafana runs the value query, reduces it (last) and applies the same comparison as a threshold
expression, so both systems alert on exactly the same PromQL.

Metric facts the expressions rely on (``sidecar/metrics.py``):

- every sidecar exports every series of each lock key from the start (``schedlock_leader`` is 0
  on followers), so a key's series disappear only when no sidecar of it is scraped any more;
- a scrape that fails (process killed or frozen, pod deleted) marks that sidecar's series stale
  at once, so instant vectors never see a dead sidecar's last value.

The ``for:`` durations assume a scrape interval of at most 30 s (the chart's PodMonitor) and
the default lease timings (``schedlock.core.timings``: the hand-over threshold derives from
them); ``docs/operations.md`` has the reasoning and a runbook per alert.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from schedlock.core.timings import DEFAULT_TIMINGS
from schedlock.sidecar.metrics import GAP_BUCKETS

RUNBOOK_BASE = "https://github.com/schedlock/schedlock/blob/main/docs/operations.md"
GROUP_NAME = "schedlock"
# Explicit, so `for:` means the same whatever the server's global evaluation_interval is.
EVALUATION_INTERVAL = "30s"

KEY = "scheduler, namespace, target"
KEY_TEXT = "{{ $labels.scheduler }}/{{ $labels.namespace }}/{{ $labels.target }}"

# A lock key that exported series within this window and exports none now is "absent".
ABSENT_LOOKBACK = "6h"
# Oldest due, unfinished row older than this (seconds) is overdue.
OVERDUE_SECONDS = 60
# A hand-over slower than this (seconds) is beyond the designed worst case of the default timings
# (the lease after a frozen leader's last heartbeat, plus a heartbeat to take over), rounded up
# to a bucket bound of schedlock_handover_gap_seconds so the rule counts it exactly.
HANDOVER_GAP_SECONDS = min(b for b in GAP_BUCKETS if b >= DEFAULT_TIMINGS.handover_budget_seconds)
HANDOVER_WINDOW = "30m"
FAILURE_WINDOW = "15m"
REFUSED_WINDOW = "5m"
# The oldest finished row past its retention by more than this (seconds) means nothing prunes:
# a running pruner keeps it within about one prune interval (60 s) of the retention, and clears
# a backlog of millions of rows in minutes.
PRUNE_OVERDUE_SECONDS = 3600

GRAFANA_FOLDER = "schedlock"
# Grafana expands environment variables in provisioning files (not in annotations): the
# Grafana pod sets DS_PROMETHEUS to the uid of its Prometheus data source.
GRAFANA_DATASOURCE_UID = "${DS_PROMETHEUS}"

Severity = Literal["critical", "warning"]
NoDataState = Literal["OK", "Alerting", "NoData"]


def _le(seconds: float) -> str:
    """The ``le`` label value the Python client writes for a bucket bound (15 -> "15.0")."""
    return repr(float(seconds))


@dataclass(frozen=True)
class Alert:
    name: str
    severity: Severity
    value: str
    op: Literal[">", "<"]
    threshold: float
    for_: str
    summary: str
    description: str
    # Grafana's noDataState: what an empty result of the value query means. "Alerting" for the
    # leader rules: no series at all means no sidecar is scraped, which must page.
    grafana_no_data: NoDataState = "OK"

    @property
    def anchor(self) -> str:
        return self.name.lower()

    @property
    def runbook_url(self) -> str:
        return f"{RUNBOOK_BASE}#{self.anchor}"

    @property
    def expr(self) -> str:
        return f"{self.value} {self.op} {self.threshold:g}"

    @property
    def uid(self) -> str:
        words = re.findall(r"[A-Z][a-z]*", self.name.removeprefix("Schedlock"))
        return "schedlock-" + "-".join(w.lower() for w in words)

    def annotations(self, for_: str, value_variable: str = "$value") -> dict[str, str]:
        def fill(text: str) -> str:
            text = text.replace("{for}", for_)
            return re.sub(r"\$value\b", value_variable, text)

        return {
            "summary": fill(self.summary),
            "description": fill(self.description),
            "runbook_url": self.runbook_url,
        }


ALERTS: tuple[Alert, ...] = (
    Alert(
        name="SchedlockLeaderMissing",
        severity="critical",
        value=f"max by ({KEY}) (schedlock_leader)",
        op="<",
        threshold=1,
        # A crash hands over in milliseconds and a frozen leader is replaced after the lease;
        # Prometheus sees the new leader at its next scrape. With the chart's 30 s scrape and
        # the default lease that looks leaderless for at most ~40 s: two evaluations, never the
        # three in a row that one minute needs. A real outage still pages within ~1.5 minutes.
        for_="1m",
        summary=f"No schedlock leader for {KEY_TEXT}",
        description=(
            f"Sidecars report the lock key {KEY_TEXT} but none of them has led it for more "
            "than {for}: its due rows are not being fired."
        ),
        grafana_no_data="Alerting",
    ),
    Alert(
        name="SchedlockLeaderAbsent",
        severity="critical",
        # Number of sidecars exporting the key now; 0 for a key that exported within the
        # lookback but has no series any more (all sidecars gone, frozen or unscrapable).
        value=(
            "(\n"
            f"  count by ({KEY}) (schedlock_leader)\n"
            "or\n"
            f"  0 * group by ({KEY}) (last_over_time(schedlock_leader[{ABSENT_LOOKBACK}]))\n"
            ")"
        ),
        op="<",
        threshold=1,
        for_="1m",
        summary=f"No schedlock sidecar reports {KEY_TEXT}",
        description=(
            f"No sidecar has exported metrics for the lock key {KEY_TEXT} for more than "
            "{for} although one did within the last " + ABSENT_LOOKBACK + ": every sidecar of "
            "the target is gone, frozen, not ready or not scraped, so nothing fires its rows."
        ),
        grafana_no_data="Alerting",
    ),
    Alert(
        name="SchedlockMultipleLeaders",
        severity="critical",
        value=f"sum by ({KEY}) (schedlock_leader)",
        op=">",
        threshold=1,
        # A scrape can straddle a hand-over (old leader scraped before it let go, new one after
        # it took over) for at most one scrape interval; four scrapes in a row cannot.
        for_="1m",
        summary=f"{{{{ $value }}}} schedlock leaders for {KEY_TEXT}",
        description=(
            "{{ $value }} sidecars have reported that they lead the lock key "
            f"{KEY_TEXT} for more than {{for}}. The advisory lock admits one holder per "
            "database, so sidecars of this key are most likely using different databases: "
            "rows may fire twice."
        ),
    ),
    Alert(
        name="SchedlockLockHeldByForeignRole",
        severity="critical",
        # The key's leader (trying the key's lock) or its target's standbys (waiting for the
        # leadership lock) say 1 within a second: lock squatting.  A minute
        # lets a brief holder pass (an admin's look would not count: it serves every namespace).
        value=f"max by ({KEY}) (schedlock_lock_foreign_holder)",
        op=">",
        threshold=0,
        for_="1m",
        summary=f"The lock of {KEY_TEXT} is held by a role that may not serve its namespace",
        description=(
            f"For more than {{for}}, the sidecars of {KEY_TEXT} have seen its advisory lock "
            "held by a database session whose login role may not serve the namespace (lock "
            "squatting: advisory locks have no ACL, so a leaked credential of another namespace "
            "can hold it). No sidecar can lead the key: its rows wait. `schedlock status` and "
            "the sidecars' /readyz name the role and its backend pid."
        ),
    ),
    Alert(
        name="SchedlockBacklogOverdue",
        severity="warning",
        value=f"max by ({KEY}) (schedlock_oldest_due_age_seconds)",
        op=">",
        threshold=OVERDUE_SECONDS,
        for_="2m",
        summary=f"schedlock rows of {KEY_TEXT} are overdue",
        description=(
            f"The oldest due, unfinished row of {KEY_TEXT} has waited "
            "{{ $value | humanizeDuration }} (more than "
            f"{OVERDUE_SECONDS}s for over {{for}}): the leader is not keeping up, or deliveries "
            "to the app hang."
        ),
    ),
    Alert(
        name="SchedlockFiresFailing",
        severity="warning",
        value=(
            f"sum by ({KEY}) (\n"
            '  increase(schedlock_fires_total{outcome=~"failed|missed"}'
            f"[{FAILURE_WINDOW}])\n"
            ")"
        ),
        op=">",
        threshold=0,
        for_="0s",
        summary=f"schedlock rows of {KEY_TEXT} failed or were missed",
        description=(
            f"Rows of {KEY_TEXT} ended failed or missed in the last {FAILURE_WINDOW} (about "
            '{{ printf "%.0f" $value }}): the app refused them or kept failing them up to '
            "their attempt limit, or they were past their starting deadline."
        ),
    ),
    Alert(
        name="SchedlockHandoverGapHigh",
        severity="warning",
        # Hand-overs whose leaderless gap exceeded the bound: all of them minus those in the
        # bucket le=bound. Exact at the bound, no quantile interpolation over rare events.
        value=(
            "(\n"
            f"  sum by ({KEY}) (increase(schedlock_handover_gap_seconds_count"
            f"[{HANDOVER_WINDOW}]))\n"
            "-\n"
            f"  sum by ({KEY}) (increase(schedlock_handover_gap_seconds_bucket"
            f'{{le="{_le(HANDOVER_GAP_SECONDS)}"}}[{HANDOVER_WINDOW}]))\n'
            ")"
        ),
        op=">",
        threshold=0,
        for_="0s",
        summary=f"Slow schedlock hand-over for {KEY_TEXT}",
        description=(
            f"Hand-overs of {KEY_TEXT} in the last {HANDOVER_WINDOW} left the key without a "
            f"leader for more than {HANDOVER_GAP_SECONDS}s (about "
            '{{ printf "%.0f" $value }}); a crashed leader is replaced in under a second plus '
            "a heartbeat, a frozen one after the lease: no replica was waiting, or the "
            "database was unreachable."
        ),
    ),
    Alert(
        name="SchedlockDatabaseDown",
        severity="warning",
        value="schedlock_database_up",
        op="<",
        threshold=1,
        for_="1m",
        summary="schedlock sidecar {{ $labels.pod }} cannot use its database",
        description=(
            "Sidecar {{ $labels.pod }} ({{ $labels.instance }}, namespace "
            "{{ $labels.namespace }}) has reported schedlock_database_up 0 for more than "
            "{for}: it is not ready and does not compete for any lock."
        ),
    ),
    Alert(
        name="SchedlockDatabaseConnectionsRefused",
        severity="warning",
        # Refusals in every 5-minute window for 10 minutes: a database that stays full, not
        # one refused check while the app's pool briefly peaked.
        value=(
            "sum by (namespace, pod) "
            f"(increase(schedlock_database_connections_refused_total[{REFUSED_WINDOW}]))"
        ),
        op=">",
        threshold=0,
        for_="10m",
        summary="The database refuses schedlock sidecar {{ $labels.pod }} for lack of slots",
        description=(
            "The database has refused connections of sidecar {{ $labels.pod }} (namespace "
            "{{ $labels.namespace }}) for lack of connection slots (too many clients) in every "
            f"{REFUSED_WINDOW} for more than " + "{for}: it is full. The sidecar holds no "
            "session and backs off, and leaders keep theirs, but a key whose leader and "
            "standbys are lost now cannot be taken over, and the app's own pool is at the limit."
        ),
    ),
    Alert(
        name="SchedlockHistoryNotPruned",
        severity="warning",
        # Each sidecar that contends for the pruning lease exports the database's oldest row per
        # finished state and the retention it prunes by (0: kept forever, left out by `> 0`);
        # the same on every contender, so max() over them is the database's.
        value=(
            "max by (state) (\n"
            "  schedlock_history_oldest_finished_age_seconds\n"
            "  - (schedlock_history_retention_seconds > 0)\n"
            ")"
        ),
        op=">",
        threshold=PRUNE_OVERDUE_SECONDS,
        for_="30m",
        summary="schedlock history of {{ $labels.state }} rows is not being pruned",
        description=(
            "The oldest {{ $labels.state }} row in the schedlock tables is "
            "{{ $value | humanizeDuration }} past its retention (more than "
            f"{PRUNE_OVERDUE_SECONDS // 60} minutes for over " + "{for}): no process holds "
            "the pruning lease and prunes (every process lacks the privileges, the retention "
            "is off everywhere but here, or the pruner fails), so the table only grows."
        ),
    ),
)


def _for(alert: Alert, for_override: str | None) -> str:
    if for_override is not None and alert.for_ != "0s":
        return for_override
    return alert.for_


def prometheus_rule(alert: Alert, for_override: str | None = None) -> dict[str, Any]:
    for_ = _for(alert, for_override)
    rule: dict[str, Any] = {"alert": alert.name, "expr": alert.expr}
    if for_ != "0s":
        rule["for"] = for_
    rule["labels"] = {"severity": alert.severity}
    rule["annotations"] = alert.annotations(for_)
    return rule


def prometheus_rules(
    for_override: str | None = None, interval: str = EVALUATION_INTERVAL
) -> dict[str, Any]:
    """The Prometheus rules file. ``for_override`` replaces every non-zero ``for:`` (tests)."""
    return {
        "groups": [
            {
                "name": GROUP_NAME,
                "interval": interval,
                "rules": [prometheus_rule(a, for_override) for a in ALERTS],
            }
        ]
    }


_GRAFANA_EVALUATOR = {">": "gt", "<": "lt"}


def grafana_rule(alert: Alert, datasource_uid: str = GRAFANA_DATASOURCE_UID) -> dict[str, Any]:
    """A Grafana-managed rule: A = the value query, B = last of A, C = B <op> threshold."""
    return {
        "uid": alert.uid,
        "title": alert.name,
        "condition": "C",
        "data": [
            {
                "refId": "A",
                "relativeTimeRange": {"from": 600, "to": 0},
                "datasourceUid": datasource_uid,
                "model": {
                    "refId": "A",
                    "expr": alert.value,
                    "instant": True,
                    "range": False,
                    "intervalMs": 1000,
                    "maxDataPoints": 43200,
                },
            },
            {
                "refId": "B",
                "relativeTimeRange": {"from": 0, "to": 0},
                "datasourceUid": "__expr__",
                "model": {
                    "refId": "B",
                    "type": "reduce",
                    "expression": "A",
                    "reducer": "last",
                    "datasource": {"type": "__expr__", "uid": "__expr__"},
                },
            },
            {
                "refId": "C",
                "relativeTimeRange": {"from": 0, "to": 0},
                "datasourceUid": "__expr__",
                "model": {
                    "refId": "C",
                    "type": "threshold",
                    "expression": "B",
                    "conditions": [
                        {
                            "evaluator": {
                                "type": _GRAFANA_EVALUATOR[alert.op],
                                "params": [alert.threshold],
                            }
                        }
                    ],
                    "datasource": {"type": "__expr__", "uid": "__expr__"},
                },
            },
        ],
        "noDataState": alert.grafana_no_data,
        "execErrState": "Error",
        "for": alert.for_,
        "labels": {"severity": alert.severity},
        "annotations": alert.annotations(alert.for_, value_variable="$values.B.Value"),
        "isPaused": False,
    }


def grafana_alerts(
    datasource_uid: str = GRAFANA_DATASOURCE_UID, interval: str = EVALUATION_INTERVAL
) -> dict[str, Any]:
    """Grafana alerting provisioning file (apiVersion 1) with every alert as a managed rule."""
    return {
        "apiVersion": 1,
        "groups": [
            {
                "orgId": 1,
                "name": GROUP_NAME,
                "folder": GRAFANA_FOLDER,
                "interval": interval,
                "rules": [grafana_rule(a, datasource_uid) for a in ALERTS],
            }
        ],
    }
