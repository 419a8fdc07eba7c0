"""The dashboard and the Grafana-managed alert rules, read by Grafana's own typed models
(grafana-foundation-sdk): what the chart ships passes, and a field or value Grafana would not
take is refused with its path."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from monitoring import alerts, dashboard, generate
from monitoring.grafana_schema import GrafanaSchemaError, check_alert_rules, check_dashboard


def test_the_shipped_dashboard_and_alert_rules_pass() -> None:
    check_dashboard(json.loads(generate.GRAFANA_DASHBOARD.read_text()))
    check_alert_rules(yaml.safe_load(generate.GRAFANA_ALERTS.read_text()))


def _panel(board: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(p for p in board["panels"] if p["type"] == kind)


def _misspelled_title(board: dict[str, Any]) -> None:
    panel = _panel(board, "timeseries")
    panel["titel"] = panel.pop("title")


def _width_as_text(board: dict[str, Any]) -> None:
    _panel(board, "timeseries")["gridPos"]["w"] = "8"


def _unknown_line_style(board: dict[str, Any]) -> None:
    _panel(board, "timeseries")["fieldConfig"]["defaults"]["custom"]["drawStyle"] = "wiggly"


def _grafana_10_tooltip(board: dict[str, Any]) -> None:
    _panel(board, "heatmap")["options"]["tooltip"] = {"show": True}


def _bad_cursor_sync(board: dict[str, Any]) -> None:
    board["graphTooltip"] = 7


def _rule(provisioning: dict[str, Any]) -> dict[str, Any]:
    rule: dict[str, Any] = provisioning["groups"][0]["rules"][0]
    return rule


def _model(provisioning: dict[str, Any], query: int) -> dict[str, Any]:
    model: dict[str, Any] = _rule(provisioning)["data"][query]["model"]
    return model


Spoil = Callable[[dict[str, Any]], object]

_DASHBOARD_SPOILS: list[tuple[str, Spoil, str]] = [
    ("misspelled-field", _misspelled_title, ".titel: not a field"),
    ("wrong-type", _width_as_text, ".grid_pos.w: '8' is not a"),
    ("unknown-enum-value", _unknown_line_style, ".custom.draw_style: 'wiggly' is not a"),
    ("unknown-nested-field", _grafana_10_tooltip, ".options.tooltip.show: not a field"),
    ("int-enum", _bad_cursor_sync, "dashboard.graph_tooltip: 7 is not a"),
]
_RULE_SPOILS: list[tuple[str, Spoil, str]] = [
    ("bad-literal", lambda p: _rule(p).update(noDataState="Silence"), ".no_data_state: 'Silence'"),
    ("misspelled-field", lambda p: _rule(p).update(execErrorState="OK"), ".execErrorState: not a"),
    ("wrong-label-type", lambda p: _rule(p).update(labels={"severity": 1}), "{'severity': 1}"),
    ("unknown-prometheus-field", lambda p: _model(p, 0).update(exprs="up"), ".exprs: not a"),
    ("wrong-prometheus-type", lambda p: _model(p, 0).update(instant="yes"), ".instant: 'yes'"),
    ("unknown-reducer", lambda p: _model(p, 1).update(reducer="average"), "r: 'average'"),
    ("unknown-expression", lambda p: _model(p, 2).update(type="guess"), "not one of Grafana's"),
    ("unknown-group-field", lambda p: p["groups"][0].update(folderUid="x"), "folderUid: not a"),
]


@pytest.mark.parametrize(
    ("check", "document", "spoil", "where"),
    [
        *(
            pytest.param(check_dashboard, dashboard.dashboard, spoil, where, id=f"dashboard-{name}")
            for name, spoil, where in _DASHBOARD_SPOILS
        ),
        *(
            pytest.param(check_alert_rules, alerts.grafana_alerts, spoil, where, id=f"rules-{name}")
            for name, spoil, where in _RULE_SPOILS
        ),
    ],
)
def test_a_field_grafana_would_refuse_is_refused_with_its_path(
    check: Callable[[dict[str, Any]], None],
    document: Callable[[], dict[str, Any]],
    spoil: Spoil,
    where: str,
) -> None:
    original = document()
    check(original)  # the generated document passes: only the spoiled field fails
    spoiled = copy.deepcopy(original)
    spoil(spoiled)
    with pytest.raises(GrafanaSchemaError, match=r"(?s)refuse it:.*" + re.escape(where)):
        check(spoiled)
