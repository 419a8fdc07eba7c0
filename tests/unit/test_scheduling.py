"""The pure scheduling core: expressions, time zones and DST, catch-up, retries and outcomes.

Everything here is deterministic: explicit instants, seeded ``random.Random``, no clock, no sleep.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import TypedDict, Unpack
from zoneinfo import ZoneInfo

import pytest

from schedlock.core.scheduling import (
    SKIPPED_COUNT_CAP,
    AttemptResult,
    Decision,
    Outcome,
    Schedule,
    ScheduleError,
    SlotPlan,
    classify,
    decide,
    idempotency_key,
    is_past_deadline,
    parse_schedule,
    plan_recurring,
    retry_delay,
    validate_time_zone,
)


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def iso(moment: datetime) -> str:
    assert moment.tzinfo is UTC
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def fires(expression: str, after: datetime, count: int, time_zone: str = "UTC") -> list[str]:
    """The next ``count`` fire times after ``after``, as UTC ISO strings."""
    schedule = parse_schedule(expression, time_zone)
    out = []
    moment = after
    for _ in range(count):
        moment = schedule.next_after(moment)
        out.append(iso(moment))
    return out


def fires_between(schedule: Schedule, start: datetime, end: datetime) -> list[datetime]:
    out = []
    moment = schedule.next_after(start)
    while moment <= end:
        out.append(moment)
        moment = schedule.next_after(moment)
    return out


def local(moment: datetime, time_zone: str) -> str:
    return moment.astimezone(ZoneInfo(time_zone)).strftime("%Y-%m-%d %H:%M%z")


# 2024-01-01 is a Monday.
MON = utc(2024, 1, 1)


# --------------------------------------------------------------------------------------------
# Parsing: every field syntax
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("* * * * *", ["2024-01-01T00:01:00Z", "2024-01-01T00:02:00Z", "2024-01-01T00:03:00Z"]),
        ("5,10 * * * *", ["2024-01-01T00:05:00Z", "2024-01-01T00:10:00Z", "2024-01-01T01:05:00Z"]),
        (
            "10-12 * * * *",
            [
                "2024-01-01T00:10:00Z",
                "2024-01-01T00:11:00Z",
                "2024-01-01T00:12:00Z",
                "2024-01-01T01:10:00Z",
            ],
        ),
        ("*/20 * * * *", ["2024-01-01T00:20:00Z", "2024-01-01T00:40:00Z", "2024-01-01T01:00:00Z"]),
        (
            "10-30/10 * * * *",
            [
                "2024-01-01T00:10:00Z",
                "2024-01-01T00:20:00Z",
                "2024-01-01T00:30:00Z",
                "2024-01-01T01:10:00Z",
            ],
        ),
        ("50/5 * * * *", ["2024-01-01T00:50:00Z", "2024-01-01T00:55:00Z", "2024-01-01T01:50:00Z"]),
        (
            "0,*/25 * * * *",
            ["2024-01-01T00:25:00Z", "2024-01-01T00:50:00Z", "2024-01-01T01:00:00Z"],
        ),
        ("7,3,3 * * * *", ["2024-01-01T00:03:00Z", "2024-01-01T00:07:00Z", "2024-01-01T01:03:00Z"]),
        ("*/61 * * * *", ["2024-01-01T01:00:00Z", "2024-01-01T02:00:00Z"]),
        (
            "0 9-17/4 * * *",
            [
                "2024-01-01T09:00:00Z",
                "2024-01-01T13:00:00Z",
                "2024-01-01T17:00:00Z",
                "2024-01-02T09:00:00Z",
            ],
        ),
        (
            "0 0 1 feb,MAR *",
            ["2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z", "2025-02-01T00:00:00Z"],
        ),
        (
            "0 0 1 Jan-dec/5 *",
            ["2024-06-01T00:00:00Z", "2024-11-01T00:00:00Z", "2025-01-01T00:00:00Z"],
        ),
        (
            "0 0 * * sat,Sun",
            ["2024-01-06T00:00:00Z", "2024-01-07T00:00:00Z", "2024-01-13T00:00:00Z"],
        ),
        ("0 0 * * 0", ["2024-01-07T00:00:00Z", "2024-01-14T00:00:00Z"]),
        ("0 0 * * 7", ["2024-01-07T00:00:00Z", "2024-01-14T00:00:00Z"]),
        ("0 0 * * SUN", ["2024-01-07T00:00:00Z", "2024-01-14T00:00:00Z"]),
        (
            "0 0 * * 5-7",
            [
                "2024-01-05T00:00:00Z",
                "2024-01-06T00:00:00Z",
                "2024-01-07T00:00:00Z",
                "2024-01-12T00:00:00Z",
            ],
        ),
        (
            "0 0 * * mon-fri/2",
            ["2024-01-03T00:00:00Z", "2024-01-05T00:00:00Z", "2024-01-08T00:00:00Z"],
        ),
        ("0 0 31 * *", ["2024-01-31T00:00:00Z", "2024-03-31T00:00:00Z", "2024-05-31T00:00:00Z"]),
        ("0 0 29 2 *", ["2024-02-29T00:00:00Z", "2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"]),
        ("59 23 31 12 *", ["2024-12-31T23:59:00Z", "2025-12-31T23:59:00Z"]),
        ("  0   12 *\t* *  ", ["2024-01-01T12:00:00Z", "2024-01-02T12:00:00Z"]),
        ("00 05 * * *", ["2024-01-01T05:00:00Z"]),
    ],
)
def test_cron_field_syntax(expression: str, expected: list[str]) -> None:
    assert fires(expression, MON, len(expected)) == expected


def test_feb_29_across_a_non_leap_century() -> None:
    assert fires("0 0 29 2 *", utc(2096, 3, 1), 1) == ["2104-02-29T00:00:00Z"]


def test_rare_weekday_combination_is_found() -> None:
    # 29 February on a Sunday (day-of-week "*/7" is unrestricted, so both must match).
    assert fires("0 0 29 2 */7", utc(2021, 1, 1), 2) == [
        "2032-02-29T00:00:00Z",
        "2060-02-29T00:00:00Z",
    ]


# --------------------------------------------------------------------------------------------
# The Vixie day-of-month / day-of-week rule
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # Both restricted: either matches (Fridays and the 13th).
        (
            "0 0 13 * fri",
            [
                "2024-01-05T00:00:00Z",
                "2024-01-12T00:00:00Z",
                "2024-01-13T00:00:00Z",
                "2024-01-19T00:00:00Z",
            ],
        ),
        # Only one restricted: that one decides.
        ("0 0 13 * *", ["2024-01-13T00:00:00Z", "2024-02-13T00:00:00Z"]),
        ("0 0 * * fri", ["2024-01-05T00:00:00Z", "2024-01-12T00:00:00Z"]),
        # "*/10" contains "*": unrestricted as in Vixie cron and cronie, so both must match:
        # day 1, 11, 21 or 31 that is also a Friday (the first is 2024-03-01).
        ("0 0 */10 * fri", ["2024-03-01T00:00:00Z", "2024-05-31T00:00:00Z"]),
        # "1-31" is restricted even though it covers every day: either matches -> every day.
        ("0 0 1-31 * fri", ["2024-01-02T00:00:00Z", "2024-01-03T00:00:00Z"]),
        # Both restricted, month restricted too: either day rule, within February only.
        (
            "0 0 1 2 mon",
            [
                "2024-02-01T00:00:00Z",
                "2024-02-05T00:00:00Z",
                "2024-02-12T00:00:00Z",
                "2024-02-19T00:00:00Z",
                "2024-02-26T00:00:00Z",
                "2025-02-01T00:00:00Z",
            ],
        ),
    ],
)
def test_vixie_day_rule(expression: str, expected: list[str]) -> None:
    assert fires(expression, MON, len(expected)) == expected


# --------------------------------------------------------------------------------------------
# Descriptors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("descriptor", "equivalent"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@DAILY", "0 0 * * *"),
        (" @Hourly ", "0 * * * *"),
    ],
)
def test_descriptors_match_their_cron_equivalent(descriptor: str, equivalent: str) -> None:
    start = utc(2024, 5, 17, 13, 37, 42)
    for time_zone in ("UTC", "Europe/Berlin"):
        assert fires(descriptor, start, 4, time_zone) == fires(equivalent, start, 4, time_zone)


def test_descriptor_values() -> None:
    start = utc(2024, 5, 17, 13, 37)
    assert fires("@yearly", start, 1) == ["2025-01-01T00:00:00Z"]
    assert fires("@monthly", start, 1) == ["2024-06-01T00:00:00Z"]
    assert fires("@weekly", start, 1) == ["2024-05-19T00:00:00Z"]  # a Sunday
    assert fires("@daily", start, 1) == ["2024-05-18T00:00:00Z"]
    assert fires("@hourly", start, 1) == ["2024-05-17T14:00:00Z"]


# --------------------------------------------------------------------------------------------
# @every
# --------------------------------------------------------------------------------------------


def grid_after(moment: datetime, seconds: int) -> datetime:
    """Independent reference: the next multiple of ``seconds`` since the epoch after ``moment``."""
    stamp = int(moment.timestamp())
    return datetime.fromtimestamp((stamp // seconds + 1) * seconds, UTC)


@pytest.mark.parametrize(
    ("duration", "seconds"),
    [
        ("1s", 1),
        ("2s", 2),
        ("90s", 90),
        ("5m", 300),
        ("7m", 420),
        ("1h30m", 5400),
        ("1h", 3600),
        ("1d2h3m4s", 93784),
        ("2d", 172800),
        ("31d", 31 * 86400),
    ],
)
def test_every_fires_on_the_epoch_grid(duration: str, seconds: int) -> None:
    schedule = parse_schedule(f"@every {duration}")
    assert schedule.interval == timedelta(seconds=seconds)
    for moment in (utc(2024, 1, 1), utc(2024, 3, 31, 1, 0, 0), utc(2031, 7, 9, 13, 14, 15)):
        expected = grid_after(moment, seconds)
        assert schedule.next_after(moment) == expected
        assert schedule.next_after(expected) == expected + timedelta(seconds=seconds)
        assert schedule.latest_at_or_before(expected) == expected
        assert schedule.latest_at_or_before(expected - timedelta(microseconds=1)) == (
            expected - timedelta(seconds=seconds)
        )
        assert schedule.next_after(expected - timedelta(microseconds=1)) == expected


def test_every_ignores_the_time_zone() -> None:
    start = utc(2024, 3, 31, 0, 17)  # Berlin's spring-forward night
    for zone in ("Europe/Berlin", "Asia/Kolkata", "Australia/Lord_Howe"):
        assert fires("@every 7m", start, 20, zone) == fires("@every 7m", start, 20)


def test_every_slots_are_stable_across_restarts() -> None:
    # Two "replicas" starting from different instants agree on the slots they share.
    schedule = parse_schedule("@every 90s")
    a = fires_between(schedule, utc(2024, 1, 1, 0, 0, 1), utc(2024, 1, 1, 1))
    b = fires_between(schedule, utc(2024, 1, 1, 0, 33, 7), utc(2024, 1, 1, 1))
    assert a[-len(b) :] == b
    assert all(int(slot.timestamp()) % 90 == 0 for slot in a)


def test_cron_schedule_has_no_interval() -> None:
    assert parse_schedule("@daily").interval is None


# --------------------------------------------------------------------------------------------
# Parse errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", "empty schedule expression"),
        ("   ", "empty schedule expression"),
        ("* * * *", "4 fields given; expected 5 (minute hour day-of-month month day-of-week)"),
        ("*", "1 field given; expected 5"),
        ("* * * * * * *", "7 fields given; expected 5"),
        ("0 * * * * *", "a seconds field is not supported"),
        ("0 * * * * *", "'@every <n>s'"),
        ("60 * * * *", "field 'minute' value 60 is out of range 0-59"),
        ("0 24 * * *", "field 'hour' value 24 is out of range 0-23"),
        ("0 0 0 * *", "field 'day-of-month' value 0 is out of range 1-31"),
        ("0 0 32 * *", "field 'day-of-month' value 32 is out of range 1-31"),
        ("0 0 * 0 *", "field 'month' value 0 is out of range 1-12"),
        ("0 0 * 13 *", "field 'month' value 13 is out of range 1-12"),
        ("0 0 * * 8", "field 'day-of-week' value 8 is out of range 0-7"),
        ("0 0-24 * * *", "field 'hour' value 24 is out of range 0-23"),
        ("*/0 * * * *", "field 'minute': step 0 in '*/0' is invalid (must be at least 1)"),
        ("*/x * * * *", "field 'minute': step 'x' in '*/x' is not a whole number"),
        ("1-5/ * * * *", "step '' in '1-5/' is not a whole number"),
        ("5-1 * * * *", "field 'minute': range '5-1' is reversed"),
        ("0 0 * * sat-sun", "field 'day-of-week': range 'sat-sun' is reversed"),
        ("0 0 * foo *", "field 'month': 'foo' is not a number 1-12 or a name jan-dec"),
        ("0 0 * * monday", "field 'day-of-week': 'monday' is not a number 0-7 or a name sun-sat"),
        ("mon * * * *", "field 'minute': 'mon' is not a number 0-59"),
        ("0 0 * jan * ", None),  # valid: a control row
        ("0 0 * * jan", "field 'day-of-week': 'jan' is not a number 0-7 or a name sun-sat"),
        ("1,,2 * * * *", "field 'minute': empty list element in '1,,2'"),
        ("0 0 ? * *", "field 'day-of-month': '?' is not a number 1-31"),
        ("0 0 L * *", "field 'day-of-month': 'L' is not a number 1-31"),
        ("0 0 * * 1#2", "field 'day-of-week': '1#2' is not a number 0-7"),
        ("-1 * * * *", "field 'minute': '' is not a number 0-59"),
        ("1.5 * * * *", "field 'minute': '1.5' is not a number 0-59"),
        ("²  * * * *", "field 'minute': '²' is not a number 0-59"),
        ("0 0 30 2 *", "it never fires: no month in '2' has a day '30'"),
        ("0 0 31 4,6,9,11 *", "it never fires"),
        ("0 0 31 feb */7", "it never fires"),
        ("@reboot", "unknown descriptor '@reboot' (allowed: @yearly, @annually"),
        ("@fortnightly", "@every <duration>"),
        ("@daily 5", "descriptor @daily takes no arguments, got '5'"),
        ("@every", "'@every' needs a duration"),
        ("@every 500ms", "sub-second intervals are not supported (minimum 1s)"),
        ("@every 0s", "@every duration '0s' is shorter than the minimum 1s"),
        ("@every 0h0m", "is shorter than the minimum 1s"),
        ("@every 32d", "@every duration '32d' is longer than the maximum 31d"),
        ("@every 31d1s", "is longer than the maximum 31d"),
        (
            "@every 5x",
            "@every duration '5x' is not valid: use whole units d, h, m, s in that order",
        ),
        ("@every 1.5h", "@every duration '1.5h' is not valid"),
        ("@every 30m1h", "@every duration '30m1h' is not valid"),
        ("@every -5m", "@every duration '-5m' is not valid"),
        ("@every 5 m", "@every duration '5 m' is not valid"),
    ],
)
def test_parse_errors_say_what_is_wrong(expression: str, message: str | None) -> None:
    if message is None:
        parse_schedule(expression)
        return
    with pytest.raises(ScheduleError) as caught:
        parse_schedule(expression)
    text = str(caught.value)
    assert message in text
    if expression.strip():
        assert text.startswith(f"invalid schedule {expression.strip()!r}: ")


def test_schedule_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="out of range"):
        parse_schedule("99 * * * *")


def test_non_string_expression_is_rejected() -> None:
    with pytest.raises(ScheduleError, match="must be a string"):
        Schedule(None)  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="must be a string"):
        Schedule("@daily", 5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Time zones
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
)
def test_valid_time_zones(name: str) -> None:
    assert validate_time_zone(name) == name
    assert parse_schedule("@daily", name).time_zone == name


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("Mars/Base", "unknown time zone 'Mars/Base' (expected an IANA name such as"),
        ("utc", "unknown time zone 'utc'"),
        ("Europe", "unknown time zone 'Europe'"),
        ("/etc/passwd", "unknown time zone '/etc/passwd'"),
        ("../../etc/passwd", "unknown time zone"),
        ("Europe/Berlin\x00", "unknown time zone"),
        ("", "invalid time zone ''"),
        (" UTC", "invalid time zone ' UTC'"),
        ("localtime", "time zone 'localtime' depends on the host"),
    ],
)
def test_invalid_time_zones(name: str, message: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        validate_time_zone(name)
    assert message in str(caught.value)
    with pytest.raises(ScheduleError):
        parse_schedule("@daily", name)


def test_cron_fields_are_read_on_the_zone_wall_clock() -> None:
    after = utc(2024, 7, 1)
    assert fires("0 9 * * *", after, 1, "UTC") == ["2024-07-01T09:00:00Z"]
    assert fires("0 9 * * *", after, 1, "Europe/Berlin") == ["2024-07-01T07:00:00Z"]  # CEST
    assert fires("0 9 * * *", after, 1, "America/New_York") == ["2024-07-01T13:00:00Z"]  # EDT
    assert fires("0 9 * * *", after, 1, "Asia/Kolkata") == ["2024-07-01T03:30:00Z"]
    assert fires("0 9 * * *", after, 1, "Australia/Lord_Howe") == ["2024-07-01T22:30:00Z"]
    # Day-of-week is the local day too: Monday 08:00 in Auckland is Sunday evening in UTC.
    assert fires("0 8 * * mon", utc(2024, 7, 1), 1, "Pacific/Auckland") == ["2024-07-07T20:00:00Z"]


def test_schedule_value_semantics() -> None:
    schedule = parse_schedule("  */5 * * * *  ", "Europe/Berlin")
    assert schedule == Schedule("*/5 * * * *", "Europe/Berlin")
    assert schedule.expression == "*/5 * * * *"
    assert hash(schedule) == hash(Schedule("*/5 * * * *", "Europe/Berlin"))
    assert Schedule("@daily").time_zone == "UTC"
    assert parse_schedule("@daily").time_zone == "UTC"
    assert dataclasses.asdict(schedule) == {
        "expression": "*/5 * * * *",
        "time_zone": "Europe/Berlin",
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        schedule.expression = "@daily"  # type: ignore[misc]
    with pytest.raises(ScheduleError):
        Schedule("61 * * * *")  # constructing directly validates too
    with pytest.raises(ScheduleError, match="unknown time zone"):
        dataclasses.replace(schedule, time_zone="Mars/Base")


# --------------------------------------------------------------------------------------------
# Invariants of next_after / latest_at_or_before
# --------------------------------------------------------------------------------------------

INVARIANT_EXPRESSIONS = [
    "* * * * *",
    "*/7 * * * *",
    "30 2 * * *",
    "0,30 1-3 * * *",
    "15 */3 * * mon-fri",
    "0 0 13 * fri",
    "0 0 29 2 *",
    "@weekly",
    "@every 90s",
    "@every 1h30m",
]
INVARIANT_ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]


@pytest.mark.parametrize("time_zone", INVARIANT_ZONES)
@pytest.mark.parametrize("expression", INVARIANT_EXPRESSIONS)
def test_next_and_latest_invariants(expression: str, time_zone: str) -> None:
    schedule = parse_schedule(expression, time_zone)
    rng = random.Random(f"{expression}|{time_zone}")
    start = utc(2024, 1, 1).timestamp()
    for _ in range(60):
        moment = datetime.fromtimestamp(start + rng.uniform(0, 366 * 86400), UTC)
        moment = moment.replace(microsecond=rng.choice([0, moment.microsecond]))
        nxt = schedule.next_after(moment)
        latest = schedule.latest_at_or_before(moment)
        assert latest is not None
        assert nxt.tzinfo is UTC
        assert latest.tzinfo is UTC
        assert latest <= moment < nxt
        assert schedule.next_after(latest) == nxt  # nothing between them
        assert schedule.latest_at_or_before(nxt) == nxt
        assert schedule.latest_at_or_before(nxt - timedelta(microseconds=1)) == latest
        if schedule.interval is None:
            assert nxt.second == nxt.microsecond == 0


def test_moments_in_other_zones_are_accepted_and_results_are_utc() -> None:
    schedule = parse_schedule("0 * * * *")
    moment = datetime(2024, 1, 1, 10, 30, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    assert schedule.next_after(moment) == utc(2024, 1, 1, 6)
    assert schedule.next_after(moment).tzinfo is UTC
    assert schedule.latest_at_or_before(moment) == utc(2024, 1, 1, 5)


def test_strictly_after_and_at_or_before() -> None:
    schedule = parse_schedule("0 * * * *")
    assert schedule.next_after(utc(2024, 1, 1, 5)) == utc(2024, 1, 1, 6)
    assert schedule.next_after(utc(2024, 1, 1, 4, 59, 59, 999999)) == utc(2024, 1, 1, 5)
    assert schedule.latest_at_or_before(utc(2024, 1, 1, 5)) == utc(2024, 1, 1, 5)
    assert schedule.latest_at_or_before(utc(2024, 1, 1, 5, 59, 59)) == utc(2024, 1, 1, 5)


def test_latest_at_or_before_reaches_far_back() -> None:
    assert parse_schedule("0 0 29 2 *").latest_at_or_before(utc(2104, 2, 28)) == utc(2096, 2, 29)
    assert parse_schedule("@yearly").latest_at_or_before(utc(2024, 12, 31, 23, 59)) == utc(
        2024, 1, 1
    )


def test_latest_at_or_before_none_before_the_calendar_starts() -> None:
    assert parse_schedule("0 0 2 1 *").latest_at_or_before(utc(1, 1, 1, 12)) is None


def test_naive_datetimes_are_rejected() -> None:
    schedule = parse_schedule("@daily")
    with pytest.raises(ValueError, match="timezone-aware"):
        schedule.next_after(datetime(2024, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        schedule.latest_at_or_before(datetime(2024, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        plan_recurring(schedule, None, datetime(2024, 1, 1), None)
    with pytest.raises(ValueError, match="last_slot must be a timezone-aware"):
        plan_recurring(schedule, datetime(2024, 1, 1), utc(2024, 1, 1), None)


# --------------------------------------------------------------------------------------------
# Daylight saving time
# --------------------------------------------------------------------------------------------
# Europe/Berlin 2024: spring forward 31 Mar 02:00 CET -> 03:00 CEST (01:00Z);
#                     fall back 27 Oct 03:00 CEST -> 02:00 CET (01:00Z).
# America/New_York 2024: 10 Mar 02:00 EST -> 03:00 EDT (07:00Z); 3 Nov 02:00 EDT -> 01:00 EST.
# Australia/Lord_Howe (30-minute shift): 6 Oct 2024 02:00 +10:30 -> 02:30 +11 (15:30Z);
#                     7 Apr 2024 02:00 +11 -> 01:30 +10:30 (15:00Z).


def test_gap_fires_once_at_the_instant_the_gap_ends() -> None:
    assert fires("30 2 * * *", utc(2024, 3, 29), 4, "Europe/Berlin") == [
        "2024-03-29T01:30:00Z",
        "2024-03-30T01:30:00Z",
        "2024-03-31T01:00:00Z",  # 02:30 does not exist: 03:00 CEST, the end of the gap
        "2024-04-01T00:30:00Z",
    ]
    schedule = parse_schedule("30 2 * * *", "Europe/Berlin")
    assert local(schedule.next_after(utc(2024, 3, 30, 12)), "Europe/Berlin") == (
        "2024-03-31 03:00+0200"
    )


def test_gap_merges_every_skipped_wall_time_into_one_fire() -> None:
    # 02:00 and 02:30 are both in the gap and 03:00 is the gap end: one fire for all three.
    assert fires("0,30 2,3 * * *", utc(2024, 3, 30, 12), 4, "Europe/Berlin") == [
        "2024-03-31T01:00:00Z",
        "2024-03-31T01:30:00Z",  # 03:30 CEST
        "2024-04-01T00:00:00Z",  # 02:00 CEST the next day
        "2024-04-01T00:30:00Z",
    ]


def test_hourly_across_spring_forward_fires_every_real_hour_once() -> None:
    schedule = parse_schedule("0 * * * *", "Europe/Berlin")
    slots = fires_between(schedule, utc(2024, 3, 30, 22, 30), utc(2024, 3, 31, 21, 59))
    assert [iso(slot) for slot in slots[:3]] == [
        "2024-03-30T23:00:00Z",  # 00:00 CET
        "2024-03-31T00:00:00Z",  # 01:00 CET
        "2024-03-31T01:00:00Z",  # 03:00 CEST (02:00 does not exist)
    ]
    assert len(slots) == 23  # the local day has 23 hours
    assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(slots))


def test_overlap_fires_once_at_the_first_occurrence() -> None:
    assert fires("30 2 * * *", utc(2024, 10, 26), 3, "Europe/Berlin") == [
        "2024-10-26T00:30:00Z",
        "2024-10-27T00:30:00Z",  # 02:30 CEST; 02:30 CET (01:30Z) does not fire again
        "2024-10-28T01:30:00Z",
    ]
    schedule = parse_schedule("30 2 * * *", "Europe/Berlin")
    # Asked during the second pass through 02:xx, the next fire is the next day.
    assert schedule.next_after(utc(2024, 10, 27, 1, 15)) == utc(2024, 10, 28, 1, 30)


def test_hourly_across_fall_back_fires_once_per_wall_clock_hour() -> None:
    schedule = parse_schedule("0 * * * *", "Europe/Berlin")
    slots = fires_between(schedule, utc(2024, 10, 26, 21, 30), utc(2024, 10, 27, 22, 30))
    assert [iso(slot) for slot in slots[1:5]] == [
        "2024-10-26T23:00:00Z",  # 01:00 CEST
        "2024-10-27T00:00:00Z",  # 02:00 CEST (first 02:00)
        "2024-10-27T02:00:00Z",  # 03:00 CET; the second 02:00 (01:00Z) is not fired
        "2024-10-27T03:00:00Z",
    ]
    in_local_day = [s for s in slots if local(s, "Europe/Berlin").startswith("2024-10-27")]
    assert len(in_local_day) == 24  # 25-hour day, 24 distinct wall-clock hours


def test_quarter_hours_in_the_overlap() -> None:
    assert fires("*/30 * * * *", utc(2024, 10, 26, 23, 45), 4, "Europe/Berlin") == [
        "2024-10-27T00:00:00Z",  # 02:00 CEST
        "2024-10-27T00:30:00Z",  # 02:30 CEST
        "2024-10-27T02:00:00Z",  # 03:00 CET (02:00/02:30 CET are repeats)
        "2024-10-27T02:30:00Z",
    ]


def test_latest_at_or_before_during_the_overlap() -> None:
    schedule = parse_schedule("0 * * * *", "Europe/Berlin")
    # 01:45Z is 02:45 CET, the second pass; the 02:00 fire was the first pass (00:00Z).
    assert schedule.latest_at_or_before(utc(2024, 10, 27, 1, 45)) == utc(2024, 10, 27, 0)
    assert schedule.latest_at_or_before(utc(2024, 10, 27, 2)) == utc(2024, 10, 27, 2)
    quarter = parse_schedule("*/15 * * * *", "Europe/Berlin")
    assert quarter.latest_at_or_before(utc(2024, 10, 27, 1, 20)) == utc(2024, 10, 27, 0, 45)
    assert quarter.next_after(utc(2024, 10, 27, 1, 20)) == utc(2024, 10, 27, 2)


def test_new_york_transitions() -> None:
    assert fires("30 2 * * *", utc(2024, 3, 9, 12), 2, "America/New_York") == [
        "2024-03-10T07:00:00Z",  # 03:00 EDT, the end of the gap
        "2024-03-11T06:30:00Z",
    ]
    assert fires("30 1 * * *", utc(2024, 11, 2, 12), 2, "America/New_York") == [
        "2024-11-03T05:30:00Z",  # 01:30 EDT only; 01:30 EST (06:30Z) does not fire
        "2024-11-04T06:30:00Z",
    ]


def test_lord_howe_half_hour_gap() -> None:
    zone = "Australia/Lord_Howe"
    assert fires("*/15 * * * *", utc(2024, 10, 5, 15), 4, zone) == [
        "2024-10-05T15:15:00Z",  # 01:45 +10:30
        "2024-10-05T15:30:00Z",  # 02:30 +11: 02:00, 02:15 (gap) and 02:30 are one fire
        "2024-10-05T15:45:00Z",
        "2024-10-05T16:00:00Z",
    ]
    assert fires("15 2 * * *", utc(2024, 10, 5), 2, zone) == [
        "2024-10-05T15:30:00Z",
        "2024-10-06T15:15:00Z",
    ]


def test_lord_howe_half_hour_overlap() -> None:
    zone = "Australia/Lord_Howe"
    assert fires("*/15 * * * *", utc(2024, 4, 6, 14), 4, zone) == [
        "2024-04-06T14:15:00Z",  # 01:15 +11
        "2024-04-06T14:30:00Z",  # 01:30 +11
        "2024-04-06T14:45:00Z",  # 01:45 +11; then 01:30 and 01:45 +10:30 are repeats
        "2024-04-06T15:30:00Z",  # 02:00 +10:30
    ]
    assert fires("45 1 * * *", utc(2024, 4, 6), 2, zone) == [
        "2024-04-06T14:45:00Z",
        "2024-04-07T15:15:00Z",
    ]


def test_a_whole_missing_day_fires_at_its_end() -> None:
    # Samoa skipped 30 December 2011 (-10 -> +14): the noon job fires once, when the gap ends.
    assert fires("0 12 * * *", utc(2011, 12, 28), 4, "Pacific/Apia") == [
        "2011-12-28T22:00:00Z",
        "2011-12-29T22:00:00Z",
        "2011-12-30T10:00:00Z",  # 31 Dec 00:00 +14, the end of the gap
        "2011-12-30T22:00:00Z",  # 31 Dec 12:00 +14
    ]


def reference_fires(
    matches: Callable[[datetime], bool], zone: ZoneInfo, start: datetime, minutes: int
) -> list[datetime]:
    """Minute-by-minute reference of the DST policy, written in terms of UTC instants.

    An instant fires when its wall time matches and it is that wall time's first occurrence, or
    when it ends a gap that swallowed a matching wall time.
    """
    out = []
    for step in range(minutes):
        instant = start + timedelta(minutes=step)
        wall = instant.astimezone(zone)
        fire = matches(wall) and wall.fold == 0
        before = (instant - timedelta(minutes=1)).astimezone(zone).utcoffset()
        after = wall.utcoffset()
        assert before is not None
        assert after is not None
        if after > before:  # a gap of wall times [instant+before, instant+after) ends here
            gap_wall = (instant + before).replace(tzinfo=None)
            while gap_wall < (instant + after).replace(tzinfo=None):
                fire = fire or matches(gap_wall)
                gap_wall += timedelta(minutes=1)
        if fire:
            out.append(instant)
    return out


@pytest.mark.parametrize(
    ("expression", "matches"),
    [
        ("* * * * *", lambda w: True),
        ("*/15 * * * *", lambda w: w.minute % 15 == 0),
        ("0 * * * *", lambda w: w.minute == 0),
        ("30 2 * * *", lambda w: (w.hour, w.minute) == (2, 30)),
        ("0,30 1-3 * * *", lambda w: w.minute in (0, 30) and 1 <= w.hour <= 3),
        ("45 0-4 * * sun", lambda w: w.minute == 45 and w.hour <= 4 and w.weekday() == 6),
    ],
)
@pytest.mark.parametrize(
    ("time_zone", "window_start"),
    [
        ("Europe/Berlin", utc(2024, 3, 30, 12)),
        ("Europe/Berlin", utc(2024, 10, 26, 12)),
        ("America/New_York", utc(2024, 3, 9, 12)),
        ("America/New_York", utc(2024, 11, 2, 12)),
        ("Australia/Lord_Howe", utc(2024, 4, 6)),
        ("Australia/Lord_Howe", utc(2024, 10, 5)),
        ("America/St_Johns", utc(2024, 3, 9, 12)),
        ("Asia/Kolkata", utc(2024, 3, 30)),
    ],
)
def test_dst_policy_matches_a_minute_by_minute_reference(
    expression: str, matches: Callable[[datetime], bool], time_zone: str, window_start: datetime
) -> None:
    zone = ZoneInfo(time_zone)
    minutes = 2 * 24 * 60
    expected = reference_fires(matches, zone, window_start, minutes)
    schedule = parse_schedule(expression, time_zone)
    window_end = window_start + timedelta(minutes=minutes - 1)
    assert fires_between(schedule, window_start - timedelta(microseconds=1), window_end) == (
        expected
    )
    # latest_at_or_before agrees with the reference at every minute of the window.
    for step in range(0, minutes, 7):
        moment = window_start + timedelta(minutes=step, seconds=30)
        before = [slot for slot in expected if slot <= moment]
        if before:
            assert schedule.latest_at_or_before(moment) == before[-1]


# --------------------------------------------------------------------------------------------
# plan_recurring: catch-up without bursts
# --------------------------------------------------------------------------------------------

MINUTELY = parse_schedule("* * * * *")


def test_new_schedule_does_not_fire_the_past() -> None:
    for deadline in (None, 3600.0, 0.0):
        plan = plan_recurring(MINUTELY, None, utc(2024, 1, 1, 10, 0, 0, 500), deadline)
        assert plan == SlotPlan(fire=None, skipped=0, next_slot=utc(2024, 1, 1, 10, 1))


def test_new_schedule_exactly_on_a_slot_starts_at_the_next_one() -> None:
    plan = plan_recurring(MINUTELY, None, utc(2024, 1, 1, 10), None)
    assert plan == SlotPlan(fire=None, skipped=0, next_slot=utc(2024, 1, 1, 10, 1))


def test_on_time_fire() -> None:
    plan = plan_recurring(MINUTELY, utc(2024, 1, 1, 10), utc(2024, 1, 1, 10, 1, 0, 200_000), 30)
    assert plan == SlotPlan(
        fire=utc(2024, 1, 1, 10, 1), skipped=0, next_slot=utc(2024, 1, 1, 10, 2)
    )


def test_slot_exactly_now_fires() -> None:
    plan = plan_recurring(MINUTELY, utc(2024, 1, 1, 10), utc(2024, 1, 1, 10, 1), 0.0)
    assert plan.fire == utc(2024, 1, 1, 10, 1)


def test_nothing_due_yet() -> None:
    plan = plan_recurring(MINUTELY, utc(2024, 1, 1, 10, 1), utc(2024, 1, 1, 10, 1, 59), None)
    assert plan == SlotPlan(fire=None, skipped=0, next_slot=utc(2024, 1, 1, 10, 2))


@pytest.mark.parametrize(
    ("deadline", "fire", "skipped"),
    [
        (None, utc(2024, 1, 1, 10, 30), 29),  # no deadline: the latest slot fires, once
        (30.0, utc(2024, 1, 1, 10, 30), 29),  # 20 s late, inside 30 s
        (20.0, utc(2024, 1, 1, 10, 30), 29),  # exactly at the deadline still fires
        (19.999, None, 30),  # past the deadline: nothing fires, every slot was skipped
        (0.0, None, 30),
    ],
)
def test_catch_up_after_downtime(
    deadline: float | None, fire: datetime | None, skipped: int
) -> None:
    plan = plan_recurring(MINUTELY, utc(2024, 1, 1, 10), utc(2024, 1, 1, 10, 30, 20), deadline)
    assert plan == SlotPlan(fire=fire, skipped=skipped, next_slot=utc(2024, 1, 1, 10, 31))


def test_never_a_burst() -> None:
    now = utc(2024, 1, 1, 12, 0, 5)
    first = plan_recurring(MINUTELY, utc(2024, 1, 1, 10), now, None)
    assert first.fire == utc(2024, 1, 1, 12)
    # The caller records the fired slot; asking again at the same moment fires nothing more.
    again = plan_recurring(MINUTELY, first.fire, now, None)
    assert again == SlotPlan(fire=None, skipped=0, next_slot=utc(2024, 1, 1, 12, 1))


def test_ticking_loop_with_downtime_fires_each_slot_at_most_once() -> None:
    schedule = parse_schedule("*/5 * * * *", "Europe/Berlin")
    last: datetime | None = None
    fired: list[datetime] = []
    skipped_total = 0
    now = utc(2024, 1, 1, 8, 0, 3)
    down = (utc(2024, 1, 1, 8, 31), utc(2024, 1, 1, 9, 7))  # the process is not running
    while now < utc(2024, 1, 1, 10):
        if not down[0] <= now < down[1]:
            plan = plan_recurring(schedule, last, now, 600.0)
            if last is None:
                last = plan.next_slot - timedelta(microseconds=1)  # the caller's start-up record
            if plan.fire is not None:
                fired.append(plan.fire)
                last = plan.fire
            skipped_total += plan.skipped
            assert plan.next_slot > now
        now += timedelta(seconds=7)
    assert fired == sorted(set(fired))
    after_downtime = [slot for slot in fired if down[0] <= slot < down[1]]
    assert after_downtime == [utc(2024, 1, 1, 9, 5)]  # only the latest missed slot, once
    assert skipped_total == 6  # 08:35 … 09:00
    assert utc(2024, 1, 1, 9, 10) in fired


def test_skipped_is_capped_for_cron() -> None:
    plan = plan_recurring(MINUTELY, utc(2024, 1, 1), utc(2024, 2, 1, 0, 0, 1), None)
    assert plan.fire == utc(2024, 2, 1)
    assert plan.skipped == SKIPPED_COUNT_CAP == 1000
    plan = plan_recurring(MINUTELY, utc(2024, 1, 1), utc(2024, 2, 1, 0, 0, 1), 0.5)
    assert plan.fire is None
    assert plan.skipped == SKIPPED_COUNT_CAP


def test_skipped_just_below_and_at_the_cap() -> None:
    start = utc(2024, 1, 1)
    plan = plan_recurring(MINUTELY, start, start + timedelta(minutes=1000), None)
    assert plan.skipped == 999
    plan = plan_recurring(MINUTELY, start, start + timedelta(minutes=1001), None)
    assert plan.skipped == 1000
    plan = plan_recurring(MINUTELY, start, start + timedelta(minutes=1000), 0.0)
    assert (plan.fire, plan.skipped) == (start + timedelta(minutes=1000), 999)
    plan = plan_recurring(MINUTELY, start, start + timedelta(minutes=1000, seconds=1), 0.0)
    assert (plan.fire, plan.skipped) == (None, 1000)


def test_skipped_is_exact_for_every() -> None:
    schedule = parse_schedule("@every 1s")
    plan = plan_recurring(schedule, utc(2024, 1, 1), utc(2024, 1, 2, 0, 0, 0, 300_000), 1.0)
    assert plan == SlotPlan(fire=utc(2024, 1, 2), skipped=86399, next_slot=utc(2024, 1, 2, 0, 0, 1))


def test_last_slot_off_the_grid_after_a_schedule_change() -> None:
    schedule = parse_schedule("0 * * * *")
    plan = plan_recurring(schedule, utc(2024, 1, 1, 9, 17), utc(2024, 1, 1, 11, 0, 30), None)
    assert plan == SlotPlan(fire=utc(2024, 1, 1, 11), skipped=1, next_slot=utc(2024, 1, 1, 12))


def test_last_slot_in_the_future_fires_nothing_and_waits_past_it() -> None:
    # Another replica with a clock ahead recorded 10:05 while our clock says 10:02:30.
    plan = plan_recurring(MINUTELY, utc(2024, 1, 1, 10, 5), utc(2024, 1, 1, 10, 2, 30), None)
    assert plan == SlotPlan(fire=None, skipped=0, next_slot=utc(2024, 1, 1, 10, 6))


def test_plan_across_the_dst_gap() -> None:
    schedule = parse_schedule("30 2 * * *", "Europe/Berlin")
    plan = plan_recurring(schedule, utc(2024, 3, 30, 1, 30), utc(2024, 3, 31, 1, 0, 10), 60)
    assert plan == SlotPlan(fire=utc(2024, 3, 31, 1), skipped=0, next_slot=utc(2024, 4, 1, 0, 30))


@pytest.mark.parametrize("deadline", [-1.0, float("nan"), float("inf")])
def test_plan_rejects_bad_deadlines(deadline: float) -> None:
    with pytest.raises(ValueError, match="starting_deadline"):
        plan_recurring(MINUTELY, None, utc(2024, 1, 1), deadline)


# --------------------------------------------------------------------------------------------
# retry_delay
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "backoff", "base"),
    [
        (1, 1.0, 1.0),
        (2, 1.0, 2.0),
        (3, 1.0, 4.0),
        (5, 1.0, 16.0),
        (9, 1.0, 256.0),
        (10, 1.0, 300.0),  # 512 capped
        (1, 10.0, 10.0),
        (4, 10.0, 80.0),
        (6, 10.0, 300.0),
        (1, 1000.0, 300.0),
        (10_000, 1.0, 300.0),  # no overflow for absurd attempt numbers
    ],
)
def test_retry_delay_bounds(attempt: int, backoff: float, base: float) -> None:
    rng = random.Random(attempt)
    samples = [retry_delay(attempt, backoff, rng) for _ in range(2000)]
    assert all(base / 2 <= sample <= base for sample in samples)
    # Jittered: the samples spread over the whole interval.
    assert min(samples) < base / 2 + base * 0.01
    assert max(samples) > base - base * 0.01


def test_retry_delay_is_deterministic_for_a_seed() -> None:
    first = [retry_delay(n, 2.0, random.Random(42)) for n in range(1, 8)]
    second = [retry_delay(n, 2.0, random.Random(42)) for n in range(1, 8)]
    assert first == second


def test_retry_delay_custom_cap_and_zero_backoff() -> None:
    rng = random.Random(1)
    assert all(2.5 <= retry_delay(8, 1.0, rng, cap_seconds=5.0) <= 5.0 for _ in range(100))
    assert retry_delay(3, 0.0, rng) == 0.0


@pytest.mark.parametrize(
    ("attempt", "backoff", "cap", "message"),
    [
        (0, 1.0, 300.0, "attempt must be >= 1"),
        (-1, 1.0, 300.0, "attempt must be >= 1"),
        (1, -1.0, 300.0, "backoff_seconds must be a finite number >= 0"),
        (1, float("nan"), 300.0, "backoff_seconds"),
        (1, 1.0, float("inf"), "cap_seconds must be a finite number >= 0"),
        (1, 1.0, -5.0, "cap_seconds"),
    ],
)
def test_retry_delay_rejects_bad_arguments(
    attempt: int, backoff: float, cap: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        retry_delay(attempt, backoff, random.Random(0), cap_seconds=cap)


# --------------------------------------------------------------------------------------------
# classify / decide
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (100, "permanent"),
        (199, "permanent"),
        (200, "success"),
        (201, "success"),
        (204, "success"),
        (299, "success"),
        (301, "permanent"),
        (304, "permanent"),
        (400, "permanent"),
        (401, "permanent"),
        (404, "permanent"),
        (408, "retryable"),
        (409, "permanent"),
        (422, "permanent"),
        (429, "retryable"),
        (500, "retryable"),
        (502, "retryable"),
        (503, "retryable"),
        (599, "retryable"),
        (600, "permanent"),
        (None, "retryable"),
    ],
)
def test_classify(status: int | None, expected: str) -> None:
    assert classify(AttemptResult(status=status, error=None)) == expected


NOW = utc(2024, 1, 1, 12, 0, 0)


class Row(TypedDict, total=False):
    """The row settings decide() reads, any of which a test may set (ROW's otherwise)."""

    attempt: int
    max_attempts: int
    backoff_seconds: float
    due_at: datetime
    starting_deadline: float | None


ROW = Row(attempt=1, max_attempts=3, backoff_seconds=10.0, due_at=NOW, starting_deadline=None)


def run_decide(result: AttemptResult, *, seed: int = 7, **row: Unpack[Row]) -> Decision:
    """decide() at NOW for a row with ROW's settings but for ``row``, its jitter seeded."""
    return decide(result, **(ROW | row), now=NOW, rng=random.Random(seed))


@pytest.mark.parametrize("status", [200, 202, 204])
def test_decide_success(status: int) -> None:
    assert run_decide(AttemptResult(status, None)) == Decision(Outcome.PUBLISHED, None, None)


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (404, "HTTP 404 from app (not retried)"),
        (400, "HTTP 400 from app (not retried)"),
        (301, "HTTP 301 from app (not retried)"),
        (100, "HTTP 100 from app (not retried)"),
    ],
)
def test_decide_permanent_failure_is_not_retried(status: int, error: str) -> None:
    decision = run_decide(AttemptResult(status, None), attempt=1, max_attempts=5)
    assert decision == Decision(Outcome.FAILED, None, error)


def test_decide_retry() -> None:
    decision = run_decide(AttemptResult(503, None), attempt=2, backoff_seconds=10.0, seed=3)
    expected_delay = retry_delay(2, 10.0, random.Random(3))
    assert decision == Decision(
        Outcome.RETRY, NOW + timedelta(seconds=expected_delay), "HTTP 503 from app"
    )
    assert decision.outcome is Outcome.RETRY
    assert decision.next_attempt_at is not None
    assert timedelta(seconds=10) <= decision.next_attempt_at - NOW <= timedelta(seconds=20)
    assert decision.error == "HTTP 503 from app"


@pytest.mark.parametrize(
    ("result", "error"),
    [
        (AttemptResult(None, "timeout after 10s"), "timeout after 10s"),
        (AttemptResult(None, "connection refused"), "connection refused"),
        (AttemptResult(None, None), "no response from app"),
        (AttemptResult(429, "rate limited"), "HTTP 429 from app: rate limited"),
        (AttemptResult(408, None), "HTTP 408 from app"),
    ],
)
def test_decide_retry_error_text(result: AttemptResult, error: str) -> None:
    decision = run_decide(result)
    assert decision.outcome is Outcome.RETRY
    assert decision.error == error


def test_decide_gives_up_after_max_attempts() -> None:
    decision = run_decide(AttemptResult(503, None), attempt=3, max_attempts=3)
    assert decision == Decision(Outcome.FAILED, None, "gave up after 3 attempts: HTTP 503 from app")
    single = run_decide(AttemptResult(None, "timeout after 10s"), attempt=1, max_attempts=1)
    assert single == Decision(Outcome.FAILED, None, "gave up after 1 attempt: timeout after 10s")
    beyond = run_decide(AttemptResult(500, None), attempt=4, max_attempts=3)
    assert beyond.outcome is Outcome.FAILED


def test_decide_retry_after_the_deadline_is_missed() -> None:
    # Due 55 s ago with a 60 s deadline: the earliest retry (>= 5 s, half the 10 s base) is late.
    decision = run_decide(
        AttemptResult(503, None),
        due_at=NOW - timedelta(seconds=55),
        starting_deadline=60.0,
        backoff_seconds=10.0,
    )
    assert decision.outcome is Outcome.MISSED
    assert decision.next_attempt_at is None
    assert decision.error is not None
    assert decision.error.startswith("retry would start after the starting deadline (60s after ")
    assert "2024-01-01T11:59:05Z" in decision.error
    assert decision.error.endswith("last error: HTTP 503 from app")


def test_decide_retry_inside_the_deadline() -> None:
    decision = run_decide(
        AttemptResult(None, "timeout after 10s"),
        due_at=NOW - timedelta(seconds=30),
        starting_deadline=60.0,
        backoff_seconds=10.0,  # retry within 5-10 s -> at most 40 s after due_at
    )
    assert decision.outcome is Outcome.RETRY


def test_decide_deadline_boundary_uses_the_actual_delay() -> None:
    seed = 11
    delay = retry_delay(1, 10.0, random.Random(seed))
    at_limit = run_decide(
        AttemptResult(500, None),
        due_at=NOW,
        starting_deadline=delay,
        seed=seed,
    )
    assert at_limit.outcome is Outcome.RETRY  # starting exactly at the deadline is allowed
    just_over = run_decide(
        AttemptResult(500, None),
        due_at=NOW - timedelta(microseconds=10),
        starting_deadline=delay,
        seed=seed,
    )
    assert just_over.outcome is Outcome.MISSED


def test_decide_gives_up_before_checking_the_deadline() -> None:
    decision = run_decide(
        AttemptResult(503, None),
        attempt=3,
        max_attempts=3,
        due_at=NOW - timedelta(hours=1),
        starting_deadline=1.0,
    )
    assert decision.outcome is Outcome.FAILED


@pytest.mark.parametrize(("attempt", "max_attempts"), [(0, 3), (1, 0)])
def test_decide_rejects_bad_counts(attempt: int, max_attempts: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        run_decide(AttemptResult(500, None), attempt=attempt, max_attempts=max_attempts)


def test_outcome_values() -> None:
    assert [outcome.value for outcome in Outcome] == ["published", "retry", "failed", "missed"]
    assert str(Outcome.PUBLISHED) == f"{Outcome.PUBLISHED}" == "published"
    assert Outcome("missed") is Outcome.MISSED
    assert isinstance(Outcome.RETRY, str)


# --------------------------------------------------------------------------------------------
# Deadlines and idempotency keys
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "deadline", "expected"),
    [
        (NOW, 0.0, False),
        (NOW + timedelta(microseconds=1), 0.0, True),
        (NOW + timedelta(seconds=30), 30.0, False),
        (NOW + timedelta(seconds=30, microseconds=1), 30.0, True),
        (NOW - timedelta(hours=1), 30.0, False),
        (NOW + timedelta(days=3650), None, False),
    ],
)
def test_is_past_deadline(now: datetime, deadline: float | None, expected: bool) -> None:
    assert is_past_deadline(NOW, deadline, now) is expected


def test_idempotency_key() -> None:
    due = utc(2024, 3, 31, 1, 0)
    assert idempotency_key("7c9e6679-7425", due) == "7c9e6679-7425/2024-03-31T01:00:00.000000Z"
    berlin = due.astimezone(ZoneInfo("Europe/Berlin"))
    assert idempotency_key("7c9e6679-7425", berlin) == idempotency_key("7c9e6679-7425", due)
    assert idempotency_key("u", utc(2024, 1, 1, 0, 0, 0, 1234)) == "u/2024-01-01T00:00:00.001234Z"
    assert idempotency_key("a", due) != idempotency_key("b", due)
    assert idempotency_key("a", due) != idempotency_key("a", due + timedelta(microseconds=1))
    with pytest.raises(ValueError, match="timezone-aware"):
        idempotency_key("a", datetime(2024, 1, 1))
    with pytest.raises(ValueError, match="uid"):
        idempotency_key("", due)
