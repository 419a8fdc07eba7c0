"""The ScheduledPublish CRD on a real API server: what it accepts, refuses, and how it says so.

Every refusal is asserted on the text `kubectl apply` prints, because that text is the product:
it is all a person sees when an object is wrong. No operator or webhook runs here; everything
below is the API server enforcing the CRD's OpenAPI schema and CEL rules on its own.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
from typing import Any

import pytest

from schedlock.operator.crd import CRD_NAME, crd_manifest
from testbed.kube import KubeAPIServer

pytestmark = pytest.mark.integration

ONE_SHOT = {"target": "billing", "publishAt": "2026-12-01T09:00:00Z"}
RECURRING = {"target": "billing", "schedule": "0 9 * * mon-fri", "timeZone": "Europe/Berlin"}

MESSAGE_EXACTLY_ONE = (
    'spec: Invalid value: "object": set exactly one of spec.publishAt (a one-shot time) or '
    "spec.schedule (a cron expression)"
)
MESSAGE_SCHEDULE = (
    'spec.schedule: Invalid value: "string": schedule must be a 5-field cron expression '
    "(minute hour day-of-month month day-of-week), e.g. '*/5 * * * *', or "
    "@hourly/@daily/@weekly/@monthly/@yearly"
)
MESSAGE_TIME_ZONE = (
    'spec.timeZone: Invalid value: "string": timeZone must be an IANA time zone name such as '
    "Europe/Berlin or America/New_York"
)


@pytest.fixture(scope="module")
def crd(kube: KubeAPIServer) -> dict[str, Any]:
    """The CRD installed and Established. Cluster-scoped on a session-wide server: apply is
    idempotent, so other modules installing it too is fine."""
    manifest = crd_manifest()
    kube.apply(manifest)
    kube.wait_established(CRD_NAME)
    return manifest


def _object(namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "schedlock.dev/v1",
        "kind": "ScheduledPublish",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def _apply(
    kube: KubeAPIServer, namespace: str, spec: dict[str, Any], name: str = "sp1"
) -> subprocess.CompletedProcess[str]:
    return kube.apply(_object(namespace, name, spec), check=False)


def _get(kube: KubeAPIServer, namespace: str, name: str = "sp1") -> dict[str, Any]:
    out = kube.kubectl("get", "sp", name, "-n", namespace, "-o", "json").stdout
    return dict(json.loads(out))


def _assert_refused(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert result.returncode != 0, f"accepted, expected a refusal:\n{result.stdout}"
    for text in expected:
        assert text in result.stderr, f"{text!r} not in:\n{result.stderr}"


def _table(output: str) -> list[dict[str, str]]:
    """Rows of `kubectl get` output as {HEADER: cell}; cells are cut at the header offsets."""
    header, *rows = output.rstrip("\n").splitlines()
    titles = re.findall(r"\S+(?: \S+)*", header)  # "LAST FIRED" is one title
    starts = [header.index(title) for title in titles]
    ends = [*starts[1:], None]
    return [
        {t: row[s:e].strip() for t, s, e in zip(titles, starts, ends, strict=True)} for row in rows
    ]


# --------------------------------------------------------------------------- installing


def test_crd_is_established_and_idempotent(kube: KubeAPIServer, crd: dict[str, Any]) -> None:
    again = kube.apply(crd)
    assert f"customresourcedefinition.apiextensions.k8s.io/{CRD_NAME}" in again.stdout
    conditions = json.loads(
        kube.kubectl("get", "crd", CRD_NAME, "-o", "jsonpath={.status.conditions}").stdout
    )
    status = {c["type"]: c["status"] for c in conditions}
    assert status["Established"] == "True"
    assert status["NamesAccepted"] == "True"
    assert "NonStructuralSchema" not in status
    resources = kube.kubectl("api-resources", "--api-group=schedlock.dev").stdout
    assert re.search(
        r"scheduledpublishes\s+sp\s+schedlock.dev/v1\s+true\s+ScheduledPublish", resources
    )


# --------------------------------------------------------------------------- accepted


def test_one_shot_is_accepted_with_the_defaults_filled_in(
    kube: KubeAPIServer, crd: dict[str, Any], kube_namespace: str
) -> None:
    result = _apply(kube, kube_namespace, ONE_SHOT)

    assert result.returncode == 0, result.stderr
    assert "scheduledpublish.schedlock.dev/sp1 created" in result.stdout
    assert _get(kube, kube_namespace)["spec"] == {
        "target": "billing",
        "publishAt": "2026-12-01T09:00:00Z",
        "retry": {"maxAttempts": 3, "backoffSeconds": 1},
        "suspend": False,
    }


def test_recurring_with_a_time_zone_is_accepted(
    kube: KubeAPIServer, crd: dict[str, Any], kube_namespace: str
) -> None:
    result = _apply(kube, kube_namespace, RECURRING)

    assert result.returncode == 0, result.stderr
    spec = _get(kube, kube_namespace)["spec"]
    assert (spec["schedule"], spec["timeZone"]) == ("0 9 * * mon-fri", "Europe/Berlin")


def test_every_option_at_its_limits_is_accepted_and_kept(
    kube: KubeAPIServer, crd: dict[str, Any], kube_namespace: str
) -> None:
    payload: dict[str, Any] = {f"k{i}": i for i in range(63)}
    payload["nested"] = {"list": [1, "two", {"three": 3.5}], "flag": True}  # 64 keys
    spec = {
        "target": "a" * 63,
        "schedule": "*/15 8-18 * jan-mar,oct-dec MON-FRI",
        "timeZone": "America/New_York",
        "payload": payload,
        "startingDeadlineSeconds": 2_592_000,
        "retry": {"maxAttempts": 20, "backoffSeconds": 3600},
        "suspend": True,
    }
    result = _apply(kube, kube_namespace, spec)

    assert result.returncode == 0, result.stderr
    assert _get(kube, kube_namespace)["spec"] == spec  # payload kept as-is, nothing pruned

    low = {
        **ONE_SHOT,
        "startingDeadlineSeconds": 0,
        "retry": {"maxAttempts": 1, "backoffSeconds": 1},
    }
    result = _apply(kube, kube_namespace, low, name="sp2")
    assert result.returncode == 0, result.stderr


def test_payload_nulls_are_kept_by_the_api_server(
    kube: KubeAPIServer, crd: dict[str, Any], kube_namespace: str
) -> None:
    """Stored as sent. (Client-side `kubectl apply` drops null map values itself: in its
    patches null means "delete"; `kubectl create` and server-side apply keep them.)"""
    payload = {"x": None, "list": [None, {"y": None}]}
    manifest = _object(kube_namespace, "sp1", {**ONE_SHOT, "payload": payload})
    kube.kubectl("create", "-f", "-", input=json.dumps(manifest))
    assert _get(kube, kube_namespace)["spec"]["payload"] == payload


@pytest.mark.parametrize(
    "schedule",
    ["*/5 * * * *", "0 0 1,15 * *", "5/15 0-23/2 * * 7", "0 9 * * MON-FRI", "@daily", "@Yearly"],
)
def test_cron_forms_are_accepted(
    kube: KubeAPIServer, crd: dict[str, Any], kube_namespace: str, schedule: str
) -> None:
    result = _apply(kube, kube_namespace, {"target": "billing", "schedule": schedule})
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "publish_at", ["2026-12-01T10:00:00+01:00", "2026-12-01T09:00:00.250Z", "2020-01-01T00:00:00Z"]
)
def test_rfc3339_times_are_accepted(
    kube: KubeAPIServer, crd: dict[str, Any], kube_namespace: str, publish_at: str
) -> None:
    result = _apply(kube, kube_namespace, {"target": "billing", "publishAt": publish_at})
    assert result.returncode == 0, result.stderr


# --------------------------------------------------------------------------- refused on create

# Fields the CRD refuses next to a valid target: name -> (spec fields, the API server's message).
BAD_FIELDS = {
    "cron-words": ({"schedule": "every minute"}, MESSAGE_SCHEDULE),
    "cron-61": ({"schedule": "61 * * * *"}, MESSAGE_SCHEDULE),
    "cron-3-fields": ({"schedule": "* * *"}, MESSAGE_SCHEDULE),
    "cron-6-fields": ({"schedule": "* * * * * *"}, MESSAGE_SCHEDULE),
    "cron-hour-24": ({"schedule": "0 24 * * *"}, MESSAGE_SCHEDULE),
    "cron-month-13": ({"schedule": "0 0 * 13 *"}, MESSAGE_SCHEDULE),
    "cron-step-0": ({"schedule": "*/0 * * * *"}, MESSAGE_SCHEDULE),
    "cron-reboot": ({"schedule": "@reboot"}, MESSAGE_SCHEDULE),
    "zone-mars": ({"schedule": "@daily", "timeZone": "Mars/Base"}, MESSAGE_TIME_ZONE),
    "zone-wrong-case": ({"schedule": "@daily", "timeZone": "europe/berlin"}, MESSAGE_TIME_ZONE),
    "zone-localtime": ({"schedule": "@daily", "timeZone": "localtime"}, MESSAGE_TIME_ZONE),
}

REFUSED_ON_CREATE = [
    pytest.param(
        {"publishAt": "2026-12-01T09:00:00Z"}, ["spec.target: Required value"], id="missing-target"
    ),
    pytest.param(
        {**ONE_SHOT, "target": "Billing_App"},
        [
            'spec.target: Invalid value: "Billing_App": spec.target in body should match '
            "'^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'"
        ],
        id="target-not-a-dns-label",
    ),
    pytest.param(
        {**ONE_SHOT, "target": "a" * 64},
        ["spec.target: Too long: may not be more than 63 bytes"],
        id="target-too-long",
    ),
    pytest.param(
        {**ONE_SHOT, "schedule": "@daily"}, [MESSAGE_EXACTLY_ONE], id="both-publishAt-and-schedule"
    ),
    pytest.param({"target": "billing"}, [MESSAGE_EXACTLY_ONE], id="neither"),
    *(
        pytest.param({"target": "billing", **spec}, [message], id=name)
        for name, (spec, message) in BAD_FIELDS.items()
    ),
    pytest.param(
        {"target": "billing", "schedule": "1" + ",1" * 64 + " * * * *"},
        ["spec.schedule: Too long: may not be more than 128 bytes"],
        id="cron-too-long",
    ),
    pytest.param(
        {**ONE_SHOT, "timeZone": "Europe/Berlin"},
        [
            'spec.timeZone: Invalid value: "object": timeZone only applies to spec.schedule; '
            "a publishAt time carries its own UTC offset"
        ],
        id="zone-without-schedule",
    ),
    pytest.param(
        {"target": "billing", "publishAt": "tomorrow"},
        [
            'spec.publishAt: Invalid value: "tomorrow": spec.publishAt in body must be of type '
            'date-time: "tomorrow"'
        ],
        id="date-tomorrow",
    ),
    pytest.param(
        {"target": "billing", "publishAt": "2026-13-01T00:00:00Z"},
        ['spec.publishAt in body must be of type date-time: "2026-13-01T00:00:00Z"'],
        id="date-month-13",
    ),
    pytest.param(
        {"target": "billing", "publishAt": "2026-12-01T09:00:00"},
        ['spec.publishAt in body must be of type date-time: "2026-12-01T09:00:00"'],
        id="date-without-offset",
    ),
    pytest.param(
        {**ONE_SHOT, "startingDeadlineSeconds": -1},
        [
            "spec.startingDeadlineSeconds: Invalid value: -1: spec.startingDeadlineSeconds in "
            "body should be greater than or equal to 0"
        ],
        id="deadline-negative",
    ),
    pytest.param(
        {**ONE_SHOT, "startingDeadlineSeconds": 2_592_001},
        [
            "spec.startingDeadlineSeconds: Invalid value: 2592001: spec.startingDeadlineSeconds "
            "in body should be less than or equal to 2592000"
        ],
        id="deadline-huge",
    ),
    pytest.param(
        {**ONE_SHOT, "retry": {"maxAttempts": 0}},
        [
            "spec.retry.maxAttempts: Invalid value: 0: spec.retry.maxAttempts in body should be "
            "greater than or equal to 1"
        ],
        id="attempts-0",
    ),
    pytest.param(
        {**ONE_SHOT, "retry": {"maxAttempts": 21}},
        [
            "spec.retry.maxAttempts: Invalid value: 21: spec.retry.maxAttempts in body should be "
            "less than or equal to 20"
        ],
        id="attempts-21",
    ),
    pytest.param(
        {**ONE_SHOT, "retry": {"backoffSeconds": 3601}},
        ["spec.retry.backoffSeconds in body should be less than or equal to 3600"],
        id="backoff-huge",
    ),
    pytest.param(
        {**ONE_SHOT, "payload": {f"k{i}": i for i in range(65)}},
        ["spec.payload: Too many: 65: must have at most 64 items"],
        id="payload-65-keys",
    ),
    pytest.param(
        {**ONE_SHOT, "payload": [1, 2]},
        ['spec.payload: Invalid value: "array": spec.payload in body must be of type object'],
        id="payload-not-an-object",
    ),
]


@pytest.mark.parametrize(("spec", "expected"), REFUSED_ON_CREATE)
def test_invalid_objects_are_refused_with_a_message_a_person_can_act_on(
    kube: KubeAPIServer,
    crd: dict[str, Any],
    kube_namespace: str,
    spec: dict[str, Any],
    expected: list[str],
) -> None:
    result = _apply(kube, kube_namespace, spec)

    _assert_refused(result, 'The ScheduledPublish "sp1" is invalid', *expected)
    missing = kube.kubectl("get", "sp", "sp1", "-n", kube_namespace, check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr


def test_several_problems_are_reported_together(
    kube: KubeAPIServer, crd: dict[str, Any], kube_namespace: str
) -> None:
    spec = {**ONE_SHOT, "startingDeadlineSeconds": -5, "retry": {"maxAttempts": 0}}
    _assert_refused(
        _apply(kube, kube_namespace, spec),
        "spec.startingDeadlineSeconds in body should be greater than or equal to 0",
        "spec.retry.maxAttempts in body should be greater than or equal to 1",
    )


# --------------------------------------------------------------------------- refused on update


def test_target_is_immutable(kube: KubeAPIServer, crd: dict[str, Any], kube_namespace: str) -> None:
    assert _apply(kube, kube_namespace, ONE_SHOT).returncode == 0

    result = _apply(kube, kube_namespace, {**ONE_SHOT, "target": "shipping"})

    _assert_refused(
        result,
        'spec.target: Invalid value: "string": target is immutable: delete and re-create the '
        "ScheduledPublish to deliver to another app",
    )
    assert _get(kube, kube_namespace)["spec"]["target"] == "billing"


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param(
            ONE_SHOT, {"target": "billing", "schedule": "@daily"}, id="publishAt-to-schedule"
        ),
        pytest.param(
            RECURRING,
            {"target": "billing", "publishAt": "2026-12-01T09:00:00Z"},
            id="schedule-to-publishAt",
        ),
    ],
)
def test_switching_between_one_shot_and_recurring_is_refused(
    kube: KubeAPIServer,
    crd: dict[str, Any],
    kube_namespace: str,
    before: dict[str, Any],
    after: dict[str, Any],
) -> None:
    assert _apply(kube, kube_namespace, before).returncode == 0

    result = _apply(kube, kube_namespace, after)

    _assert_refused(
        result,
        'spec: Invalid value: "object": cannot switch between publishAt and schedule: create a new '
        "ScheduledPublish",
    )


def test_allowed_edits_are_accepted(
    kube: KubeAPIServer, crd: dict[str, Any], kube_namespace: str
) -> None:
    assert _apply(kube, kube_namespace, ONE_SHOT).returncode == 0
    moved = {**ONE_SHOT, "publishAt": "2027-01-01T00:00:00Z", "suspend": True}
    result = _apply(kube, kube_namespace, moved)
    assert result.returncode == 0, result.stderr

    assert _apply(kube, kube_namespace, RECURRING, name="sp2").returncode == 0
    rescheduled = {**RECURRING, "schedule": "@hourly", "timeZone": "Asia/Tokyo"}
    result = _apply(kube, kube_namespace, rescheduled, name="sp2")
    assert result.returncode == 0, result.stderr
    assert _get(kube, kube_namespace, "sp2")["spec"]["timeZone"] == "Asia/Tokyo"


# --------------------------------------------------------------------------- explain


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("field", ["spec", "spec.retry", "status", "status.conditions"])
def test_kubectl_explain_shows_every_description(
    kube: KubeAPIServer, crd: dict[str, Any], field: str
) -> None:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for part in field.split("."):
        schema = schema["properties"][part]
    schema = schema.get("items", schema)

    out = _words(kube.kubectl("explain", f"sp.{field}").stdout)

    assert _words(schema["description"]) in out
    for name, child in schema["properties"].items():
        assert name in out
        assert _words(child["description"]) in out, f"{field}.{name}"


def test_kubectl_explain_spec_marks_target_required(
    kube: KubeAPIServer, crd: dict[str, Any]
) -> None:
    out = kube.kubectl("explain", "sp.spec").stdout
    assert re.search(r"target\s+<string> -required-", out)
    retry = _words(kube.kubectl("explain", "sp.spec.retry").stdout)
    assert "1 to 20; 1 means no retry. Default: 3." in retry
    assert "capped at 300 seconds. 1 to 3600. Default: 1." in retry


# --------------------------------------------------------------------------- get and status


def test_get_shows_the_printer_columns_and_the_category(
    kube: KubeAPIServer, crd: dict[str, Any], kube_namespace: str
) -> None:
    assert _apply(kube, kube_namespace, ONE_SHOT, name="once").returncode == 0
    assert _apply(kube, kube_namespace, RECURRING, name="weekdays").returncode == 0

    wide = _table(kube.kubectl("get", "sp", "-n", kube_namespace, "-o", "wide").stdout)
    assert list(wide[0]) == [
        "NAME",
        "TARGET",
        "SCHEDULE",
        "AT",
        "NEXT",
        "PHASE",
        "ATTEMPTS",
        "LAST FIRED",
        "AGE",
        "MESSAGE",
    ]
    rows = {row["NAME"]: row for row in wide}
    assert rows["once"]["AT"] == "2026-12-01T09:00:00Z"
    assert rows["once"]["SCHEDULE"] == ""
    assert rows["weekdays"]["SCHEDULE"] == "0 9 * * mon-fri"
    assert rows["weekdays"]["TARGET"] == "billing"

    narrow = kube.kubectl("get", "sp", "-n", kube_namespace).stdout
    assert list(_table(narrow)[0]) == ["NAME", "TARGET", "AT", "NEXT", "PHASE", "LAST FIRED", "AGE"]

    by_category = kube.kubectl("get", "schedlock", "-n", kube_namespace).stdout
    assert {row["NAME"] for row in _table(by_category)} == {"once", "weekdays"}
    by_long_name = kube.kubectl("get", "scheduledpublishes", "-n", kube_namespace, "-o", "name")
    assert set(by_long_name.stdout.split()) == {
        "scheduledpublish.schedlock.dev/once",
        "scheduledpublish.schedlock.dev/weekdays",
    }
    everything = kube.kubectl("get", "all", "-n", kube_namespace, check=False)
    assert "once" not in everything.stdout  # not in the "all" category on purpose


def test_status_is_written_through_the_subresource_and_shown_by_get(
    kube: KubeAPIServer, crd: dict[str, Any], kube_namespace: str
) -> None:
    assert _apply(kube, kube_namespace, RECURRING).returncode == 0
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    fired = (now - dt.timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {
        "phase": "Scheduled",
        "nextFireAt": "2030-01-07T08:00:00Z",
        "lastFiredAt": fired,
        "attempts": 2,
        "firedBy": {"term": 7, "holder": "billing-6d4f9-x2x8k"},
        "observedGeneration": 1,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Stored",
                "message": "stored; fires weekdays at 09:00 Europe/Berlin",
                "lastTransitionTime": fired,
                "observedGeneration": 1,
            }
        ],
    }

    kube.kubectl(
        "patch", "sp", "sp1", "-n", kube_namespace,
        "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}),
    )  # fmt: skip

    assert _get(kube, kube_namespace)["status"] == status
    (row,) = _table(kube.kubectl("get", "sp", "-n", kube_namespace, "-o", "wide").stdout)
    assert row["PHASE"] == "Scheduled"
    assert row["NEXT"] == "2030-01-07T08:00:00Z"  # a string column: a date one says <invalid>
    assert re.fullmatch(r"[56]m\d*s?", row["LAST FIRED"]), row["LAST FIRED"]
    assert row["ATTEMPTS"] == "2"
    assert row["MESSAGE"] == "stored; fires weekdays at 09:00 Europe/Berlin"


def test_status_is_not_writable_through_the_main_resource_and_is_validated(
    kube: KubeAPIServer, crd: dict[str, Any], kube_namespace: str
) -> None:
    assert _apply(kube, kube_namespace, ONE_SHOT).returncode == 0

    kube.kubectl(
        "patch", "sp", "sp1", "-n", kube_namespace, "--type=merge",
        "-p", '{"status": {"phase": "Published"}}',
    )  # fmt: skip
    assert "status" not in _get(kube, kube_namespace)  # ignored: status is a subresource

    bad = kube.kubectl(
        "patch", "sp", "sp1", "-n", kube_namespace, "--subresource=status", "--type=merge",
        "-p", '{"status": {"phase": "Done"}}', check=False,
    )  # fmt: skip
    _assert_refused(
        bad,
        'status.phase: Unsupported value: "Done": supported values: "Pending", "Scheduled", '
        '"Firing", "Published", "Failed", "Missed", "Suspended", "Cancelled"',
    )
