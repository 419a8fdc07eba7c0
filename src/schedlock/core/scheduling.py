"""The pure core of the scheduler: schedule expressions, slot planning, retries and outcomes.

Everything here is a function of its arguments.  There is no I/O, no clock read (every function
that needs the current time takes an explicit ``now``) and no randomness except through an
injected :class:`random.Random`.  Only the standard library is used.

Invariants
==========

* Every instant taken or returned is timezone-aware; returned instants are in UTC.  A naive
  datetime argument is a programming error and raises :class:`ValueError`.
* ``Schedule.next_after(m)`` is the first fire time strictly after ``m``;
  ``Schedule.latest_at_or_before(m)`` is the last fire time at or before ``m``.  Fire times of one
  schedule strictly increase, and ``next_after(latest_at_or_before(m)) > m`` always holds.
  Both search :data:`CRON_HORIZON_YEARS`, enough for every expression the parser accepts, so
  ``latest_at_or_before`` is None only before the first fire time of the calendar (year 1).
* Cron fire times fall on whole minutes.  ``@every`` fire times lie on a grid of multiples of the
  interval counted from the Unix epoch (1970-01-01T00:00:00Z), whatever the time zone, so every
  replica and every restart agrees on the slots.
* :func:`plan_recurring` fires at most one slot per call and never a burst: after downtime only
  the latest missed slot may fire, and only while it is inside its starting deadline.  It never
  fires a slot at or before ``last_slot`` and never fires a past slot for a brand-new schedule.
* :func:`retry_delay` never returns less than half of, nor more than, the capped exponential base.
* :func:`decide` never schedules a retry that would start after the slot's starting deadline.

Schedule expressions
====================

* Standard 5-field cron: ``minute hour day-of-month month day-of-week`` with ``*``, lists
  ``a,b``, ranges ``a-b``, steps ``*/n``, ``a-b/n`` and ``a/n`` (= ``a-<max>/n``), month names
  ``jan``-``dec`` and day names ``sun``-``sat`` (case-insensitive).  Day-of-week is 0-7, where 0
  and 7 are both Sunday.  A 6-field (seconds) cron is rejected; ``@every`` covers sub-minute work.
* Vixie-cron day rule: when both day-of-month and day-of-week are restricted, a day matches when
  *either* matches; otherwise both must match.  As in Vixie cron and cronie ("restricted" means
  "does not contain ``*``"), a field such as ``*/2`` counts as unrestricted.
* Descriptors: ``@yearly``/``@annually``, ``@monthly``, ``@weekly``, ``@daily``/``@midnight``,
  ``@hourly`` (case-insensitive).
* ``@every <duration>``: whole units ``d``, ``h``, ``m``, ``s`` in that order (``90s``, ``5m``,
  ``1h30m``, ``2d``); minimum 1 s, maximum 31 days.
* An expression that can never fire (``0 0 30 2 *``) is rejected when parsed.

Cron fields are evaluated on the wall clock of the schedule's IANA time zone (default UTC).

Daylight-saving policy
======================

Candidate wall-clock times (every combination of matching day, hour and minute) are enumerated in
wall-clock order and each is mapped to one UTC instant:

* A wall time that occurs once maps to that instant.
* A wall time that occurs twice (the fall-back overlap, e.g. 02:30 on the last Sunday of October
  in Europe/Berlin) maps to its *first* occurrence (``fold=0``); the repeat does not fire again.
* A wall time that does not exist (the spring-forward gap, e.g. 02:30 on the last Sunday of March
  in Europe/Berlin) maps to the instant the gap ends (03:00 CEST there), like Vixie cron, so a
  daily job never silently skips a day.

The mapping never decreases, and instants that coincide are merged, so each fire happens once:
``30 2 * * *`` fires once at 03:00 on the spring-forward day, ``0,30 2 * * *`` fires once there
too, and ``0 * * * *`` fires 23 times on a 23-hour day (02:00 and 03:00 are the same instant) and
24 times on a 25-hour day (the repeated 02:00 hour is not fired twice).

Catch-up
========

A brand-new schedule (``last_slot`` None) starts at its next future slot.  Otherwise the latest
slot ``L`` in ``(last_slot, now]`` fires once if there is no starting deadline or
``now - L <= starting_deadline``; ``SlotPlan.next_slot`` is the first slot strictly after
``max(now, last_slot)`` (after ``now`` unless another replica's clock ran ahead).
``plan_recurring`` counts the slots it passes over in ``SlotPlan.skipped``.  For ``@every`` the
count is exact (arithmetic on the grid); for cron the slots are enumerated and the count stops at
:data:`SKIPPED_COUNT_CAP` (a value equal to the cap means "at least that many").
"""

from __future__ import annotations

import bisect
import calendar
import functools
import math
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo
from enum import StrEnum
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from schedlock.core.identities import rfc3339

__all__ = [
    "CRON_HORIZON_YEARS",
    "MAX_EVERY_SECONDS",
    "MIN_EVERY_SECONDS",
    "SKIPPED_COUNT_CAP",
    "AttemptResult",
    "Decision",
    "Outcome",
    "Schedule",
    "ScheduleError",
    "SlotPlan",
    "classify",
    "decide",
    "idempotency_key",
    "is_past_deadline",
    "parse_schedule",
    "plan_recurring",
    "retry_delay",
    "validate_time_zone",
]

MIN_EVERY_SECONDS = 1
MAX_EVERY_SECONDS = 31 * 24 * 3600
SKIPPED_COUNT_CAP = 1000
# How far next_after / latest_at_or_before search.  Every expression accepted by the parser fires
# at least once in any 100-year window (29 February on a given weekday recurs within ~40 years).
CRON_HORIZON_YEARS = 100

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_SECOND = timedelta(seconds=1)
_CRON_FIELD_NAMES = "minute hour day-of-month month day-of-week"


class ScheduleError(ValueError):
    """A schedule expression or time zone that cannot be used; the message says what is allowed."""


# --------------------------------------------------------------------------------------------
# Time zones
# --------------------------------------------------------------------------------------------


def validate_time_zone(name: str) -> str:
    """Return ``name`` if it is a usable IANA time zone name, else raise :class:`ScheduleError`."""
    hint = "expected an IANA name such as 'Europe/Berlin' or 'UTC'"
    if not isinstance(name, str) or not name or name != name.strip():
        raise ScheduleError(f"invalid time zone {name!r} ({hint})")
    if name == "localtime":  # the host's zone, not an IANA name: differs between nodes
        raise ScheduleError(f"time zone 'localtime' depends on the host ({hint})")
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(f"unknown time zone {name!r} ({hint})") from None
    return name


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------

_MONTH_NAMES = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
_DAY_NAMES = {
    name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
}
_NUMBER = re.compile(r"[0-9]+")
_DURATION = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
_SUBSECOND = re.compile(r"[0-9.]+(?:ms|us|µs|ns)")
_DESCRIPTORS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_ALLOWED_DESCRIPTORS = ", ".join([*_DESCRIPTORS, "@every <duration>"])


@dataclass(frozen=True)
class _FieldSpec:
    name: str
    low: int
    high: int
    names: dict[str, int] | None = None
    names_hint: str = ""


_FIELD_SPECS = (
    _FieldSpec("minute", 0, 59),
    _FieldSpec("hour", 0, 23),
    _FieldSpec("day-of-month", 1, 31),
    _FieldSpec("month", 1, 12, _MONTH_NAMES, "jan-dec"),
    _FieldSpec("day-of-week", 0, 7, _DAY_NAMES, "sun-sat"),
)


def _field_value(token: str, spec: _FieldSpec) -> int:
    if _NUMBER.fullmatch(token):
        value = int(token)
        if not spec.low <= value <= spec.high:
            raise ScheduleError(
                f"field {spec.name!r} value {value} is out of range {spec.low}-{spec.high}"
            )
        return value
    if spec.names is not None and token.lower() in spec.names:
        return spec.names[token.lower()]
    names = f" or a name {spec.names_hint}" if spec.names_hint else ""
    raise ScheduleError(
        f"field {spec.name!r}: {token!r} is not a number {spec.low}-{spec.high}{names}"
    )


def _parse_field(text: str, spec: _FieldSpec) -> tuple[frozenset[int], bool]:
    """The values a cron field allows, and whether it contains ``*`` (is "unrestricted")."""
    values: set[int] = set()
    star = False
    for element in text.split(","):
        if not element:
            raise ScheduleError(f"field {spec.name!r}: empty list element in {text!r}")
        base, slash, step_text = element.partition("/")
        step = 1
        if slash:
            if not _NUMBER.fullmatch(step_text):
                raise ScheduleError(
                    f"field {spec.name!r}: step {step_text!r} in {element!r} "
                    "is not a whole number (use */n or a-b/n with n >= 1)"
                )
            step = int(step_text)
            if step < 1:
                raise ScheduleError(
                    f"field {spec.name!r}: step 0 in {element!r} is invalid (must be at least 1)"
                )
        if base == "*":
            start, end = spec.low, spec.high
            star = True
        elif "-" in base:
            first, _, last = base.partition("-")
            start, end = _field_value(first, spec), _field_value(last, spec)
            if start > end:
                raise ScheduleError(
                    f"field {spec.name!r}: range {base!r} is reversed "
                    "(the start must not be after the end)"
                )
        else:
            start = _field_value(base, spec)
            end = spec.high if slash else start
        values.update(range(start, end + 1, step))
    return frozenset(values), star


@dataclass(frozen=True)
class _Cron:
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday … 6 = Saturday
    either_day: bool  # Vixie rule: both day fields restricted -> a day matches when either does
    every_day: bool  # no day restriction at all (fast path)

    def day_matches(self, year: int, month: int, day: int) -> bool:
        if self.every_day:
            return True
        in_days = day in self.days
        if self.either_day and in_days:
            return True
        if not self.either_day and not in_days:
            return False
        return (date(year, month, day).weekday() + 1) % 7 in self.weekdays


def _parse_cron(text: str) -> _Cron:
    fields = text.split()
    if len(fields) == 6:
        raise ScheduleError(
            "6 fields given, but a seconds field is not supported: use 5 fields "
            f"({_CRON_FIELD_NAMES}) or '@every <n>s' for sub-minute intervals"
        )
    if len(fields) != 5:
        raise ScheduleError(
            f"{len(fields)} field{'s' if len(fields) != 1 else ''} given; expected 5 "
            f"({_CRON_FIELD_NAMES}), a descriptor such as @daily, or '@every <duration>'"
        )
    parsed = [_parse_field(text, spec) for text, spec in zip(fields, _FIELD_SPECS, strict=True)]
    (minutes, _), (hours, _), (days, days_star), (months, _), (weekdays, weekdays_star) = parsed
    weekdays = frozenset(day % 7 for day in weekdays)  # 7 is Sunday too
    either_day = not days_star and not weekdays_star
    if not either_day and not any(
        day <= _max_days(month) for month in months for day in days
    ):  # both must match, and no allowed month has an allowed day of the month
        raise ScheduleError(f"it never fires: no month in {fields[3]!r} has a day {fields[2]!r}")
    return _Cron(
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=days,
        months=months,
        weekdays=weekdays,
        either_day=either_day,
        every_day=len(days) == 31 and len(weekdays) == 7,
    )


def _max_days(month: int) -> int:
    return 29 if month == 2 else calendar.monthrange(2001, month)[1]


def _parse_every(text: str) -> int:
    """Whole seconds of an ``@every`` duration."""
    allowed = (
        "use whole units d, h, m, s in that order, e.g. '90s', '5m', '1h30m' "
        f"(minimum {MIN_EVERY_SECONDS}s, maximum 31d)"
    )
    if not text:
        raise ScheduleError(f"'@every' needs a duration: {allowed}")
    if _SUBSECOND.fullmatch(text):
        raise ScheduleError(
            f"@every duration {text!r}: sub-second intervals are not supported "
            f"(minimum {MIN_EVERY_SECONDS}s)"
        )
    match = _DURATION.fullmatch(text)
    if not text or match is None:
        raise ScheduleError(f"@every duration {text!r} is not valid: {allowed}")
    days, hours, minutes, seconds = (int(group or 0) for group in match.groups())
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total < MIN_EVERY_SECONDS:
        raise ScheduleError(
            f"@every duration {text!r} is shorter than the minimum {MIN_EVERY_SECONDS}s"
        )
    if total > MAX_EVERY_SECONDS:
        raise ScheduleError(f"@every duration {text!r} is longer than the maximum 31d")
    return total


def _parse_expression(expression: str) -> _Cron | timedelta:
    text = expression.strip()
    if not text:
        raise ScheduleError(
            f"empty schedule expression; expected 5 cron fields ({_CRON_FIELD_NAMES}) "
            "or a descriptor such as @daily or '@every 5m'"
        )
    try:
        if text.startswith("@"):
            word, *more = text.split(maxsplit=1)
            word, rest = word.lower(), more[0] if more else ""
            if word == "@every":
                return timedelta(seconds=_parse_every(rest.strip()))
            if word in _DESCRIPTORS and not rest.strip():
                return _parse_cron(_DESCRIPTORS[word])
            if word in _DESCRIPTORS:
                raise ScheduleError(f"descriptor {word} takes no arguments, got {rest.strip()!r}")
            raise ScheduleError(f"unknown descriptor {word!r} (allowed: {_ALLOWED_DESCRIPTORS})")
        return _parse_cron(text)
    except ScheduleError as error:
        raise ScheduleError(f"invalid schedule {text!r}: {error}") from None


# --------------------------------------------------------------------------------------------
# Schedules
# --------------------------------------------------------------------------------------------


def _utc(moment: datetime, what: str = "moment") -> datetime:
    if not isinstance(moment, datetime) or moment.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, got {moment!r}")
    return moment.astimezone(UTC)


def _wall_to_utc(wall: datetime, zone: tzinfo) -> datetime:
    """Map a naive wall-clock time in ``zone`` to UTC under the DST policy of this module."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return first  # exists; for a repeated wall time fold=0 is the first occurrence
    # In a spring-forward gap: fire at the instant the gap ends (the transition itself).
    # fold=0 and fold=1 straddle the transition; find it by bisection over whole seconds.
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    low, high = min(first, second), max(first, second)
    before = low.astimezone(zone).utcoffset()
    low_s, high_s = (low - _EPOCH) // _ONE_SECOND, (high - _EPOCH) // _ONE_SECOND
    while high_s - low_s > 1:
        middle = (low_s + high_s) // 2
        if (_EPOCH + timedelta(seconds=middle)).astimezone(zone).utcoffset() == before:
            low_s = middle
        else:
            high_s = middle
    return _EPOCH + timedelta(seconds=high_s)


@functools.lru_cache(maxsize=1024)
def _compile(expression: str, time_zone: str) -> tuple[_Cron | timedelta, ZoneInfo]:
    """Parse an expression and load its zone (memoised: schedules are re-read on every tick)."""
    rule = _parse_expression(expression)
    return rule, ZoneInfo(validate_time_zone(time_zone))


@dataclass(frozen=True)
class Schedule:
    """A validated schedule expression and the IANA time zone its cron fields are read in.

    Constructing one validates it (:class:`ScheduleError` on a bad expression or zone);
    :func:`parse_schedule` is the usual way in.
    """

    expression: str
    time_zone: str = "UTC"

    def __post_init__(self) -> None:
        if not isinstance(self.expression, str):
            raise ScheduleError(f"a schedule expression must be a string, not {self.expression!r}")
        if not isinstance(self.time_zone, str):
            raise ScheduleError(f"a time zone must be a string, not {self.time_zone!r}")
        _compile(self.expression, self.time_zone)  # validates; the result is memoised

    @property
    def interval(self) -> timedelta | None:
        """The ``@every`` interval, or None for a cron schedule."""
        rule = _compile(self.expression, self.time_zone)[0]
        return rule if isinstance(rule, timedelta) else None

    def next_after(self, moment: datetime) -> datetime:
        """The first fire time strictly after ``moment``, in UTC."""
        for slot in self._slots_after(_utc(moment)):
            return slot
        raise ScheduleError(  # unreachable for parsed schedules short of year 9999
            f"schedule {self.expression!r} has no fire time within "
            f"{CRON_HORIZON_YEARS} years after {rfc3339(_utc(moment))}"
        )

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        """The last fire time at or before ``moment``, in UTC (used for catch-up).

        ``@every`` always has one.  Cron searches back :data:`CRON_HORIZON_YEARS`, which covers
        every valid expression, so None means only "no fire time before the start of the
        calendar" in practice.
        """
        moment = _utc(moment)
        rule, zone = _compile(self.expression, self.time_zone)
        if isinstance(rule, timedelta):
            return _EPOCH + rule * ((moment - _EPOCH) // rule)
        start = moment.astimezone(zone).replace(tzinfo=None, second=0, microsecond=0)
        # Every wall time at or before the moment's wall clock maps at or before the moment, so
        # the first candidate walking backwards is a fire time <= moment.  It is the latest one
        # except inside a fall-back overlap (later wall times may map to the first pass), so walk
        # forwards from it while fire times stay <= moment.
        for wall in _walls_descending(rule, start):
            latest = _wall_to_utc(wall, zone)
            for slot in self._slots_after(latest):
                if slot > moment:
                    break
                latest = slot
            return latest
        return None

    def _slots_after(self, moment: datetime) -> Iterator[datetime]:
        """Fire times strictly after the UTC ``moment``, increasing, without duplicates."""
        rule, zone = _compile(self.expression, self.time_zone)
        if isinstance(rule, timedelta):
            slot = _EPOCH + rule * ((moment - _EPOCH) // rule + 1)
            while True:
                yield slot
                slot += rule
        start = moment.astimezone(zone).replace(tzinfo=None, second=0, microsecond=0)
        # Wall times before the moment's wall clock map at or before the moment: start there.
        previous = moment
        for wall in _walls_ascending(rule, start):
            slot = _wall_to_utc(wall, zone)
            if slot > previous:
                previous = slot
                yield slot


def _walls_ascending(cron: _Cron, start: datetime) -> Iterator[datetime]:
    """Matching naive wall-clock minutes at or after ``start``, in increasing order."""
    year, month, first_day = start.year, start.month, start.day
    for _ in range(12 * CRON_HORIZON_YEARS + 1):
        if month in cron.months:
            for day in range(first_day, calendar.monthrange(year, month)[1] + 1):
                if not cron.day_matches(year, month, day):
                    continue
                on_start_day = (year, month, day) == (start.year, start.month, start.day)
                hours = cron.hours
                if on_start_day:
                    hours = hours[bisect.bisect_left(hours, start.hour) :]
                for hour in hours:
                    minutes = cron.minutes
                    if on_start_day and hour == start.hour:
                        minutes = minutes[bisect.bisect_left(minutes, start.minute) :]
                    for minute in minutes:
                        yield datetime(year, month, day, hour, minute)
        first_day = 1
        year, month = (year, month + 1) if month < 12 else (year + 1, 1)
        if year > 9999:
            return


def _walls_descending(cron: _Cron, start: datetime) -> Iterator[datetime]:
    """Matching naive wall-clock minutes at or before ``start``, in decreasing order."""
    year, month, last_day = start.year, start.month, start.day
    for _ in range(12 * CRON_HORIZON_YEARS + 1):
        if month in cron.months:
            for day in range(last_day, 0, -1):
                if not cron.day_matches(year, month, day):
                    continue
                on_start_day = (year, month, day) == (start.year, start.month, start.day)
                hours = cron.hours
                if on_start_day:
                    hours = hours[: bisect.bisect_right(hours, start.hour)]
                for hour in reversed(hours):
                    minutes = cron.minutes
                    if on_start_day and hour == start.hour:
                        minutes = minutes[: bisect.bisect_right(minutes, start.minute)]
                    for minute in reversed(minutes):
                        yield datetime(year, month, day, hour, minute)
        year, month = (year, month - 1) if month > 1 else (year - 1, 12)
        if year < 1:
            return
        last_day = calendar.monthrange(year, month)[1]


def parse_schedule(expression: str, time_zone: str = "UTC") -> Schedule:
    """Validate and compile a schedule; raises :class:`ScheduleError` saying what is wrong."""
    if isinstance(expression, str):
        expression = expression.strip()
    return Schedule(expression, time_zone)


# --------------------------------------------------------------------------------------------
# Catch-up planning
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotPlan:
    """What to do about a recurring schedule at ``now``."""

    fire: datetime | None  # the slot to fire now (at most one), or None
    skipped: int  # slots passed over (missed during downtime), capped for cron
    next_slot: datetime  # the first slot strictly after max(now, last_slot)


def _check_deadline(starting_deadline: float | None) -> None:
    if starting_deadline is not None and not (
        math.isfinite(starting_deadline) and starting_deadline >= 0
    ):
        raise ValueError(
            f"starting_deadline must be None or a finite number >= 0, got {starting_deadline!r}"
        )


def plan_recurring(
    schedule: Schedule,
    last_slot: datetime | None,
    now: datetime,
    starting_deadline: float | None,
) -> SlotPlan:
    """Decide which slot, if any, to fire at ``now``: the latest missed one, once, never a burst.

    ``last_slot`` is the latest slot already materialised (None for a brand-new schedule, which
    starts at its next future slot and never fires the past).  Otherwise the latest slot ``L``
    with ``last_slot < L <= now`` fires when ``starting_deadline`` is None or
    ``now - L <= starting_deadline`` seconds; all other slots in ``(last_slot, now]`` are counted
    in ``skipped``.
    """
    now = _utc(now, "now")
    _check_deadline(starting_deadline)
    if last_slot is None:
        return SlotPlan(fire=None, skipped=0, next_slot=schedule.next_after(now))
    last_slot = _utc(last_slot, "last_slot")
    next_slot = schedule.next_after(max(now, last_slot))
    latest = schedule.latest_at_or_before(now)
    if latest is None or latest <= last_slot:
        return SlotPlan(fire=None, skipped=0, next_slot=next_slot)
    fire: datetime | None = latest
    if starting_deadline is not None and (now - latest).total_seconds() > starting_deadline:
        fire = None
    skipped = _count_slots(schedule, last_slot, now) - (1 if fire is not None else 0)
    if schedule.interval is None:
        skipped = min(skipped, SKIPPED_COUNT_CAP)
    return SlotPlan(fire=fire, skipped=skipped, next_slot=next_slot)


def _count_slots(schedule: Schedule, after: datetime, until: datetime) -> int:
    """Slots in ``(after, until]``: exact for @every, at most ``SKIPPED_COUNT_CAP + 1`` for cron."""
    interval = schedule.interval
    if interval is not None:
        return (until - _EPOCH) // interval - (after - _EPOCH) // interval
    count = 0
    for slot in schedule._slots_after(after):
        if slot > until or count > SKIPPED_COUNT_CAP:
            break
        count += 1
    return count


# --------------------------------------------------------------------------------------------
# Delivery attempts
# --------------------------------------------------------------------------------------------


def retry_delay(
    attempt: int, backoff_seconds: float, rng: random.Random, *, cap_seconds: float = 300.0
) -> float:
    """Seconds to wait before retrying after failed attempt number ``attempt`` (1-based).

    ``base = min(cap_seconds, backoff_seconds * 2 ** (attempt - 1))``; the result is uniform in
    ``[base / 2, base]``: jittered so replicas spread out, never below half the base (no
    hammering) and never above the cap.
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1 (the attempt that just failed), got {attempt}")
    for name, value in (("backoff_seconds", backoff_seconds), ("cap_seconds", cap_seconds)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    base = min(cap_seconds, backoff_seconds * 2.0 ** min(attempt - 1, 1000))
    return rng.uniform(base / 2, base)


class Outcome(StrEnum):
    """The state a delivery ends in (or RETRY while it has more attempts)."""

    PUBLISHED = "published"
    RETRY = "retry"
    FAILED = "failed"
    MISSED = "missed"


@dataclass(frozen=True)
class AttemptResult:
    """What one HTTP delivery produced."""

    status: int | None  # HTTP status; None when there was no response
    error: str | None = None  # short text for no-response cases, e.g. "timeout after 10s"


def classify(result: AttemptResult) -> Literal["success", "retryable", "permanent"]:
    """2xx succeeds; 408, 429, 5xx and no response are retried; any other status is permanent."""
    status = result.status
    if status is None:
        return "retryable"
    if 200 <= status <= 299:
        return "success"
    if status in (408, 429) or 500 <= status <= 599:
        return "retryable"
    return "permanent"


@dataclass(frozen=True)
class Decision:
    """What to record after one attempt."""

    outcome: Outcome
    next_attempt_at: datetime | None  # set only for RETRY
    error: str | None  # last_error text; None on success


def _describe(result: AttemptResult) -> str:
    if result.status is None:
        return result.error or "no response from app"
    text = f"HTTP {result.status} from app"
    return f"{text}: {result.error}" if result.error else text


def decide(
    result: AttemptResult,
    *,
    attempt: int,
    max_attempts: int,
    backoff_seconds: float,
    due_at: datetime,
    starting_deadline: float | None,
    now: datetime,
    rng: random.Random,
) -> Decision:
    """Turn one attempt's result into the outcome to record.

    success -> PUBLISHED.  permanent -> FAILED.  retryable -> FAILED once ``attempt`` reaches
    ``max_attempts``; MISSED when the retry would start after ``due_at + starting_deadline``
    (a slot is never started late); otherwise RETRY at ``now + retry_delay(...)``.
    """
    if attempt < 1 or max_attempts < 1:
        raise ValueError(
            f"attempt and max_attempts must be >= 1, got attempt={attempt}, "
            f"max_attempts={max_attempts}"
        )
    _check_deadline(starting_deadline)
    now = _utc(now, "now")
    due_at = _utc(due_at, "due_at")
    kind = classify(result)
    if kind == "success":
        return Decision(Outcome.PUBLISHED, None, None)
    last_error = _describe(result)
    if kind == "permanent":
        return Decision(Outcome.FAILED, None, f"{last_error} (not retried)")
    if attempt >= max_attempts:
        attempts = f"{attempt} attempt{'s' if attempt != 1 else ''}"
        return Decision(Outcome.FAILED, None, f"gave up after {attempts}: {last_error}")
    retry_at = now + timedelta(seconds=retry_delay(attempt, backoff_seconds, rng))
    if starting_deadline is not None and retry_at > due_at + timedelta(seconds=starting_deadline):
        return Decision(
            Outcome.MISSED,
            None,
            "retry would start after the starting deadline "
            f"({starting_deadline:g}s after {due_at:%Y-%m-%dT%H:%M:%SZ}); "
            f"last error: {last_error}",
        )
    return Decision(Outcome.RETRY, retry_at, last_error)


def is_past_deadline(due_at: datetime, starting_deadline: float | None, now: datetime) -> bool:
    """Whether ``now`` is after ``due_at + starting_deadline``; never when the deadline is None."""
    _check_deadline(starting_deadline)
    if starting_deadline is None:
        return False
    return _utc(now, "now") > _utc(due_at, "due_at") + timedelta(seconds=starting_deadline)


def idempotency_key(uid: str, due_at: datetime) -> str:
    """A key stable per row and scheduled time: ``<uid>/<due_at in UTC, microseconds>Z``."""
    if not uid:
        raise ValueError("uid must be a non-empty string")
    return f"{uid}/{_utc(due_at, 'due_at'):%Y-%m-%dT%H:%M:%S.%fZ}"
