"""Grafana's own typed models as the schema of what the chart ships to Grafana.

No Grafana build is available here, so the dashboard and the Grafana-managed alert rules are
loaded into the models Grafana generates from its own schemas (``grafana-foundation-sdk``, the
version pinned in pyproject.toml) and checked strictly, as Grafana would read them:

- every field must be one the model knows: a field the model drops on the way in (unknown or
  misspelled) is an error, and so is a value the model reads back differently;
- every value must have the model's type (``Literal`` and enum values included).

Run from the repository root (``make lint`` does)::

    .venv/bin/python -m monitoring.grafana_schema   # checks the files in charts/schedlock/files/
"""

from __future__ import annotations

import enum
import json
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import alerting, prometheus
from grafana_foundation_sdk.models import dashboard as dashboard_models

plugins.register_default_plugins()

REPO = Path(__file__).resolve().parents[1]
FILES = REPO / "charts" / "schedlock" / "files"

# Grafana's alerting provisioning file (apiVersion 1): the file's own envelope around the rules,
# which the SDK models in the API's shape (orgID, folderUID, ruleGroup on every rule).
_FILE_KEYS = {"apiVersion", "groups"}
_GROUP_KEYS = {"orgId", "name", "folder", "interval", "rules"}
# Keys Grafana's alert query reads from every data source's model besides the query itself.
_ALERT_QUERY_KEYS = {"intervalMs", "maxDataPoints"}


class GrafanaSchemaError(ValueError):
    """What Grafana's models refuse, one problem per line."""


def _encoded(model: object) -> Any:
    return json.loads(JSONEncoder(sort_keys=True).encode(model))


def _differences(given: Any, read: Any, path: str) -> Iterator[str]:
    """Where the model's reading of GIVEN lost or changed something (extra defaults are fine)."""
    if isinstance(given, dict) and isinstance(read, dict):
        for key, value in given.items():
            if key not in read:
                yield f"{path}.{key}: not a field of Grafana's model (unknown or misspelled)"
            else:
                yield from _differences(value, read[key], f"{path}.{key}")
    elif isinstance(given, list) and isinstance(read, list) and len(given) == len(read):
        for index, (a, b) in enumerate(zip(given, read, strict=True)):
            yield from _differences(a, b, f"{path}[{index}]")
    elif given != read or type(given) is not type(read):
        yield f"{path}: {given!r} is read by Grafana's model as {read!r}"


def _fits(value: Any, hint: Any) -> bool:
    """Whether VALUE has the type HINT (a resolved annotation of a model's constructor)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any or hint is object:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if origin is typing.Literal:
        return value in args
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            _fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items()
        )
    if hint is type(None):
        return value is None
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return isinstance(value, hint) or value in {m.value for m in hint}
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a hint this checker does not model (a TypeVar…): the round trip still applies


def _type_errors(model: object, path: str) -> Iterator[str]:
    """Every attribute of MODEL (and of the models inside it) checked against its type."""
    if isinstance(model, list):
        for index, item in enumerate(model):
            yield from _type_errors(item, f"{path}[{index}]")
        return
    if isinstance(model, dict):
        for key, item in model.items():
            yield from _type_errors(item, f"{path}.{key}")
        return
    if not type(model).__module__.startswith("grafana_foundation_sdk.models"):
        return
    module = sys.modules[type(model).__module__]
    hints = typing.get_type_hints(type(model).__init__, vars(module))
    for name, hint in hints.items():
        if name == "return":
            continue
        value = getattr(model, name)
        if not _fits(value, hint):
            yield f"{path}.{name}: {value!r} is not a {hint}"
        yield from _type_errors(value, f"{path}.{name}")


def _problems(model: object, given: Any, path: str) -> list[str]:
    return [*_type_errors(model, path), *_differences(given, _encoded(model), path)]


def _raise(problems: list[str], what: str) -> None:
    if problems:
        raise GrafanaSchemaError(f"{what}: Grafana's models refuse it:\n" + "\n".join(problems))


def check_dashboard(board: dict[str, Any]) -> None:
    """Raise GrafanaSchemaError unless Grafana's dashboard model reads BOARD exactly."""
    model = dashboard_models.Dashboard.from_json(board)
    _raise(_problems(model, board, "dashboard"), "the dashboard")


def _query_model(query: dict[str, Any], path: str) -> list[str]:
    """The model of one alert query: a server-side expression or a Prometheus query."""
    model = query.get("model")
    if not isinstance(model, dict):
        return [f"{path}.model: missing"]
    if query.get("datasourceUid") == "__expr__":
        try:
            parsed: object = cogruntime.dataquery_from_json(model, "__expr__")
        except KeyError:
            return [f"{path}.model.type: not one of Grafana's expressions: {model.get('type')!r}"]
    else:
        parsed = prometheus.Dataquery.from_json(model)
    rest = {k: v for k, v in model.items() if k not in _ALERT_QUERY_KEYS}
    problems = _problems(parsed, rest, f"{path}.model")
    for key in _ALERT_QUERY_KEYS & model.keys():
        if not isinstance(model[key], int) or isinstance(model[key], bool):
            problems.append(f"{path}.model.{key}: {model[key]!r} is not an int")
    return problems


def check_alert_rules(provisioning: dict[str, Any]) -> None:
    """Raise GrafanaSchemaError unless every rule of the provisioning file fits Grafana's Rule."""
    problems = [
        f"{k}: not a field of the provisioning file" for k in provisioning.keys() - _FILE_KEYS
    ]
    if provisioning.get("apiVersion") != 1:
        problems.append(f"apiVersion: {provisioning.get('apiVersion')!r}, not 1")
    for g, group in enumerate(provisioning.get("groups", [])):
        where = f"groups[{g}]"
        problems += [
            f"{where}.{k}: not a field of a rule group" for k in group.keys() - _GROUP_KEYS
        ]
        for r, rule in enumerate(group.get("rules", [])):
            path = f"{where}.rules[{r}]"
            # The API's shape of the same rule: the group's fields on the rule itself.
            api = {
                **rule,
                "orgID": group["orgId"],
                "folderUID": group["folder"],
                "ruleGroup": group["name"],
            }
            # The queries' models are read by their data source's model below.
            api["data"] = [{k: v for k, v in q.items() if k != "model"} for q in rule["data"]]
            problems += _problems(alerting.Rule.from_json(api), api, path)
            for q, query in enumerate(rule.get("data", [])):
                problems += _query_model(query, f"{path}.data[{q}]")
    _raise(problems, "the Grafana alert rules")


def main() -> int:
    try:
        check_dashboard(json.loads((FILES / "grafana-dashboard.json").read_text()))
        check_alert_rules(yaml.safe_load((FILES / "grafana-alerts.yaml").read_text()))
    except GrafanaSchemaError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
