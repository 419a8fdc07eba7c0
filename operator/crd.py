"""The ScheduledPublish CustomResourceDefinition, built in Python: its one source of truth.

``crd_manifest()`` returns the CRD as a plain dict.  ``hack/gen-manifests.py`` renders it into
``charts/schedlock/files/crd.yaml`` (the chart templates it), the integration tests apply it
to a real API server, and the operator reuses the names, bounds and messages exported here, so
a bound is written down exactly once.

What the API server enforces (OpenAPI schema plus CEL rules, no webhook needed):

* ``spec.target``: a DNS label, immutable.
* exactly one of ``spec.publishAt`` (RFC 3339 time) and ``spec.schedule`` (5-field cron or a
  descriptor; the shape and numeric ranges of every field are checked by one regex), and no
  switching between the two on update.
* ``spec.timeZone``: only with ``spec.schedule``, and only a name from the IANA database shipped
  by the ``tzdata`` package (the list is generated into the rule at manifest-build time).
* payload key count, deadline, retry and backoff bounds.

What it cannot: the payload's 16 KiB size and 32-level nesting (``schedlock.core.payloads``: the
operator's validating webhook and handlers, and the database's CHECK) and cron semantics
beyond shape, such as reversed ranges (``5-1``) or dates that never occur (``0 0 30 2 *``), which
the operator's parser (``schedlock.core.scheduling``) reports on the object's status.
"""

from __future__ import annotations

import importlib.resources
from typing import Any, Final

from schedlock.core.payloads import MAX_PAYLOAD_BYTES, MAX_PAYLOAD_DEPTH

__all__ = [
    "API_VERSION",
    "BACKOFF_CAP_SECONDS",
    "CATEGORIES",
    "CONDITION_STATUSES",
    "CRD_NAME",
    "CRON_DESCRIPTORS",
    "DEFAULT_BACKOFF_SECONDS",
    "DEFAULT_MAX_ATTEMPTS",
    "GROUP",
    "KIND",
    "LIST_KIND",
    "MAX_ATTEMPTS",
    "MAX_BACKOFF_SECONDS",
    "MAX_PAYLOAD_BYTES",
    "MAX_PAYLOAD_DEPTH",
    "MAX_PAYLOAD_PROPERTIES",
    "MAX_SCHEDULE_LENGTH",
    "MAX_STARTING_DEADLINE_SECONDS",
    "MAX_TARGET_LENGTH",
    "MAX_TIME_ZONE_LENGTH",
    "MESSAGE_EXACTLY_ONE",
    "MESSAGE_NO_SWITCH",
    "MESSAGE_SCHEDULE",
    "MESSAGE_TARGET_IMMUTABLE",
    "MESSAGE_TIME_ZONE",
    "MESSAGE_TIME_ZONE_NEEDS_SCHEDULE",
    "MIN_ATTEMPTS",
    "MIN_BACKOFF_SECONDS",
    "PHASES",
    "PLURAL",
    "READY_CONDITION",
    "SCHEDULE_PATTERN",
    "SHORT_NAMES",
    "SINGULAR",
    "TARGET_PATTERN",
    "VERSION",
    "crd_manifest",
    "time_zone_names",
]

# --------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------

GROUP: Final = "schedlock.dev"
VERSION: Final = "v1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
PLURAL: Final = "scheduledpublishes"
SINGULAR: Final = "scheduledpublish"
KIND: Final = "ScheduledPublish"
LIST_KIND: Final = "ScheduledPublishList"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"
SHORT_NAMES: Final = ("sp",)
# Not "all": `kubectl get all` should stay about workloads; `kubectl get schedlock` lists these.
CATEGORIES: Final = ("schedlock",)

# --------------------------------------------------------------------------------------------
# Bounds (the operator and its webhook reuse these)
# --------------------------------------------------------------------------------------------

TARGET_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MAX_TARGET_LENGTH: Final = 63
MAX_SCHEDULE_LENGTH: Final = 128
MAX_TIME_ZONE_LENGTH: Final = 64  # the longest IANA name today has 32 characters
MAX_PAYLOAD_PROPERTIES: Final = 64
# MAX_PAYLOAD_BYTES (schedlock.core.payloads, imported above): enforced by the operator's
# webhook and handlers and by the database, not the schema.
MAX_STARTING_DEADLINE_SECONDS: Final = 30 * 24 * 3600
MIN_ATTEMPTS: Final = 1
MAX_ATTEMPTS: Final = 20
DEFAULT_MAX_ATTEMPTS: Final = 3
MIN_BACKOFF_SECONDS: Final = 1
MAX_BACKOFF_SECONDS: Final = 3600
DEFAULT_BACKOFF_SECONDS: Final = 1
BACKOFF_CAP_SECONDS: Final = 300  # schedlock.core.scheduling.retry_delay's cap_seconds default

PHASES: Final = (
    "Pending",
    "Scheduled",
    "Firing",
    "Published",
    "Failed",
    "Missed",
    "Suspended",
    "Cancelled",
)
CONDITION_STATUSES: Final = ("True", "False", "Unknown")
READY_CONDITION: Final = "Ready"
CRON_DESCRIPTORS: Final = (
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@midnight",
    "@hourly",
)

# --------------------------------------------------------------------------------------------
# Messages the API server returns when a rule fails (the webhook and tests reuse them)
# --------------------------------------------------------------------------------------------

MESSAGE_TARGET_IMMUTABLE: Final = (
    "target is immutable: delete and re-create the ScheduledPublish to deliver to another app"
)
MESSAGE_EXACTLY_ONE: Final = (
    "set exactly one of spec.publishAt (a one-shot time) or spec.schedule (a cron expression)"
)
MESSAGE_NO_SWITCH: Final = (
    "cannot switch between publishAt and schedule: create a new ScheduledPublish"
)
MESSAGE_TIME_ZONE_NEEDS_SCHEDULE: Final = (
    "timeZone only applies to spec.schedule; a publishAt time carries its own UTC offset"
)
MESSAGE_SCHEDULE: Final = (
    "schedule must be a 5-field cron expression (minute hour day-of-month month day-of-week), "
    "e.g. '*/5 * * * *', or @hourly/@daily/@weekly/@monthly/@yearly"
)
MESSAGE_TIME_ZONE: Final = (
    "timeZone must be an IANA time zone name such as Europe/Berlin or America/New_York"
)

# --------------------------------------------------------------------------------------------
# The cron shape, as one RE2 regex (CEL's matches() is RE2)
# --------------------------------------------------------------------------------------------

_MONTHS = "jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec"
_DAYS = "sun|mon|tue|wed|thu|fri|sat"
# One value of each field, in range; one optional leading zero, as "05" is common.
_MINUTE = "[0-5]?[0-9]"
_HOUR = "[01]?[0-9]|2[0-3]"
_DAY_OF_MONTH = "0?[1-9]|[12][0-9]|3[01]"
_MONTH = f"0?[1-9]|1[0-2]|{_MONTHS}"
_DAY_OF_WEEK = f"0?[0-7]|{_DAYS}"
_STEP = "0?[1-9][0-9]?"  # 1-99: no field has more than 60 values


def _field(value: str) -> str:
    """A list of elements: ``*``, ``v``, ``v-v``, each optionally with ``/step``."""
    element = f"(?:\\*|(?:{value})(?:-(?:{value}))?)(?:/{_STEP})?"
    return f"{element}(?:,{element})*"


def _schedule_pattern() -> str:
    cron = r"\s+".join(_field(v) for v in (_MINUTE, _HOUR, _DAY_OF_MONTH, _MONTH, _DAY_OF_WEEK))
    descriptors = "|".join(d.removeprefix("@") for d in CRON_DESCRIPTORS)
    return f"(?i)^\\s*(?:@(?:{descriptors})|{cron})\\s*$"


# The syntax accepted here is a subset of what schedlock.core.scheduling parses (which also takes
# `@every <duration>`); both share `a/n` (= a-<max>/n), names in ranges and case-insensitivity.
SCHEDULE_PATTERN: Final = _schedule_pattern()

# --------------------------------------------------------------------------------------------
# Time zones
# --------------------------------------------------------------------------------------------


def time_zone_names() -> tuple[str, ...]:
    """Every IANA zone name the ``tzdata`` package ships, sorted.

    This is what ``zoneinfo.available_timezones()`` returns from the ``tzdata`` package alone:
    the host's ``/usr/share/zoneinfo`` would add host-dependent entries (``localtime``,
    ``posixrules``…) and make the generated manifest differ between machines.  Every name here
    loads with ``zoneinfo.ZoneInfo`` wherever schedlock is installed, as tzdata is a dependency.
    """
    zones = importlib.resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    return tuple(sorted({line.strip() for line in zones.splitlines() if line.strip()}))


def _time_zone_rule(width: int = 96) -> str:
    """``self in [...]`` over every zone name, wrapped to WIDTH so the YAML stays readable."""
    lines: list[str] = []
    line = ""
    for name in time_zone_names():
        item = f"'{name}',"
        if line and len(line) + 1 + len(item) > width:
            lines.append(line)
            line = ""
        line = f"{line} {item}" if line else item
    lines.append(line)
    body = "\n".join(f"  {text}" for text in lines)
    return f"self in [\n{body}\n]"


# --------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------


def _phase_description() -> str:
    return (
        "Where this ScheduledPublish is in its life. One of: "
        "Pending (accepted, not yet written to the database); "
        "Scheduled (waiting for its time or for a retry, see nextFireAt); "
        "Firing (a delivery to the app is in progress); "
        "Published (the app answered 2xx; final for a one-shot); "
        "Failed (the app refused it or every attempt failed, see lastError); "
        "Missed (due more than startingDeadlineSeconds ago, so not fired late); "
        "Suspended (spec.suspend is true); "
        "Cancelled (withdrawn before it fired). "
        "A recurring schedule goes back to Scheduled after each fire."
    )


def _spec_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": (
            "What to deliver, to which app, and when. Set exactly one of publishAt (fire once) "
            "or schedule (fire on a cron schedule)."
        ),
        "required": ["target"],
        "properties": {
            "target": {
                "type": "string",
                "description": (
                    "The app that receives the fire: the --target name its schedlock sidecars "
                    "run with, in this namespace. A DNS label: lower-case letters, digits and "
                    f"'-', at most {MAX_TARGET_LENGTH} characters, e.g. billing. Immutable: "
                    "delete and re-create the object to deliver to another app."
                ),
                "minLength": 1,
                "maxLength": MAX_TARGET_LENGTH,
                "pattern": TARGET_PATTERN,
                "x-kubernetes-validations": [
                    {"rule": "self == oldSelf", "message": MESSAGE_TARGET_IMMUTABLE}
                ],
            },
            "publishAt": {
                "type": "string",
                "format": "date-time",
                "description": (
                    "Fire once at this time: an RFC 3339 timestamp with a UTC offset, e.g. "
                    "2026-12-01T09:00:00Z or 2026-12-01T10:00:00+01:00. A time in the past "
                    "fires at once (unless startingDeadlineSeconds has passed). Mutually "
                    "exclusive with schedule; cannot be swapped for a schedule later."
                ),
            },
            "schedule": {
                "type": "string",
                "description": (
                    "Fire repeatedly: a 5-field cron expression 'minute hour day-of-month month "
                    "day-of-week' read in timeZone, e.g. '*/5 * * * *' (every 5 minutes) or "
                    "'0 9 * * mon-fri' (09:00 on weekdays). Each field takes *, a value, a "
                    "range a-b, a step */n, a-b/n or a/n, or a comma-separated list of these. "
                    "Ranges: minute 0-59, hour 0-23, day-of-month 1-31, month 1-12 or jan-dec, "
                    "day-of-week 0-7 (0 and 7 are Sunday) or sun-sat. Or a descriptor: "
                    f"{', '.join(CRON_DESCRIPTORS)}. When both day fields are restricted, a day "
                    f"matching either fires. At most {MAX_SCHEDULE_LENGTH} characters. Mutually "
                    "exclusive with publishAt."
                ),
                "minLength": 1,
                "maxLength": MAX_SCHEDULE_LENGTH,
                "x-kubernetes-validations": [
                    {
                        "rule": f"self.matches(\n  r'{SCHEDULE_PATTERN}'\n)",
                        "message": MESSAGE_SCHEDULE,
                    }
                ],
            },
            "timeZone": {
                "type": "string",
                "description": (
                    "The IANA time zone the schedule's cron fields are read in, e.g. "
                    "Europe/Berlin or America/New_York. Default: UTC. Only with schedule. "
                    "Daylight saving: a wall time skipped by a spring-forward jump fires when "
                    "the gap ends; a wall time that occurs twice fires once, at its first "
                    "occurrence."
                ),
                "minLength": 1,
                "maxLength": MAX_TIME_ZONE_LENGTH,
                "x-kubernetes-validations": [
                    {"rule": _time_zone_rule(), "message": MESSAGE_TIME_ZONE}
                ],
            },
            "payload": {
                "type": "object",
                "description": (
                    "A JSON object passed to the app as-is, as the 'payload' field of the "
                    'delivery\'s request body, e.g. {"invoice": 42}. At most '
                    f"{MAX_PAYLOAD_PROPERTIES} top-level keys, {MAX_PAYLOAD_BYTES // 1024} KiB "
                    f"serialised and {MAX_PAYLOAD_DEPTH} levels of nesting."
                ),
                "maxProperties": MAX_PAYLOAD_PROPERTIES,
                "x-kubernetes-preserve-unknown-fields": True,
            },
            "startingDeadlineSeconds": {
                "type": "integer",
                "description": (
                    "How many seconds after its due time a fire may still start. Past it the "
                    "fire is marked Missed instead of firing late, and a retry that would start "
                    "after it is not made. For a schedule it also bounds catch-up after "
                    "downtime: only the latest missed slot fires, and only inside this deadline. "
                    f"0 to {MAX_STARTING_DEADLINE_SECONDS} (30 days). Default: no deadline (a "
                    "late one-shot fires whenever it can; a schedule catches up its latest slot)."
                ),
                "minimum": 0,
                "maximum": MAX_STARTING_DEADLINE_SECONDS,
            },
            "retry": {
                "type": "object",
                "description": (
                    "How failed deliveries are retried. The app's answer decides: 2xx publishes; "
                    "408, 429, 5xx, timeouts and connection errors are retried; any other status "
                    "fails at once."
                ),
                "default": {},
                "properties": {
                    "maxAttempts": {
                        "type": "integer",
                        "description": (
                            "Deliveries to try in total, the first included, before the fire is "
                            f"marked Failed. {MIN_ATTEMPTS} to {MAX_ATTEMPTS}; 1 means no retry. "
                            f"Default: {DEFAULT_MAX_ATTEMPTS}."
                        ),
                        "minimum": MIN_ATTEMPTS,
                        "maximum": MAX_ATTEMPTS,
                        "default": DEFAULT_MAX_ATTEMPTS,
                    },
                    "backoffSeconds": {
                        "type": "integer",
                        "description": (
                            "Seconds before the first retry. Each further retry waits twice as "
                            "long, with jitter (between half and all of the doubled delay), "
                            f"capped at {BACKOFF_CAP_SECONDS} seconds. {MIN_BACKOFF_SECONDS} to "
                            f"{MAX_BACKOFF_SECONDS}. Default: {DEFAULT_BACKOFF_SECONDS}."
                        ),
                        "minimum": MIN_BACKOFF_SECONDS,
                        "maximum": MAX_BACKOFF_SECONDS,
                        "default": DEFAULT_BACKOFF_SECONDS,
                    },
                },
            },
            "suspend": {
                "type": "boolean",
                "description": (
                    "true stops this object from firing: a due one-shot waits until it is "
                    "resumed (and then obeys startingDeadlineSeconds); a schedule skips the "
                    "slots that fall while suspended. Default: false."
                ),
                "default": False,
            },
        },
        "x-kubernetes-validations": [
            {"rule": "has(self.publishAt) != has(self.schedule)", "message": MESSAGE_EXACTLY_ONE},
            {
                "rule": "!has(self.timeZone) || has(self.schedule)",
                "message": MESSAGE_TIME_ZONE_NEEDS_SCHEDULE,
                "fieldPath": ".timeZone",
            },
            {"rule": "has(self.publishAt) == has(oldSelf.publishAt)", "message": MESSAGE_NO_SWITCH},
        ],
    }


def _condition_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "One aspect of this object's state, in the standard Kubernetes form.",
        "required": ["type", "status"],
        "properties": {
            "type": {
                "type": "string",
                "description": (
                    f"The aspect, in CamelCase. {READY_CONDITION}: True while the object is "
                    "stored in the database and will fire (or has published); False with a "
                    "reason and message when it cannot."
                ),
                "maxLength": 316,
            },
            "status": {
                "type": "string",
                "description": "Whether the condition holds: True, False or Unknown.",
                "enum": list(CONDITION_STATUSES),
            },
            "reason": {
                "type": "string",
                "description": (
                    "Why the condition last changed, in CamelCase for programs, e.g. "
                    "InvalidSchedule or DatabaseUnavailable."
                ),
                "maxLength": 1024,
            },
            "message": {
                "type": "string",
                "description": "Why the condition last changed, for people.",
                "maxLength": 32768,
            },
            "lastTransitionTime": {
                "type": "string",
                "format": "date-time",
                "description": "When status last changed (RFC 3339).",
            },
            "observedGeneration": {
                "type": "integer",
                "format": "int64",
                "description": "The metadata.generation the condition was computed from.",
                "minimum": 0,
            },
        },
    }


def _status_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "Written by the schedlock operator; do not set it yourself.",
        "properties": {
            "phase": {
                "type": "string",
                "description": _phase_description(),
                "enum": list(PHASES),
            },
            "nextFireAt": {
                "type": "string",
                "format": "date-time",
                "description": (
                    "When the next fire is due (RFC 3339, UTC), including a pending retry. "
                    "Absent when nothing more will fire."
                ),
            },
            "lastFiredAt": {
                "type": "string",
                "format": "date-time",
                "description": "When the last delivery attempt started (RFC 3339, UTC).",
            },
            "attempts": {
                "type": "integer",
                "description": (
                    "Delivery attempts made for the current (or last) fire, retries included."
                ),
                "minimum": 0,
            },
            "lastError": {
                "type": "string",
                "description": (
                    "Why the last attempt failed, e.g. 'HTTP 503 from the app' or "
                    "'connection refused'. Absent after a success."
                ),
            },
            "firedBy": {
                "type": "object",
                "description": "The sidecar that fired last: its leadership term and holder.",
                "properties": {
                    "term": {
                        "type": "integer",
                        "format": "int64",
                        "description": (
                            "The leadership term of the lock key (publish or recurring, "
                            "namespace, target) when it fired; it grows by one at each failover."
                        ),
                    },
                    "holder": {
                        "type": "string",
                        "description": "The leader that fired it: the sidecar's pod name.",
                    },
                },
            },
            "observedGeneration": {
                "type": "integer",
                "format": "int64",
                "description": (
                    "The metadata.generation of the spec this status describes; smaller than "
                    "metadata.generation while the operator has not caught up with an edit."
                ),
                "minimum": 0,
            },
            "conditions": {
                "type": "array",
                "description": (
                    f"The latest observations of this object's state; {READY_CONDITION} says "
                    "whether it will fire. One entry per type."
                ),
                "maxItems": 16,
                "items": _condition_schema(),
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
        },
    }


def _printer_columns() -> list[dict[str, Any]]:
    """`kubectl get sp` columns; priority 1 ones show with -o wide.

    At and Next are strings, not dates: kubectl prints a "date" column as the age since that
    time, which is "<invalid>" for every future time, and future is what they mostly are.
    """
    ready_message = f'.status.conditions[?(@.type=="{READY_CONDITION}")].message'
    return [
        _column("Target", "string", ".spec.target", "The app that receives the fire."),
        _column("Schedule", "string", ".spec.schedule", "The cron expression.", priority=1),
        _column("At", "string", ".spec.publishAt", "The one-shot time (RFC 3339)."),
        _column("Next", "string", ".status.nextFireAt", "When the next fire is due."),
        _column("Phase", "string", ".status.phase", "Where it is in its life."),
        _column("Attempts", "integer", ".status.attempts", "Delivery attempts.", priority=1),
        _column("Last Fired", "date", ".status.lastFiredAt", "How long ago it last fired."),
        _column("Age", "date", ".metadata.creationTimestamp", "How long ago it was created."),
        _column("Message", "string", ready_message, "Why it is (not) Ready.", priority=1),
    ]


def _column(
    name: str, kind: str, path: str, description: str, *, priority: int = 0
) -> dict[str, Any]:
    column: dict[str, Any] = {"name": name, "type": kind, "jsonPath": path}
    if priority:
        column["priority"] = priority
    column["description"] = description
    return column


def crd_manifest() -> dict[str, Any]:
    """The ScheduledPublish CustomResourceDefinition, ready for `kubectl apply`."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {
                "app.kubernetes.io/name": "schedlock",
                "app.kubernetes.io/part-of": "schedlock",
            },
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": LIST_KIND,
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _printer_columns(),
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": (
                                "A message that schedlock delivers to an app once at a given "
                                "time (spec.publishAt) or on a cron schedule (spec.schedule). "
                                "The operator stores it in the app's PostgreSQL; the app's "
                                "schedlock sidecars elect one leader, which POSTs it to the app "
                                "when due, once, with an Idempotency-Key header."
                            ),
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {
                                    "type": "string",
                                    "description": f"The API version: {API_VERSION}.",
                                },
                                "kind": {
                                    "type": "string",
                                    "description": f"The kind: {KIND}.",
                                },
                                # The API server forbids anything but type here (not even a
                                # description): metadata's schema is built in.
                                "metadata": {"type": "object"},
                                "spec": _spec_schema(),
                                "status": _status_schema(),
                            },
                        }
                    },
                }
            ],
        },
    }
